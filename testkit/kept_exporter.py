"""An OTLP exporter that keeps what it is given, in place of the network's, for the tests that
push in process and read what the push would have sent."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData


class KeptExporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass
