"""otel-vgpu: per-pod usage of shared NVIDIA GPUs as OpenTelemetry metrics."""

__version__ = "0.2.0"
