"""The GPU backend: its interface, NVML, per-process sampling windows, and the PID-namespace check."""
