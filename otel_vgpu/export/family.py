"""A family of the metric contract, typed: its name, unit, instrument, subject, how its value
is read from a row, the Prometheus name a scrape shows (`prometheus_name`, the
OpenTelemetry-to-Prometheus rules of opentelemetry-exporter-prometheus), what it needs turned
on, what a sweep must read for it and its form under the semantic conventions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Generic

from otel_vgpu.collect.reading import Read
from otel_vgpu.conventions import Form
from otel_vgpu.export.subjects import Row, Subject


class Instrument(str, Enum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


class Feature(str, Enum):
    """What a family needs turned on, beside the agent itself."""

    SEED_METRICS = "seed_metrics"
    """--seed-metrics: the original exporter's families."""
    OTLP = "otlp"
    """The OTLP push."""
    SEMCONV = "semconv"
    """The OTLP push under the semantic conventions (--otlp-names semconv), which alone carries
    the family: a scrape leaves it out (export/telemetry.py), as does the push of the agent's names."""


@dataclass(frozen=True, slots=True)
class Family(Generic[Row]):
    name: str
    """The OpenTelemetry instrument name (dotted), as pushed over OTLP."""
    unit: str
    subject: Subject[Row]
    description: str
    value: Callable[[Row], float | None]
    """Its value in one row of its subject; None: no series for that row."""
    prometheus_name: str
    """Its name in a scrape of /metrics, as the exposition makes it from its name, unit and
    instrument (the OpenTelemetry-to-Prometheus rules; tests/unit/export/test_families.py holds each to
    them), written out so that a search for what a dashboard shows finds its declaration."""
    instrument: Instrument = Instrument.GAUGE
    needs: Feature | None = None
    reads: frozenset[Read] = frozenset()
    """What a sweep reads only for families like this one (the energy counter, the samples):
    with every such family turned off, it is not read."""
    buckets: tuple[float, ...] = ()
    """A histogram's bucket boundaries."""
    semconv: Form | None = None
    """Its form on the push with --otlp-names semconv (otel_vgpu/conventions.py, export/semconv.py);
    None: it keeps its name there."""

    @property
    def labels(self) -> tuple[str, ...]:
        return self.subject.labels

    @property
    def names(self) -> tuple[str, ...]:
        """Every name it goes by: on the scrape, on the push, and on the push under the
        semantic conventions (a name several families share, such as `hw.gpu.utilization`)."""
        return (self.prometheus_name, self.name, *((self.semconv.name,) if self.semconv is not None else ()))


# UCUM units and the suffix they give a Prometheus name, on a scrape and
# through Prometheus' OTLP ingestion alike (unit "1": "ratio", the
# specification's rule, which sdk_internals.py applies to the exporter); a
# unit in braces is an annotation and adds nothing.
_UNIT_SUFFIXES = {
    "By": "bytes",
    "s": "seconds",
    "J": "joules",
    "1": "ratio",
    "Hz": "hertz",
    "Cel": "celsius",
    "W": "watts",
    "By/s": "bytes_per_second",
}


def scraped_name(name: str, unit: str, instrument: Instrument = Instrument.GAUGE) -> str:
    """The name in a scrape of a family of OpenTelemetry name `name`, `unit` and `instrument`: for
    the families made several from one figure entry (export/figure_families.py), where the
    entry cannot spell each out."""
    scraped = name.replace(".", "_")
    suffix = "" if unit.startswith("{") else _UNIT_SUFFIXES.get(unit, unit)
    if suffix and not scraped.endswith(f"_{suffix}"):
        scraped = f"{scraped}_{suffix}"
    return f"{scraped}_total" if instrument is Instrument.COUNTER else scraped


# Per-process figures are fitted under the GPU's own samples; the energy split needs both.
USE = frozenset({Read.PROCESS_USE, Read.GPU_SAMPLES})
SPLIT = frozenset({Read.PROCESS_USE, Read.GPU_SAMPLES, Read.ENERGY})
