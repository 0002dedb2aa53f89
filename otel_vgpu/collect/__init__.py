"""Sweeps: one read of every source, aggregated per GPU and per (pod, GPU)."""
