"""A family of the metric contract, typed: its name, unit, instrument, subject, how its value
is read from a row, what it needs turned on, what a sweep must read for it and its form under
the semantic conventions; and the Prometheus name a scrape shows (`prometheus_name`, the
OpenTelemetry-to-Prometheus rules of opentelemetry-exporter-prometheus)."""

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


@dataclass(frozen=True, slots=True)
class Family(Generic[Row]):
    name: str
    """The OpenTelemetry instrument name (dotted), as pushed over OTLP."""
    unit: str
    subject: Subject[Row]
    description: str
    value: Callable[[Row], float | None]
    """Its value in one row of its subject; None: no series for that row."""
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
    def prometheus_name(self) -> str:
        """The family's name in a scrape of /metrics."""
        name = self.name.replace(".", "_")
        suffix = "" if self.unit.startswith("{") else _UNIT_SUFFIXES.get(self.unit, self.unit)
        if suffix and not name.endswith(f"_{suffix}"):
            name = f"{name}_{suffix}"
        return f"{name}_total" if self.instrument is Instrument.COUNTER else name

    @property
    def names(self) -> tuple[str, ...]:
        """Every name it goes by: on the scrape, on the push, and on the push under the
        semantic conventions (a name several families share, such as `hw.gpu.utilization`)."""
        return (self.prometheus_name, self.name, *((self.semconv.name,) if self.semconv is not None else ()))


# Per-process figures are fitted under the GPU's own samples; the energy split needs both.
USE = frozenset({Read.PROCESS_USE, Read.GPU_SAMPLES})
SPLIT = frozenset({Read.PROCESS_USE, Read.GPU_SAMPLES, Read.ENERGY})
