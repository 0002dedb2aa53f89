"""The HTTP endpoint: what /metrics, /healthz and /readyz answer (paths.py), served to every
client within bounds (server.py and the modules beside it), with TLS, basic auth and their
files reread. It knows the metrics only as the telemetry's render and the exposition's
formats; no family is imported here (tests/unit/test_layout.py)."""
