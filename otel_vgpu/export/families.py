"""The metric contract, in one table: every family the agent publishes, and how it is read.

Each entry has its OpenTelemetry instrument name and UCUM unit, the kind of
instrument, its `Subject` (which rows of a collection it has a series for, and
the labels of each), how its value is read from one of those rows, and the
Prometheus name a scrape shows (`prometheus_name`, the OpenTelemetry-to-
Prometheus rules of opentelemetry-exporter-prometheus). The telemetry builds
every instrument from this table in one loop, as kube-state-metrics builds
its families from `FamilyGenerator`s; the metric tables of docs/metrics.md
are generated from it (`scripts/gen-metric-tables.py`, checked current by
tests/test_docs.py), and tests/test_families.py tests each subject's families
as rows in, observations out.

Adding a family, by where its value comes from (docs/layout.md, "Adding a
figure"):
- a value a row already has: one entry here;
- a new engine per process: one `Engine` in gpu/backend.py's ENGINE_TABLE
  and its `ProcessUse` field; NVML's reads, the per-pod and per-GPU families
  here and the simulated node's scenario field all follow from the two;
- any other NVML figure: its field on `Device` (gpu/backend.py), its read in
  gpu/nvml.py and its value on the simulated node (sim/node.py), then one
  entry here; a counter carried across sweeps adds its rule in
  collect/usage.py.
Then `./scripts/gen-metric-tables.py` rewrites the tables of docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

from otel_vgpu.collect.aggregate import GpuRow, PodRow, Snapshot
from otel_vgpu.collect.device_health import HealthRow
from otel_vgpu.collect.lost_gpus import GpuIdentity, identity_of
from otel_vgpu.collect.reading import Read
from otel_vgpu.collect.xids import XidCount
from otel_vgpu.gpu.backend import ENGINE_TABLE, ENGINES
from otel_vgpu.gpu.device_figures import GPM_TABLE, HEALTH_TABLE, MAX_XID_CODES, GpmFigure, HealthFigure
from otel_vgpu.health import COLLECTION_STAGES, Health, Refusal, Stage
from otel_vgpu.patterns import compile_pattern

MIB = 1024 * 1024


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


@dataclass(frozen=True, slots=True)
class Observed:
    """What one collection reads: the sweep's snapshot, the agent's health, and the GPUs'
    health figures and XID counts as read for this collection."""

    snapshot: Snapshot
    health: Health
    devices: tuple[HealthRow, ...] = ()
    xids: tuple[XidCount, ...] = ()


@dataclass(frozen=True, slots=True)
class SeedRow:
    """The original exporter's values for one (pod, gpu_id) (`seed_rows`)."""

    pod: str
    gpu_id: str
    memory_used_mib: float
    sm_percent: float | None
    """Percent x ratio; None where NVML cannot tell (MIG, MPS)."""
    memory_allocated_mib: float


Row = TypeVar("Row")


@dataclass(frozen=True, slots=True)
class Subject(Generic[Row]):
    """What a family's series are about (a pod on a GPU, a GPU, the agent): the rows a collection
    has of it, and the labels of each row."""

    name: str
    labels: tuple[str, ...]
    rows: Callable[[Observed], Sequence[Row]]
    attributes: Callable[[Row], Mapping[str, str]]
    per_snapshot: bool = True
    """Its rows and their attributes follow from the snapshot alone: they are built once
    per snapshot and shared by its families (five pod families read the same rows)."""


POD_LABELS = ("namespace", "pod", "pod_uid", "gpu_id", "gpu_uuid")
"""Plus `container` with --by-container, and `mig_uuid`, `mig_profile` on a MIG device."""
GPU_LABELS = ("gpu_id", "gpu_uuid", "gpu_model")
SEED_LABELS = ("pod", "gpu_id")


def pod_attributes(row: PodRow) -> dict[str, str]:
    attributes = {
        "namespace": row.namespace,
        "pod": row.pod,
        "pod_uid": row.pod_uid,
        "gpu_id": str(row.gpu_index),
        "gpu_uuid": row.gpu_uuid,
    }
    if row.container is not None:
        attributes["container"] = row.container
    if row.mig_uuid is not None:
        attributes["mig_uuid"] = row.mig_uuid
        attributes["mig_profile"] = row.mig_profile or ""
    return attributes


def gpu_attributes(row: GpuRow) -> dict[str, str]:
    return identity_attributes(identity_of(row.device))


def identity_attributes(gpu: GpuIdentity) -> dict[str, str]:
    return {"gpu_id": str(gpu.index), "gpu_uuid": gpu.uuid, "gpu_model": gpu.model}


def seed_rows(snapshot: Snapshot) -> tuple[SeedRow, ...]:
    """The original exporter's three values per (pod, gpu_id). Its labels had no
    namespace, so pods of one name in two namespaces add up, and no MIG device,
    so a pod's MIG devices of one GPU add up."""
    ratio = {gpu.index: gpu.vgpus for gpu in snapshot.gpus}
    rows: dict[tuple[str, str], SeedRow] = {}
    for row in snapshot.pods:
        key = (row.pod, str(row.gpu_index))
        sm = None if row.sm_utilization is None else row.sm_utilization * 100.0 * ratio.get(row.gpu_index, 1.0)
        so_far = rows.get(key, SeedRow(*key, 0.0, 0.0, 0.0))
        rows[key] = SeedRow(
            *key,
            memory_used_mib=so_far.memory_used_mib + row.memory_used / MIB,
            sm_percent=None if so_far.sm_percent is None or sm is None else so_far.sm_percent + sm,
            memory_allocated_mib=so_far.memory_allocated_mib + row.memory_allocated / MIB,
        )
    return tuple(rows.values())


POD: Subject[PodRow] = Subject("pod", POD_LABELS, lambda seen: seen.snapshot.pods, pod_attributes)
"""Per (pod, GPU or MIG device): one series per pod row of the snapshot."""
POD_COUNTED: Subject[PodRow] = Subject(
    "pod_counted", POD_LABELS, lambda seen: (*seen.snapshot.pods, *seen.snapshot.ended), pod_attributes
)
"""The per-pod counters' series: the pods' rows and, until every reader has collected them,
those of the pods that have ended, at their final values (collect/usage.py)."""
GPU: Subject[GpuRow] = Subject("gpu", GPU_LABELS, lambda seen: seen.snapshot.gpus, gpu_attributes)
"""Per GPU."""
SEED: Subject[SeedRow] = Subject(
    "seed", SEED_LABELS, lambda seen: seed_rows(seen.snapshot), lambda row: {"pod": row.pod, "gpu_id": row.gpu_id}
)
"""The original exporter's families, with --seed-metrics."""
GPU_HEALTH: Subject[HealthRow] = Subject(
    "gpu_health", GPU_LABELS, lambda seen: seen.devices, lambda row: gpu_attributes(row.gpu), per_snapshot=False
)
"""Per GPU, its health figures as read for the collection (collect/device_health.py)."""


def known_gpus(snapshot: Snapshot) -> list[tuple[GpuIdentity, bool]]:
    """Each GPU the agent knows, and whether it is lost: those the sweep read, then those it
    could not, under their last identity (collect/lost_gpus.py); none while the driver is paused."""
    return [(identity_of(gpu.device), False) for gpu in snapshot.gpus] + [(gpu, True) for gpu in snapshot.lost]


def xid_rows(seen: Observed) -> list[tuple[GpuIdentity, XidCount]]:
    """Each GPU's XID counts, under the GPU's identity: that of the sweep's row, or for a GPU the
    sweep could not read, the last one it had, so that a GPU fallen off the bus keeps the series
    of the XID that said so. While the driver is paused, none."""
    gpus = {gpu.uuid: gpu for gpu, _ in known_gpus(seen.snapshot)}
    return [(gpus[xid.gpu_uuid], xid) for xid in seen.xids if xid.gpu_uuid in gpus]


XID: Subject[tuple[GpuIdentity, XidCount]] = Subject(
    "xid",
    (*GPU_LABELS, "xid"),
    xid_rows,
    lambda row: {**identity_attributes(row[0]), "xid": row[1].xid},
    per_snapshot=False,
)
"""Per GPU and XID code."""


def xid_last_rows(seen: Observed) -> list[tuple[GpuIdentity, int]]:
    """Each GPU the agent knows, lost or not, and the code of its latest XID since the agent
    started (0: none yet): a lost GPU keeps its own, the XID that said so."""
    last = {xid.gpu_uuid: xid.last for xid in seen.xids}
    return [(gpu, last.get(gpu.uuid, 0)) for gpu, _ in known_gpus(seen.snapshot)]


XID_LAST: Subject[tuple[GpuIdentity, int]] = Subject(
    "xid_last", GPU_LABELS, xid_last_rows, lambda row: identity_attributes(row[0]), per_snapshot=False
)
"""Per GPU the agent knows, its latest XID."""
KNOWN: Subject[tuple[GpuIdentity, bool]] = Subject(
    "known", GPU_LABELS, lambda seen: known_gpus(seen.snapshot), lambda row: identity_attributes(row[0])
)
"""Per GPU the agent knows, lost or not."""
INFO_LABELS = ("driver_version", "pci_bus_id")


def info_attributes(gpu: GpuIdentity) -> dict[str, str]:
    """The GPU's labels and what NVML says of it beside them; "" (no label, to Prometheus) where
    NVML would not tell."""
    return {**identity_attributes(gpu), "driver_version": gpu.driver_version or "", "pci_bus_id": gpu.pci_bus_id or ""}


GPU_INFO: Subject[tuple[GpuIdentity, bool]] = Subject(
    "gpu_info", (*GPU_LABELS, *INFO_LABELS), lambda seen: known_gpus(seen.snapshot), lambda row: info_attributes(row[0])
)
"""Per GPU the agent knows, lost or not (under its last identity), what NVML says of it."""


def unattributed_rows(seen: Observed) -> list[tuple[GpuRow, str, float]]:
    """Each GPU's unattributed SM-busy seconds by reason (collect/ledger.py)."""
    return [
        (gpu, reason, seconds)
        for gpu in seen.snapshot.gpus
        for reason, seconds in sorted(gpu.sm_unattributed_seconds.items())
    ]


UNATTRIBUTED: Subject[tuple[GpuRow, str, float]] = Subject(
    "unattributed",
    (*GPU_LABELS, "reason"),
    unattributed_rows,
    lambda row: {**gpu_attributes(row[0]), "reason": row[1]},
)
"""Per GPU and reason its SM time went to no pod."""
AGENT: Subject[Observed] = Subject("agent", (), lambda seen: (seen,), lambda _: {}, per_snapshot=False)
"""The agent itself: one series, read from what the collection observed."""
STAGES: Subject[tuple[Stage, int]] = Subject(
    "stages",
    ("stage",),
    lambda seen: [(stage, seen.health.counts()[stage]) for stage in COLLECTION_STAGES],
    lambda row: {"stage": row[0].value},
    per_snapshot=False,
)
"""The agent's failures, one series per collection stage."""
REFUSALS: Subject[tuple[Refusal, int]] = Subject(
    "refusals",
    ("reason",),
    lambda seen: list(seen.health.refusals().items()),
    lambda row: {"reason": row[0].value},
    per_snapshot=False,
)
"""Inputs a tenant can write that the agent refused, one series per reason."""
SWEEPS: Subject[float] = Subject(
    "sweeps", (), lambda seen: seen.health.take_durations(), lambda _: {}, per_snapshot=False
)
"""The sweeps made since the last collection, one row each: taking them empties the list,
so a histogram of this subject records each sweep once, at the start of a collection."""

SUBJECTS: tuple[Subject[Any], ...] = (
    POD,
    POD_COUNTED,
    GPU,
    GPU_INFO,
    UNATTRIBUTED,
    KNOWN,
    GPU_HEALTH,
    XID,
    XID_LAST,
    SEED,
    AGENT,
    STAGES,
    REFUSALS,
    SWEEPS,
)

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


# Per-process figures are fitted under the GPU's own samples; the energy split needs both.
_USE = frozenset({Read.PROCESS_USE, Read.GPU_SAMPLES})
_SPLIT = frozenset({Read.PROCESS_USE, Read.GPU_SAMPLES, Read.ENERGY})


def _answering(up: bool | None) -> float | None:
    return None if up is None else float(up)


# The engines beside SM (gpu/backend.py ENGINE_TABLE): what each one's figure is, for the help texts.
_ENGINE_MEANING = {engine.name: engine.meaning for engine in ENGINE_TABLE}
_ENGINE_WINDOW = "over its GPU's last engine window (about 10 s, closed at a sweep), 0-1 of the physical GPU's engine"
_ENGINE_ABSENT = (
    "Absent on a GPU without that engine, on one where no process has used it since the agent started, where "
    "per-pod figures are unknown (MIG, MPS: NVML gives them to no pod or to the MPS server), and until the first "
    "window closes."
)
_ENGINE_READS = frozenset({Read.PROCESS_USE, Read.ENGINE_SAMPLES})
_ENDED = (
    "A pod that ends keeps its series at its final value until every reader has collected it; one "
    "seen anew after that starts from 0."
)
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


def _engine_families(engine: str) -> tuple[Family[PodRow], Family[PodRow], Family[GpuRow], Family[GpuRow]]:
    """The four families of one engine: per pod and per GPU, a gauge and a busy-seconds counter."""
    meaning = _ENGINE_MEANING[engine]
    return (
        Family(
            f"vgpu.pod.{engine}.utilization",
            "1",
            POD,
            f"The pod's share of {meaning}, {_ENGINE_WINDOW}; the pods' sum is at most the GPU's. {_ENGINE_ABSENT}",
            value=_pod_engine(engine),
            reads=_ENGINE_READS,
        ),
        Family(
            f"vgpu.pod.{engine}.busy",
            "s",
            POD_COUNTED,
            f"Busy seconds of the pod on {meaning}: its figure integrated over each engine window, so rate() over "
            f"any range is its mean use there. {_ENGINE_ABSENT} {_ENDED}",
            value=_pod_engine_busy(engine),
            reads=_ENGINE_READS,
            instrument=Instrument.COUNTER,
        ),
        Family(
            f"vgpu.gpu.{engine}.utilization",
            "1",
            GPU,
            f"The GPU's own figure of {meaning}, the mean of NVML's samples {_ENGINE_WINDOW}. Absent on a GPU "
            "without that engine, in MIG mode, and until the first window closes.",
            value=_gpu_engine(engine),
            reads=_ENGINE_READS,
        ),
        Family(
            f"vgpu.gpu.{engine}.busy",
            "s",
            GPU,
            f"Busy seconds of the GPU on {meaning}: its figure integrated over each engine window.",
            value=_gpu_engine_busy(engine),
            reads=_ENGINE_READS,
            instrument=Instrument.COUNTER,
        ),
    )


_HEALTH_READS = frozenset({Read.HEALTH})
_GPM_READS = frozenset({Read.GPM})
_GPM_WINDOW = "over its last GPM window (about 10 s, closed at a sweep)"
_GPM_ABSENT = "Absent on a GPU without GPM (before Hopper) and until the first window closes."


def _health_family(figure: HealthFigure) -> Family[HealthRow]:
    """A health figure's family: read every 10 s off the scrape's path (collect/device_health.py), not every sweep."""
    name = figure.name
    return Family(
        f"vgpu.gpu.{name}",
        figure.unit,
        GPU_HEALTH,
        f"{figure.meaning} Absent where the GPU or driver does not report it (said once in the log), "
        "never 0 in its place.",
        value=lambda row: row.figures.get(name),
        reads=_HEALTH_READS,
        instrument=Instrument.COUNTER if figure.counter else Instrument.GAUGE,
    )


def _gpm_families(figure: GpmFigure) -> tuple[Family[Any], ...]:
    """A GPM figure's families: per GPU, a busy-seconds counter where it has one, and per pod
    where it has one."""
    name = figure.name
    links = " Only on a GPU with NVLink." if figure.nvlink else ""
    gpu: list[Family[Any]] = [
        Family(
            f"vgpu.gpu.{name}",
            figure.unit,
            GPU,
            f"Of the GPU, {_GPM_WINDOW}: {figure.meaning}. {_GPM_ABSENT}{links}",
            value=lambda g: g.gpm.get(name),
            reads=_GPM_READS,
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
                reads=_GPM_READS,
                instrument=Instrument.COUNTER,
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
                reads=_GPM_READS,
            )
        )
    return tuple(gpu)


_GPM_FAMILIES = tuple(family for figure in GPM_TABLE for family in _gpm_families(figure))


# Left unannotated, so that each entry's `value` is type-checked against its subject's rows.
_TABLE = (
    Family(
        "vgpu.pod.memory.used",
        "By",
        POD,
        "GPU memory used by the pod's processes on this GPU (sum of NVML usedGpuMemory).",
        value=lambda r: r.memory_used,
    ),
    Family(
        "vgpu.pod.memory.allocated",
        "By",
        POD,
        "GPU memory the pod was given on this GPU or MIG device: what its allocator states (HAMi, DRA), "
        "else vGPU shares x the device's memory / ratio.",
        value=lambda r: r.memory_allocated,
    ),
    Family(
        "vgpu.pod.sm.utilization",
        "1",
        POD,
        "Share of the physical GPU's SMs the pod's processes used since the last collection, 0-1.",
        value=lambda r: r.sm_utilization,
        reads=_USE,
    ),
    Family(
        "vgpu.pod.vgpu.utilization",
        "1",
        POD,
        "SM use relative to the compute the pod was given: sm x ratio / shares, or sm / the allocator's "
        "compute limit (1 = exactly its share).",
        value=lambda r: r.vgpu_utilization,
        reads=_USE,
    ),
    Family(
        "vgpu.pod.processes",
        "{process}",
        POD,
        "Number of the pod's processes on this GPU.",
        value=lambda r: r.processes,
    ),
    Family(
        "vgpu.pod.sm.busy",
        "s",
        POD_COUNTED,
        "SM-busy seconds of the pod's processes on this GPU: its SM share integrated over time at the agent's "
        "sweep cadence, so rate() over any window is its mean SM use there. Absent where per-pod SM is unknown "
        f"(MIG, MPS). {_ENDED}",
        value=lambda r: r.sm_busy_seconds,
        reads=_USE,
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.pod.energy",
        "J",
        POD_COUNTED,
        "The pod's part of its GPU's energy: the GPU's idle power by the vGPU shares it holds, the rest by "
        "its SM share, interval by interval; with the GPU's unattributed joules, the pods' (those that ended "
        "included) add up to the GPU's. Absent where per-pod SM is unknown (MIG, MPS) or the GPU has no "
        f"energy counter. {_ENDED}",
        value=lambda r: r.energy_joules,
        reads=_SPLIT,
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.pod.memory.peak",
        "By",
        POD,
        "The most GPU memory the pod's processes held at once on this GPU since the agent first saw them, read "
        "at sweep cadence: what to size a vGPU share against.",
        value=lambda r: r.memory_peak,
    ),
    *(family for engine in POD_ENGINES for family in _engine_families(engine) if family.subject in (POD, POD_COUNTED)),
    *(family for family in _GPM_FAMILIES if family.subject is POD),
    Family(
        "vgpu.gpu.info",
        "",
        GPU_INFO,
        "1 for each GPU the agent knows, with what NVML says of it as labels: driver_version "
        "(nvmlSystemGetDriverVersion) and pci_bus_id (nvmlDeviceGetPciInfo's busId, 00000000:3B:00.0), "
        "each absent where NVML would not tell. Join on gpu_uuid to put them on another family's series. "
        "A GPU that cannot be read keeps the series it last had (vgpu_gpu_lost 1).",
        value=lambda row: 1,
    ),
    Family(
        "vgpu.gpu.memory.total",
        "By",
        GPU,
        "Physical memory of the GPU.",
        value=lambda g: g.device.memory_total,
    ),
    # NVML's v1 figure (nvmlDeviceGetMemoryInfo, nvmlMemory_t): nvml.h defines its `used` as the
    # "Sum of Reserved and Allocated device memory", and v2's `used` as "Allocated device memory"
    # alone, which is what nvidia-smi's memory.used and dcgm-exporter's DCGM_FI_DEV_FB_USED show
    # (DCGM reads v2 from driver R510 on). v1's is kept, as ever, so that the reservation, no
    # process's, is in the GPU's used beside what the processes hold (docs/metrics.md).
    Family(
        "vgpu.gpu.memory.used",
        "By",
        GPU,
        "Memory in use on the GPU: NVML's v1 used (nvmlDeviceGetMemoryInfo), what its processes allocated "
        "and what the driver reserves (vgpu_gpu_memory_reserved_bytes), which no process holds. nvidia-smi's "
        "memory.used and dcgm-exporter's DCGM_FI_DEV_FB_USED are this less the reserved.",
        value=lambda g: g.device.memory_used,
    ),
    Family(
        "vgpu.gpu.memory.reserved",
        "By",
        GPU,
        "Memory the driver and firmware reserve on the GPU (NVML's nvmlDeviceGetMemoryInfo_v2 reserved, "
        "nvidia-smi's memory.reserved), part of vgpu_gpu_memory_used_bytes. Absent where the driver or "
        "nvidia-ml-py has no v2 (drivers before R510), never 0 in its place.",
        value=lambda g: g.device.memory_reserved,
    ),
    # With it, the GPU's used adds up: the pods', the unattributed, the reserved and this
    # (docs/metrics.md). Apart from the unattributed, which is processes' memory by definition.
    Family(
        "vgpu.gpu.memory.unlisted",
        "By",
        GPU,
        "GPU memory in use that no process listing holds: vgpu_gpu_memory_used_bytes less "
        "vgpu_gpu_memory_reserved_bytes less the memory NVML lists for every process on the GPU (the pods' "
        "and those of no pod), never below 0. On an H200 with driver 580, a few MiB per CUDA context that its "
        "process's listed memory leaves out. Absent where the reserved is, in MIG mode, and where the "
        "processes or any process's memory could not be read.",
        value=lambda g: g.unlisted_memory,
    ),
    Family(
        "vgpu.gpu.sm.utilization",
        "1",
        GPU,
        "Device utilization over the last sweep's interval (the mean of NVML's own samples), 0-1 (absent in MIG mode).",
        value=lambda g: g.interval_utilization,
        reads=frozenset({Read.GPU_SAMPLES}),
    ),
    Family(
        "vgpu.gpu.sm.busy",
        "s",
        GPU,
        "SM-busy seconds of the GPU: its utilization integrated over time at the agent's sweep cadence "
        "(absent in MIG mode).",
        value=lambda g: g.sm_busy_seconds,
        reads=frozenset({Read.GPU_SAMPLES}),
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.gpu.sm.unattributed",
        "s",
        UNATTRIBUTED,
        "SM-busy seconds of the GPU that no pod was given, by reason: no_pod (a process of no pod: the host's, "
        "or one gone before it could be read), unseen (a process that lived between two looks, known from "
        "NVML's accounting alone), mps (beside a process whose use NVML cannot tell: an MPS client or a server "
        "of several pods), unexplained (what the GPU ran beyond what its processes' figures say). Its rate over "
        "the GPU's vgpu.gpu.sm.busy is the share of the GPU's use no bill holds.",
        value=lambda row: row[2],
        reads=_USE,
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.gpu.accounting.mode",
        "",
        GPU,
        "1 while NVML's accounting mode is on for the GPU (an administrator's nvidia-smi -am 1; the agent never "
        "sets it): a process that lived between two looks is then known from its record, and no period it ran in "
        "is billed whole to the pod beside it. 0 while "
        "it is off; absent where it is not asked (MIG mode, or no per-process figures).",
        value=lambda g: None if g.device.accounting_mode is None else int(g.device.accounting_mode),
        reads=_USE,
    ),
    *(family for engine in ENGINES for family in _engine_families(engine) if family.subject is GPU),
    Family(
        "vgpu.gpu.energy",
        "J",
        GPU,
        "Energy the GPU used, from NVML's counter (Volta and newer; a driver reload is counted from 0, "
        "not backwards). Absent where NVML has no energy counter.",
        value=lambda g: g.energy_joules,
        reads=frozenset({Read.ENERGY}),
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.gpu.energy.unattributed",
        "J",
        GPU,
        "The part of the GPU's energy given to no pod: idle power of the shares nobody holds, SM time no "
        "pod ran, and all of it where per-pod SM is unknown.",
        value=lambda g: g.energy_unattributed_joules,
        reads=_SPLIT,
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.gpu.vgpus",
        "{vgpu}",
        GPU,
        "How many vGPUs each physical GPU is presented as: the ratio in force.",
        value=lambda g: g.vgpus,
    ),
    Family(
        "vgpu.gpu.memory.unattributed",
        "By",
        GPU,
        "GPU memory of processes that belong to no pod.",
        value=lambda g: g.unattributed_memory,
    ),
    Family(
        "vgpu.gpu.mps.servers",
        "{server}",
        GPU,
        "MPS server processes on the GPU; above 0, NVML gives its clients' SM to the server, so the pod SM "
        "families are left out for this GPU.",
        value=lambda g: g.mps_servers,
    ),
    *(family for family in _GPM_FAMILIES if family.subject is GPU),
    Family(
        "vgpu.gpu.gpm.shared.windows",
        "{window}",
        GPU,
        "GPM windows in which several pods (or a process of no pod) used one of the GPU's devices, so that no pod "
        "got that device's GPM figures for the window. Absent without GPM.",
        value=lambda g: g.gpm_shared_windows,
        reads=_GPM_READS,
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.gpu.lost",
        "",
        KNOWN,
        "1 while the GPU cannot be read: a sweep read it since the agent started and the last one could not (NVML "
        "answers GPU_IS_LOST, fallen off the bus, or another error for it, lists it no more, or lists no GPU). Its "
        "other series are gone meanwhile; its XID series stay, under the labels it last had, until it is read "
        "again (its counts go on from where they were) or the agent restarts. 0 while it is read; absent while "
        "the driver is paused for an upgrade.",
        value=lambda row: int(row[1]),
    ),
    *(_health_family(figure) for figure in HEALTH_TABLE),
    Family(
        "vgpu.gpu.health.age",
        "s",
        GPU_HEALTH,
        "How long ago the GPU's health figures were read. They are read every 10 s, each GPU on a thread of "
        "its own, off the scrape's path; a GPU whose driver has not answered for three reads has no health "
        'series until it does (collection_errors_total{stage="device_health"} counts it), and its pods\' '
        "families are served as ever.",
        value=lambda row: row.age_s,
        reads=_HEALTH_READS,
    ),
    Family(
        "vgpu.gpu.xid.errors",
        "{error}",
        XID,
        "XID errors NVML reported for the GPU since the agent started, by code (xid; 999: a code the driver does "
        f"not know; past {MAX_XID_CODES} codes on one GPU, other): the driver's word that something failed, from "
        "an application fault (13, 31, 43) to a GPU that must be reset (48, 63, 64, 74, 79, 94, 95). A series "
        "appears at its first error, and stays while the GPU cannot be read (vgpu_gpu_lost 1).",
        value=lambda row: row[1].count,
        reads=frozenset({Read.XID_EVENTS}),
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.gpu.xid.last",
        "",
        XID_LAST,
        "The code of the latest XID error NVML reported for the GPU since the agent started, 0 before any "
        "(dcgm-exporter's DCGM_FI_DEV_XID_ERRORS): the code itself, where vgpu_gpu_xid_errors_total counts "
        "each code apart. Stays while the GPU cannot be read (vgpu_gpu_lost 1), as the XID series do.",
        value=lambda row: row[1],
        reads=frozenset({Read.XID_EVENTS}),
    ),
    Family(
        "pod_gpu_memory_used",
        "",
        SEED,
        "GPU memory used by the pod in MiB (original exporter's family).",
        value=lambda s: s.memory_used_mib,
        needs=Feature.SEED_METRICS,
    ),
    Family(
        "pod_gpu_sm_util",
        "",
        SEED,
        "Pod SM utilization in percent x ratio (original exporter's family).",
        value=lambda s: s.sm_percent,
        reads=_USE,
        needs=Feature.SEED_METRICS,
    ),
    Family(
        "pod_total_gpu_memory",
        "",
        SEED,
        "GPU memory allocated to the pod in MiB (original exporter's family).",
        value=lambda s: s.memory_allocated_mib,
        needs=Feature.SEED_METRICS,
    ),
    Family(
        "vgpu.agent.collection.duration",
        "s",
        SWEEPS,
        "Time one sweep of NVML, /proc and the sources took.",
        value=lambda seconds: seconds,
        instrument=Instrument.HISTOGRAM,
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    ),
    Family(
        "vgpu.agent.blind.gpus",
        "{gpu}",
        AGENT,
        "GPUs in use whose processes NVML does not list to the agent, which is outside the host's PID namespace "
        "(hostPID missing); 0 when the agent sees every process.",
        value=lambda seen: len(seen.snapshot.blind),
    ),
    Family(
        "vgpu.agent.driver.paused",
        "",
        AGENT,
        "1 while NVML is released because the GPU Operator is upgrading this node's driver "
        "(a nvidia.com/gpu.deploy.* node label says paused-for-driver-upgrade); GPU and pod families are "
        "left out meanwhile. 0 otherwise.",
        value=lambda seen: 1 if seen.snapshot.paused else 0,
    ),
    Family(
        "vgpu.agent.pod_resources.up",
        "",
        AGENT,
        "1 when the last call to the kubelet's pod-resources API answered, 0 when it failed (shares then come "
        "from pod limits: no idle allocations, ratio auto reads 1); absent without the Kubernetes API or with "
        "--no-pod-resources.",
        value=lambda seen: _answering(seen.health.answering(Stage.POD_RESOURCES)),
    ),
    Family(
        "vgpu.agent.collection.errors",
        "{error}",
        STAGES,
        "Failures during sweeps, by stage.",
        value=lambda stage_count: stage_count[1],
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.agent.refusals",
        "{input}",
        REFUSALS,
        "Inputs a tenant can write that the agent refused to let decide attribution or allocation, each "
        "counted once, by reason: nested_pod_cgroup (a cgroup below a container named like a pod: billed to "
        "the container's pod), unknown_pod (a pod the Kubernetes API does not know, past the bound: its usage "
        "unattributed), pid_reused (NVML samples older than the process holding their PID: given to no pod), "
        "mps_server_name (a process calling itself the MPS server where it cannot be one: billed to its pod), "
        "hami_annotation and config_hash (annotations on pods their writer did not make: ignored). "
        "docs/trust.md says why.",
        value=lambda row: row[1],
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.agent.export.failures",
        "{export}",
        AGENT,
        "OTLP exports that failed (with the push on).",
        value=lambda seen: seen.health.counts()[Stage.EXPORT],
        instrument=Instrument.COUNTER,
        needs=Feature.OTLP,
    ),
)
FAMILIES: tuple[Family[Any], ...] = _TABLE


def of_subject(*subjects: Subject[Any]) -> tuple[Family[Any], ...]:
    return tuple(family for family in FAMILIES if any(family.subject is subject for subject in subjects))


def selected(allow: Sequence[str] = (), deny: Sequence[str] = ()) -> tuple[tuple[Family[Any], ...], list[str]]:
    """The families `allow` keeps (all, when empty) less those `deny` names, and the patterns
    that name no family. A pattern is a regular expression matched against the whole of a
    family's Prometheus name or its OpenTelemetry name, as kube-state-metrics'
    --metric-allowlist and --metric-denylist match theirs."""

    compiled = {text: compile_pattern(text) for text in (*allow, *deny)}

    def named(pattern: str, family: Family[Any]) -> bool:
        return compiled[pattern].names(family.prometheus_name) or compiled[pattern].names(family.name)

    unmatched = [p for p in (*allow, *deny) if not any(named(p, family) for family in FAMILIES)]
    kept = tuple(
        family
        for family in FAMILIES
        if (not allow or any(named(p, family) for p in allow)) and not any(named(p, family) for p in deny)
    )
    return kept, unmatched


def reads_of(families: Sequence[Family[Any]]) -> frozenset[Read]:
    """What sweeps must read for `families`: the union of what each needs."""
    return frozenset(read for family in families for read in family.reads)


# The tables of docs/metrics.md: the subjects each covers, in order, and the line that heads it.
DOC_TABLES = (
    ((POD, POD_COUNTED), "Per (pod, GPU or MIG device), labels `namespace`, `pod`, `pod_uid`, `gpu_id`, `gpu_uuid`:"),
    ((GPU, GPU_INFO, UNATTRIBUTED, KNOWN), "Per GPU, labels `gpu_id`, `gpu_uuid`, `gpu_model`:"),
    (
        (GPU_HEALTH, XID, XID_LAST),
        "Per GPU, its health, read every 10 s off the scrape's path, labels `gpu_id`, `gpu_uuid`, `gpu_model`:",
    ),
    ((AGENT, STAGES, REFUSALS, SWEEPS), "The agent itself:"),
    ((SEED,), "With `--seed-metrics`, the original exporter's, labels `pod`, `gpu_id`:"),
)


def families_markdown() -> str:
    """The metric tables of docs/metrics.md, made from this table (scripts/gen-metric-tables.py
    writes them there, tests/test_docs.py checks the doc holds them): each family's name as a
    scrape shows it, its type and its help text."""
    out = []
    for subjects, heading in DOC_TABLES:
        out += [heading, "", "| name | type | meaning |", "|---|---|---|"]
        for family in of_subject(*subjects):
            labels = [label for label in family.labels if label not in POD_LABELS + GPU_LABELS + SEED_LABELS]
            name = f"`{family.prometheus_name}{{{','.join(labels)}}}`" if labels else f"`{family.prometheus_name}`"
            meaning = family.description.replace("|", "\\|").replace("<", "\\<").replace("*", "\\*")
            out.append(f"| {name} | {family.instrument.value} | {meaning} |")
        out.append("")
    return "\n".join(out)
