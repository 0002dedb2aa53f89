"""The families made from the figure tables of gpu/: the engines beside SM (gpu/backend.py
`ENGINE_TABLE`), GPM's figures and the health figures (gpu/device_figures.py `GPM_TABLE`,
`HEALTH_TABLE`). An entry there makes its families here, per pod and per GPU, with their
help texts, each entry's kept by its name (`ENGINE_FAMILIES`, `GPM_FAMILIES_OF`,
`HEALTH_FAMILIES`), so that code and tests find a figure's families by its declaration;
export/pod_families.py and export/gpu_families.py place them in their tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otel_vgpu.collect.aggregate import GpuRow, PodRow
from otel_vgpu.collect.device_health import HealthRow
from otel_vgpu.collect.reading import Read
from otel_vgpu.conventions import gpu_io, gpu_utilization, pod_gpu_time, pod_gpu_utilization
from otel_vgpu.export.family import Family, Feature, Instrument, scraped_name
from otel_vgpu.export.subjects import ENDED, GPU, GPU_HEALTH, POD, POD_COUNTED
from otel_vgpu.gpu.backend import ENGINE_TABLE
from otel_vgpu.gpu.device_figures import GPM_TABLE, HEALTH_TABLE, GpmFigure, HealthFigure

# The engines beside SM (gpu/backend.py ENGINE_TABLE): what each one's figure is, for the help
# texts, and its hw.gpu.task on the semantic-conventions push.
_ENGINE_MEANING = {engine.name: engine.meaning for engine in ENGINE_TABLE}
_ENGINE_TASK = {engine.name: engine.task for engine in ENGINE_TABLE}
_ENGINE_WINDOW = "over its GPU's last engine window (about 10 s, closed at a sweep), 0-1 of the physical GPU's engine"
_ENGINE_ABSENT = (
    "Absent on a GPU without that engine, on one where no process has used it since the agent started, where "
    "per-pod figures are unknown (MIG, MPS: NVML gives them to no pod or to the MPS server), and until the first "
    "window closes."
)
_ENGINE_READS = frozenset({Read.PROCESS_USE, Read.ENGINE_SAMPLES})


POD_ENGINES = tuple(engine.name for engine in ENGINE_TABLE if engine.per_pod)
"""The engines published per pod. Not memory copy: NVML's per-process `memUtil` is the GPU's
memory figure split among the processes by their share of SM time, not what each moved. On
an H200, a memory-bound and a compute-bound process time-sliced together each read 0.64 to
0.67 of its SM figure (the GPU's memory was at 0.65), where alone they read 1.00 and 0.29
(bench/results/h200-engines.md): a pod's figure says no more than its SM share does, and
would read a compute-bound pod as memory-bound as its neighbour. The GPU's own memory-copy
figure is measured, and published."""


def _pod_engine(engine: str) -> Callable[[PodRow], float | None]:
    return lambda r: r.engine_utilization.get(engine)


def _pod_engine_busy(engine: str) -> Callable[[PodRow], float | None]:
    return lambda r: r.engine_busy_seconds.get(engine)


def _gpu_engine(engine: str) -> Callable[[GpuRow], float | None]:
    return lambda g: g.engine_utilization.get(engine)


def _gpu_engine_busy(engine: str) -> Callable[[GpuRow], float | None]:
    return lambda g: g.engine_busy_seconds.get(engine)


def engine_families(engine: str) -> tuple[Family[PodRow], Family[PodRow], Family[GpuRow], Family[GpuRow]]:
    """The four families of one engine: per pod and per GPU, a gauge and a busy-seconds counter;
    with a task, the gauges and the pod's counter have their semantic-conventions forms."""
    meaning = _ENGINE_MEANING[engine]
    task = _ENGINE_TASK[engine]
    return (
        Family(
            f"vgpu.pod.{engine}.utilization",
            "1",
            POD,
            f"The pod's share of {meaning}, {_ENGINE_WINDOW}; the pods' sum is at most the GPU's. {_ENGINE_ABSENT}",
            value=_pod_engine(engine),
            prometheus_name=f"vgpu_pod_{engine}_utilization_ratio",
            reads=_ENGINE_READS,
            semconv=pod_gpu_utilization(task) if task else None,
        ),
        Family(
            f"vgpu.pod.{engine}.busy",
            "s",
            POD_COUNTED,
            f"Busy seconds of the pod on {meaning}: its figure integrated over each engine window, so rate() over "
            f"any range is its mean use there. {_ENGINE_ABSENT} {ENDED}",
            value=_pod_engine_busy(engine),
            prometheus_name=f"vgpu_pod_{engine}_busy_seconds_total",
            reads=_ENGINE_READS,
            instrument=Instrument.COUNTER,
            semconv=pod_gpu_time(task) if task else None,
        ),
        Family(
            f"vgpu.gpu.{engine}.utilization",
            "1",
            GPU,
            f"The GPU's own figure of {meaning}, the mean of NVML's samples {_ENGINE_WINDOW}. Absent on a GPU "
            "without that engine, in MIG mode, and until the first window closes.",
            value=_gpu_engine(engine),
            prometheus_name=f"vgpu_gpu_{engine}_utilization_ratio",
            reads=_ENGINE_READS,
            semconv=gpu_utilization(task) if task else None,
        ),
        Family(
            f"vgpu.gpu.{engine}.busy",
            "s",
            GPU,
            f"Busy seconds of the GPU on {meaning}: its figure integrated over each engine window.",
            value=_gpu_engine_busy(engine),
            prometheus_name=f"vgpu_gpu_{engine}_busy_seconds_total",
            reads=_ENGINE_READS,
            instrument=Instrument.COUNTER,
        ),
    )


HEALTH_READS = frozenset({Read.HEALTH})
GPM_READS = frozenset({Read.GPM})
_GPM_WINDOW = "over its last GPM window (about 10 s, closed at a sweep)"
_GPM_ABSENT = "Absent on a GPU without GPM (before Hopper) and until the first window closes."


def health_family(figure: HealthFigure) -> Family[HealthRow]:
    """A health figure's family: read every 10 s off the scrape's path (collect/device_health.py), not every sweep."""
    name = figure.name
    return Family(
        f"vgpu.gpu.{name}",
        figure.unit,
        GPU_HEALTH,
        f"{figure.meaning} Absent where the GPU or driver does not report it (said once in the log), "
        "never 0 in its place.",
        value=lambda row: row.figures.get(name),
        prometheus_name=figure.prometheus_name,
        reads=HEALTH_READS,
        instrument=Instrument.COUNTER if figure.counter else Instrument.GAUGE,
        semconv=figure.semconv,
    )


def gpm_families(figure: GpmFigure) -> tuple[Family[Any], ...]:
    """A GPM figure's families: per GPU (first: what scripts/gen-dcgm-rules.py reads), a
    busy-seconds counter where it has one, a byte counter where it has one (on the
    semantic-conventions push only), and per pod where it has one."""
    name = figure.name
    links = " Only on a GPU with NVLink." if figure.nvlink else ""
    gpu: list[Family[Any]] = [
        Family(
            f"vgpu.gpu.{name}",
            figure.unit,
            GPU,
            f"Of the GPU, {_GPM_WINDOW}: {figure.meaning}. {_GPM_ABSENT}{links}",
            value=lambda g: g.gpm.get(name),
            prometheus_name=scraped_name(f"vgpu.gpu.{name}", figure.unit),
            reads=GPM_READS,
        )
    ]
    if figure.busy:
        gpu.append(
            Family(
                f"vgpu.gpu.{name.removesuffix('.active')}.busy",
                "s",
                GPU,
                f"Busy seconds of the GPU by its {name} figure ({figure.meaning}), integrated over each GPM "
                f"window, so rate() over any range is its mean there. {_GPM_ABSENT}",
                value=lambda g: g.gpm_busy_seconds.get(name),
                prometheus_name=scraped_name(f"vgpu.gpu.{name.removesuffix('.active')}.busy", "s", Instrument.COUNTER),
                reads=GPM_READS,
                instrument=Instrument.COUNTER,
            )
        )
    if figure.io:
        gpu.append(
            Family(
                f"vgpu.gpu.{name}.bytes",
                "By",
                GPU,
                f"Bytes of the GPU's {name} figure ({figure.meaning}): its rate times each GPM window, summed. "
                f"Pushed only with --otlp-names semconv, as hw.gpu.io; never scraped. {_GPM_ABSENT}",
                value=lambda g: g.gpm_bytes.get(name),
                prometheus_name=scraped_name(f"vgpu.gpu.{name}.bytes", "By", Instrument.COUNTER),
                reads=GPM_READS,
                instrument=Instrument.COUNTER,
                needs=Feature.SEMCONV,
                semconv=gpu_io(figure.io),
            )
        )
    if figure.per_pod:
        gpu.append(
            Family(
                f"vgpu.pod.{name}",
                figure.unit,
                POD,
                f"Of the pod, over its GPU's last GPM window (about 10 s, closed at a sweep): {figure.meaning}; "
                "its GPU's (or MIG GPU instance's) own figure, published only for a pod that had that GPU or MIG "
                "device alone over the whole window, where it is exact. Absent in a window several pods shared "
                "(vgpu_gpu_gpm_shared_windows_total counts them; deploy/ has a recording rule that estimates a "
                "split, named as an estimate), and without GPM.",
                value=lambda r: r.gpm.get(name),
                prometheus_name=scraped_name(f"vgpu.pod.{name}", figure.unit),
                reads=GPM_READS,
            )
        )
    return tuple(gpu)


ENGINE_FAMILIES = {
    engine.name: tuple(f for f in engine_families(engine.name) if engine.per_pod or f.subject is GPU)
    for engine in ENGINE_TABLE
}
"""Each engine's families, by its name: per pod (where `per_pod`) and per GPU."""
GPM_FAMILIES_OF = {figure.name: gpm_families(figure) for figure in GPM_TABLE}
"""Each GPM figure's families, by its name."""
GPM_FAMILIES = tuple(family for families in GPM_FAMILIES_OF.values() for family in families)
HEALTH_FAMILIES = {figure.name: health_family(figure) for figure in HEALTH_TABLE}
"""Each health figure's family, by its name."""
