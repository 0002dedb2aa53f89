"""The metric reader behind /metrics, and the exemplar reservoir that keeps nothing.

`ScrapeReader` is a plain `MetricReader` (the SDK's public extension point):
each `collect_data()` runs one collection and hands its `MetricsData` back to
the caller, which renders it (exposition.py). Nothing is queued between
calls, so concurrent collections cannot swap each other's data.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.metrics import Exemplar, ExemplarReservoir
from opentelemetry.sdk.metrics.export import CardinalityLimits, MetricReader, MetricsData
from opentelemetry.util.types import Attributes


class ScrapeReader(MetricReader):
    def __init__(self, cardinality_limits: CardinalityLimits | None = None) -> None:
        # Every instrument cumulative (the SDK's default), as Prometheus reads counters.
        super().__init__(cardinality_limits=cardinality_limits)
        self._received = threading.local()

    def collect_data(self, timeout_millis: float = 10_000) -> MetricsData | None:
        """One collection's data (None before the reader is registered on a provider)."""
        self._received.data = None
        self.collect(timeout_millis=timeout_millis)
        data: MetricsData | None = self._received.data
        self._received.data = None
        return data

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> None:
        # Called by collect(), on the collecting thread.
        self._received.data = metrics_data

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


class NoExemplars(ExemplarReservoir):
    """Keeps no exemplar. With the exemplar filter always off nothing is offered, yet the SDK's
    default reservoir is still built for every series and read on every collection."""

    def __init__(self, **kwargs: Any) -> None:
        pass

    def offer(self, value: float, time_unix_nano: int, attributes: Attributes, context: Context) -> None:
        pass

    def collect(self, point_attributes: Attributes) -> list[Exemplar]:
        return []


def no_exemplars(aggregation_type: type) -> Any:
    """A View's exemplar_reservoir_factory: every aggregation gets a NoExemplars."""
    return NoExemplars
