"""The metric contract and its publication: the families, OpenTelemetry instruments, the
exposition that /metrics serves (endpoint/ serves it), the OTLP push."""
