"""Why an OTLP export failed, and how often to say it.

The SDK's exporters return only SUCCESS or FAILURE; the reason (the gRPC status, the HTTP
status, the transport's error: connection refused, an unknown host) is in the records they log
on their own loggers, one or more per attempt. `ExportReasons`, a filter on those loggers, keeps
the reason of the export in flight on each thread and drops every record (the pusher logs the
failure in its own words), so that no private part of the SDK is called or replaced.
When a reason is due to be logged (when new, then at most once a minute) `otel_vgpu.logs.LogLimit` says.

What this relies on, in opentelemetry-exporter-otlp-proto-grpc and -proto-http 1.45:
- gRPC, `opentelemetry/exporter/otlp/proto/grpc/exporter.py` (`OTLPExporterMixin._export`): each
  retry is logged as a warning "Transient error %s encountered while exporting %s to %s, retrying
  in %.2fs. Error details: %s" and the last as an error "Failed to export %s to %s, error code: %s,
  error details: %s", on the module's logger, the `grpc.StatusCode` among the arguments and the
  details last. That logger carries the SDK's DuplicateFilter, which drops a record like the one
  before it within 20 s: this filter is put ahead of it, so that every record is seen.
- HTTP, `opentelemetry/exporter/otlp/common/http.py` (`_OTLPHTTPClient.export`), logging on the
  logger the metric exporter hands it (`...proto.http.metric_exporter`'s): "Failed to export %s batch
  code: %s, reason: %s" with the status code and its phrase, or the transport's exception where no
  answer came; "Transient error %s encountered ..." before a retry, with the status's phrase (429,
  502, 503, 504) or the exception; and "Failed to export %s batch due to timeout, max retries or
  shutdown." with neither, after the retries.
A record in another shape (a later version's) still gives its reason: its message, as written.
Where the HTTP client gives up without a retry (an export timeout under the first backoff, about
1 s), its one record is the last of these, and that is the reason given.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeGuard

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

# The loggers of the exporters the push uses (export/otlp.py make_exporter).
EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    # The HTTP client's own, where an exporter hands it no logger.
    "opentelemetry.exporter.otlp.common.http",
)
# The package of the HTTP exporters, whose other modules' records stay silent as before.
QUIET_LOGGERS = ("opentelemetry.exporter.otlp.proto.http",)
# A reason is one line of a log, not a page of one.
MOST_REASON_CHARS = 300
# How deep an exception's causes are followed: requests wraps urllib3, which wraps the OSError.
MOST_CAUSES = 8
NO_REASON = "the exporter gave no reason"


@dataclass(frozen=True, slots=True)
class Reason:
    text: str
    specific: bool
    """Read from a status code or an error, not from a record's words alone."""


def _is_grpc_status(value: Any) -> TypeGuard[enum.Enum]:
    # grpc.StatusCode, told apart without importing grpc where only HTTP is used.
    return isinstance(value, enum.Enum) and type(value).__module__.split(".")[0] == "grpc"


def _is_http_status(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599


_CODES_BY_PHRASE = {status.phrase.lower(): status.value for status in HTTPStatus}


def _http_reason(code: int | None, phrase: str) -> str:
    """`HTTP 404 Not Found`: the status, with the server's phrase, else the standard one (where
    the server sent none, the SDK writes "unknown"); a retried status's code from its phrase."""
    code = code or _CODES_BY_PHRASE.get(phrase.lower())
    if phrase in ("", "unknown") and code is not None:
        phrase = next((status.phrase for status in HTTPStatus if status.value == code), "")
    return _shortened(" ".join(part for part in ("HTTP", str(code or ""), phrase) if part))


def _shortened(text: str) -> str:
    # An object's address (urllib3 before 2.3 writes its connection so) differs at every attempt.
    text = re.sub(r" (object )?at 0x[0-9a-fA-F]+", "", " ".join(text.split())).rstrip(".")
    return text if len(text) <= MOST_REASON_CHARS else text[: MOST_REASON_CHARS - 3] + "..."


def error_text(error: BaseException) -> str:
    """An exception as a reason: its type, and what its deepest cause says (requests' ConnectionError
    around urllib3's MaxRetryError around the OSError: `ConnectionError: [Errno 111] Connection refused`)."""
    chain = [error]
    while len(chain) < MOST_CAUSES:
        last = chain[-1]
        inner = getattr(last, "reason", None)  # urllib3's MaxRetryError keeps the last attempt's error here
        if not isinstance(inner, BaseException):
            first = last.args[0] if last.args else None
            inner = first if isinstance(first, BaseException) else last.__cause__
        if inner is None or inner in chain:
            break
        chain.append(inner)
    deepest = str(chain[-1]) or type(chain[-1]).__name__
    return _shortened(f"{type(error).__name__}: {deepest}")


def reason_of(record: logging.LogRecord) -> Reason:
    """The reason an exporter's record gives (the module docstring says which records): a gRPC
    status with its details, an exception, an HTTP status; else the record's words."""
    args = record.args if isinstance(record.args, tuple) else ()
    template = str(record.msg)
    status = next((arg for arg in args if _is_grpc_status(arg)), None)
    if status is not None:
        details = args[-1] if isinstance(args[-1], str) else ""
        return Reason(_shortened(f"gRPC {status.name}: {details}" if details else f"gRPC {status.name}"), True)
    error = next((arg for arg in args if isinstance(arg, BaseException)), None)
    if error is not None:
        return Reason(error_text(error), True)
    if "code: %s, reason: %s" in template and len(args) == 3 and _is_http_status(args[1]):
        return Reason(_http_reason(args[1], str(args[2])), True)
    if template.startswith("Transient error %s") and args and isinstance(args[0], str):
        return Reason(_http_reason(None, args[0]), True)
    return Reason(_shortened(record.getMessage()), False)


class ExportReasons(logging.Filter):
    """On the exporters' loggers: keeps, for the thread exporting, the reason of its export's
    failure (a status or an error over a record's words: the HTTP client's last record says only
    "due to timeout, max retries or shutdown" after retries that said why), and lets no record
    through."""

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        heard = reason_of(record)
        held: Reason | None = getattr(self._local, "reason", None)
        if held is None or heard.specific or not held.specific:
            self._local.reason = heard
        return False

    def take(self) -> str | None:
        """The reason heard on this thread since the last take, and forget it."""
        held: Reason | None = getattr(self._local, "reason", None)
        self._local.reason = None
        return held.text if held is not None else None


EXPORT_REASONS = ExportReasons()


def listen_to_exporters() -> None:
    """Put EXPORT_REASONS first on each exporter's logger, once: ahead of the SDK's own filters,
    which would drop a record like the one before it, and of any handler."""
    for name in EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        if EXPORT_REASONS not in logger.filters:
            logger.filters.insert(0, EXPORT_REASONS)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def export_or_reason(exporter: MetricExporter, data: MetricsData, timeout_millis: float) -> str | None:
    """Export `data`: None when it arrived, else why not."""
    EXPORT_REASONS.take()  # a record logged outside an export (a shutdown's) is no reason of this one
    try:
        result = exporter.export(data, timeout_millis=timeout_millis)
    except Exception as error:  # an exporter that raises has failed: the push goes on
        EXPORT_REASONS.take()
        return error_text(error)
    reason = EXPORT_REASONS.take()
    return None if result is MetricExportResult.SUCCESS else reason or NO_REASON
