"""A family's form under OpenTelemetry's semantic conventions, which the OTLP push takes with
`--otlp-names semconv` (export/semconv.py): its name, unit, instrument, the attributes that
tell it apart from the other families of that name, its description; and the forms several
tables declare, each written once here.

The hardware names are semantic-conventions v1.44.0's (model/hardware/gpu-metrics.yaml,
common-metrics.yaml, temperature-metrics.yaml; tests/data/semconv/ holds them): `hw.gpu.task`
is an enum (decoder, encoder, general) whose docs allow a custom value where none applies
("otherwise, a custom value MAY be used"), so the JPEG decoders and the optical-flow
accelerator are `jpeg` and `optical_flow`. No convention names a pod's or a process's use
of a GPU (semantic-conventions has none in v1.44.0): those are the agent's own,
`vgpu.pod.gpu.*`, in the shape of the kubeletstats receiver's `k8s.pod.<resource>.<quantity>`,
under the agent's namespace since the naming guide advises against a convention's namespace
for one's own names (docs/general/naming.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    """The instrument a form is pushed as (the conventions' `instrument`)."""

    GAUGE = "gauge"
    COUNTER = "counter"
    """A cumulative monotonic sum."""
    UPDOWNCOUNTER = "updowncounter"
    """A cumulative non-monotonic sum: a gauge of the agent's pushed as one."""


@dataclass(frozen=True, slots=True)
class Form:
    """A family's form on the semantic-conventions push."""

    name: str
    unit: str
    kind: Kind
    description: str
    """The pushed metric's, shared by every family of the name (several make one metric)."""
    attributes: tuple[tuple[str, str], ...] = ()
    """What tells this family's points from those of the others of its name: `hw.gpu.task`,
    `hw.sensor_location`, `error.type`, `network.io.direction`."""
    integer: bool = False
    """Its values are pushed as integers (the conventions' `metric_value_type: int`)."""

    @property
    def fixed(self) -> Mapping[str, str]:
        return dict(self.attributes)


# The hardware conventions' briefs, as the conventions write them.
_UTILIZATION = "Fraction of time spent in a specific task."
_TEMPERATURE = "Temperature in degrees Celsius."
_ERRORS = "Number of errors encountered by the GPU."
_POD_UTILIZATION = (
    "The pod's share of the physical GPU's time in a task (hw.gpu.task: general is the SMs, the others its engines), "
    "0-1, as vgpu.pod.sm.utilization and vgpu.pod.<engine>.utilization."
)
_POD_TIME = (
    "Busy seconds of the pod on the GPU in a task (hw.gpu.task), as vgpu.pod.sm.busy and vgpu.pod.<engine>.busy: "
    "rate() over any range is its mean use there."
)


def gpu_utilization(task: str) -> Form:
    """`hw.gpu.utilization` for one `hw.gpu.task`."""
    return Form("hw.gpu.utilization", "1", Kind.GAUGE, _UTILIZATION, (("hw.gpu.task", task),))


def pod_gpu_utilization(task: str) -> Form:
    """The pod's share of the GPU in one task: the agent's own name, after hw.gpu.utilization."""
    return Form("vgpu.pod.gpu.utilization", "1", Kind.GAUGE, _POD_UTILIZATION, (("hw.gpu.task", task),))


def pod_gpu_time(task: str) -> Form:
    """The pod's busy seconds in one task: the agent's own name, after kubeletstats' k8s.pod.cpu.time."""
    return Form("vgpu.pod.gpu.time", "s", Kind.COUNTER, _POD_TIME, (("hw.gpu.task", task),))


def temperature(location: str) -> Form:
    """`hw.temperature` of one `hw.sensor_location` of the GPU."""
    return Form("hw.temperature", "Cel", Kind.GAUGE, _TEMPERATURE, (("hw.sensor_location", location),))


def errors(kind: str) -> Form:
    """`hw.errors` of one `error.type`: the GPU refinement's corrected or uncorrected."""
    return Form("hw.errors", "{error}", Kind.COUNTER, _ERRORS, (("error.type", kind),), integer=True)


def gpu_io(direction: str) -> Form:
    """`hw.gpu.io` in one `network.io.direction`."""
    return Form(
        "hw.gpu.io",
        "By",
        Kind.COUNTER,
        "Received and transmitted bytes by the GPU.",
        (("network.io.direction", direction),),
        integer=True,
    )
