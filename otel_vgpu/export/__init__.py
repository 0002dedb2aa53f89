"""The metric contract and its publication: OpenTelemetry instruments, /metrics, OTLP push."""
