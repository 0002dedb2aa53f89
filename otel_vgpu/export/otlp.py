"""OTLP push to an OpenTelemetry Collector, beside the Prometheus endpoint.

Off unless `--otlp-endpoint` or one of the standard OTEL_EXPORTER_OTLP_*
endpoint variables is set. The exporter modules are imported only then.

The push has its own thread and its own reader. Each tick is a collection
scope like a scrape's, so push and scrapes share sweeps (`--min-interval`):
turning OTLP on adds no NVML work while scrapes keep the snapshot fresh. An
unreachable collector costs that thread its export timeout and nothing else:
scrapes never wait for it. Failed exports are counted, and logged with
their reason (the gRPC or HTTP status, the transport's error) when it is new,
then at most once a minute while it lasts (export/otlp_failures.py).
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, MetricsData

from otel_vgpu.agent_health import AgentHealth, Stage
from otel_vgpu.export.otlp_failures import export_or_reason, listen_to_exporters
from otel_vgpu.export.semconv import translate
from otel_vgpu.files import MAX_PEM_BYTES, FileProblem, read_regular
from otel_vgpu.flag_values import MIN_INTERVAL_S, OTLP_SEMCONV
from otel_vgpu.logs import LogLimit
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)

PROTOCOLS = ("grpc", "http/protobuf")
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# The signal's own variable first, as the SDK reads them.
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
# The files the SDK's exporters read from the standard variables, and the PEM block each holds.
PEM_VARIABLES = {
    "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE": "the Collector's CA certificate",
    "OTEL_EXPORTER_OTLP_CERTIFICATE": "the Collector's CA certificate",
    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE": "the agent's client certificate",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "the agent's client certificate",
    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY": "the client certificate's private key",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY": "the client certificate's private key",
}
DEFAULT_INTERVAL_S = 60.0
DEFAULT_TIMEOUT_S = 10.0
# On SIGTERM the last export gets this long, so the pod stops in a few seconds.
FLUSH_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class OtlpSettings:
    endpoint: str | None
    """Base URL from --otlp-endpoint; None: the exporter reads the standard variables."""
    protocol: str
    interval_s: float
    timeout_s: float
    names: str = "vgpu"
    """--otlp-names: vgpu, the agent's own names; semconv, the semantic conventions' (export/semconv.py)."""


def settings_from(
    endpoint: str | None, protocol: str | None, interval_s: float | None, names: str = "vgpu"
) -> OtlpSettings | None:
    """The push settings, or None when OTLP is off."""
    if endpoint is None and not any(os.environ.get(name) for name in ENDPOINT_VARIABLES):
        return None
    # --otlp-protocol is one of PROTOCOLS (argparse's choices); a variable may hold anything.
    variable = next((name for name in PROTOCOL_VARIABLES if os.environ.get(name)), None)
    chosen = protocol or (os.environ[variable] if variable else "grpc")
    if chosen not in PROTOCOLS:
        raise ValueError(f"{variable}={chosen!r}: expected one of {', '.join(PROTOCOLS)}")
    if interval_s is None:
        # No shorter than any other loop of the agent's (flag_values.py MIN_INTERVAL_S).
        interval_s = _env_millis("OTEL_METRIC_EXPORT_INTERVAL", DEFAULT_INTERVAL_S, low=MIN_INTERVAL_S * 1000)
    timeout_s = min(_env_millis("OTEL_METRIC_EXPORT_TIMEOUT", DEFAULT_TIMEOUT_S), interval_s)
    for name in ("--otlp-endpoint", *ENDPOINT_VARIABLES):
        url = endpoint if name == "--otlp-endpoint" else os.environ.get(name)
        if url:
            _check_url(name, url)
    for name in COMPRESSION_VARIABLES:
        value = os.environ.get(name, "").strip().lower()
        if value and value not in COMPRESSIONS:
            raise ValueError(f"{name}={value!r}: expected one of {', '.join(COMPRESSIONS)}")
    _check_pem_files()
    return OtlpSettings(endpoint=endpoint, protocol=chosen, interval_s=interval_s, timeout_s=timeout_s, names=names)


# The SDK's own names for what it reads (opentelemetry-exporter-otlp: gzip,
# deflate for HTTP, or none).
COMPRESSION_VARIABLES = ("OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION")
COMPRESSIONS = ("gzip", "deflate", "none")
# An interval or timeout is a number of milliseconds from 1 ms to a day.
MAX_MILLIS = 86_400_000


def _check_url(name: str, url: str) -> None:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as error:
        raise ValueError(f"{name}={url!r}: not a URL ({error}); expected e.g. http://collector:4317") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{name}={url!r}: expected an http:// or https:// URL with a host, e.g. http://collector:4317")


def _check_pem_files() -> None:
    """Each file an OTLP variable names, read now as every file the agent is given is
    (otel_vgpu/files.py). The SDK's exporters read them later, each its own way: the gRPC one
    logs a traceback for a missing file and pushes without it; the HTTP one fails each push;
    either opens a FIFO and waits. ValueError naming the variable, the file and what it holds."""
    for name, what in PEM_VARIABLES.items():
        value = os.environ.get(name, "").strip()
        if not value:
            continue
        block = "PRIVATE KEY" if name.endswith("_KEY") else "CERTIFICATE"
        expected = f"give {what} in PEM (BEGIN {block})"
        try:
            text = read_regular(Path(value), MAX_PEM_BYTES).decode("latin-1")
        except FileProblem as problem:
            raise ValueError(f"{name}={value}: {problem.what}; {expected}") from None
        # PRIVATE KEY, RSA PRIVATE KEY, EC PRIVATE KEY; CERTIFICATE, TRUSTED CERTIFICATE.
        if not re.search(rf"-----BEGIN ([A-Z]+ )?{block}-----", text):
            raise ValueError(f"{name}={value}: holds no {block} block; {expected}")


def _env_millis(name: str, default_s: float, low: float = 1) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default_s
    try:
        millis = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected milliseconds, e.g. 60000") from None
    if not math.isfinite(millis) or not low <= millis <= MAX_MILLIS:
        raise ValueError(f"{name}={raw!r}: expected milliseconds from {low:g} to {MAX_MILLIS} (a day)")
    return millis / 1000.0


def make_exporter(settings: OtlpSettings) -> MetricExporter:
    """The SDK's OTLP metric exporter for the protocol. It reads the standard
    variables (headers, certificates, compression) itself."""
    exporter: MetricExporter
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter as GrpcExporter,
        )

        exporter = GrpcExporter(endpoint=settings.endpoint, timeout=settings.timeout_s)
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter as HttpExporter,
        )

        endpoint = None
        if settings.endpoint is not None:
            # --otlp-endpoint is a base URL, like OTEL_EXPORTER_OTLP_ENDPOINT.
            endpoint = settings.endpoint.rstrip("/") + "/v1/metrics"
        exporter = HttpExporter(endpoint=endpoint, timeout=settings.timeout_s)
    # The exporters log every failed attempt; the pusher logs each reason once a minute at most.
    listen_to_exporters()
    return exporter


class OtlpPusher(MetricReader):
    """A reader that collects and exports on its own thread, every interval.

    `scope` wraps each collection (the sweep sharing); `after_collect` runs
    after it (pruning stale attribute sets); `health` counts failed exports,
    each logged with its reason when `LogLimit` says it is due. With
    --otlp-names semconv, each collection is exported under the semantic
    conventions (export/semconv.py); otherwise as collected.
    """

    def __init__(
        self,
        exporter: MetricExporter,
        settings: OtlpSettings,
        scope: Callable[[], Any],
        after_collect: Callable[[MetricReader], None],
        health: AgentHealth,
        cardinality_limits: Any = None,
    ) -> None:
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
            cardinality_limits=cardinality_limits,
        )
        self._exporter = exporter
        self._settings = settings
        self._scope = scope
        self._after_collect = after_collect
        self._health = health
        self._stop = threading.Event()
        self._export_timeout_s = settings.timeout_s
        self._thread = NamedThread(target=self._run, name="otlp-push", daemon=True)
        self._reasons_logged = LogLimit()
        # The start of the updowncounters the semantic conventions make of the agent's gauges.
        self._started_ns = time.time_ns()

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._settings.interval_s):
            self.push()

    def push(self) -> None:
        with self._scope():
            try:
                self.collect(timeout_millis=self._settings.timeout_s * 1000)
            except Exception:  # a failed collection must not end the push thread
                log.exception("OTLP collection failed")
            self._after_collect(self)

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> None:
        if metrics_data is None:
            return
        if self._settings.names == OTLP_SEMCONV:
            metrics_data = translate(metrics_data, self._started_ns)
        reason = export_or_reason(self._exporter, metrics_data, self._export_timeout_s * 1000)
        if reason is None:
            self._health.recovered(Stage.EXPORT, "OTLP export works again")
            return
        endpoint = self._settings.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint"
        message = f"OTLP export to {endpoint} failed: {reason}"
        self._health.failed(Stage.EXPORT, "export", message, log=False)
        if self._reasons_logged.due(reason):
            log.warning(
                "%s; retrying every %g s (each reason logged at most once a minute)",
                message,
                self._settings.interval_s,
                extra={"endpoint": endpoint, "reason": reason},
            )

    def stop(self) -> None:
        """Stop the thread and export once more: the last figures before exit.

        Bounded by twice FLUSH_TIMEOUT_S whatever the collector does: the
        push in flight gets one, the last export what is left of two; a push
        stuck on an unreachable collector is left to its daemon thread.
        """
        self._stop.set()
        self._export_timeout_s = min(self._settings.timeout_s, FLUSH_TIMEOUT_S)
        deadline = time.monotonic() + FLUSH_TIMEOUT_S
        self._thread.join(timeout=FLUSH_TIMEOUT_S)
        final = NamedThread(target=self.push, name="otlp-flush", daemon=True)
        final.start()
        final.join(timeout=max(0.1, deadline - time.monotonic() + FLUSH_TIMEOUT_S))

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._exporter.shutdown(timeout_millis=min(timeout_millis, FLUSH_TIMEOUT_S * 1000))
