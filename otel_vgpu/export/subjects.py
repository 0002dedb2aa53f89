"""The subjects of the metric contract: what a family's series are about, the rows a
collection has of each, and the labels of each row.

A subject reads its rows from what one collection observed (`Observed`): the sweep's
snapshot, the agent's health, and the GPUs' health figures and XID counts read for the
collection. `per_snapshot` says which of those its rows follow from: the snapshot alone, and
the telemetry builds them once per snapshot for every family and reader that collects it
(export/telemetry.py `_rows_of`), or also what is read anew at each collection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from otel_vgpu.agent_health import COLLECTION_STAGES, AgentHealth, Pass, Reader, Refusal, Stage
from otel_vgpu.collect.aggregate import GpuRow, PodRow, Snapshot
from otel_vgpu.collect.device_health import HealthRow
from otel_vgpu.collect.lost_gpus import GpuIdentity, identity_of
from otel_vgpu.collect.xids import XidCount

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Observed:
    """What one collection reads: the sweep's snapshot, the agent's health, and the GPUs'
    health figures and XID counts as read for this collection."""

    snapshot: Snapshot
    health: AgentHealth
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
    per_snapshot: bool
    """True where its rows and their attributes follow from the snapshot alone: they are then
    built once per snapshot and shared by its families (five pod families read the same rows)
    and by every reader that collects that snapshot, a scrape and a push alike
    (export/telemetry.py `_rows_of`). False where they also follow from what is read anew at
    each collection (the agent's health, the GPUs' health figures, the XID counts): they are
    then built at each collection, so that a push after a scrape of one snapshot reads the
    counts as they are at the push. Stated at every subject, never assumed: a subject cached
    wrongly would serve a push the scrape's counts."""


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
        sm = None if row.sm_shown is None else row.sm_shown * 100.0 * ratio.get(row.gpu_index, 1.0)
        so_far = rows.get(key, SeedRow(*key, 0.0, 0.0, 0.0))
        rows[key] = SeedRow(
            *key,
            memory_used_mib=so_far.memory_used_mib + row.memory_used / MIB,
            sm_percent=None if so_far.sm_percent is None or sm is None else so_far.sm_percent + sm,
            memory_allocated_mib=so_far.memory_allocated_mib + row.memory_allocated / MIB,
        )
    return tuple(rows.values())


POD: Subject[PodRow] = Subject("pod", POD_LABELS, lambda seen: seen.snapshot.pods, pod_attributes, per_snapshot=True)
"""Per (pod, GPU or MIG device): one series per pod row of the snapshot."""
POD_COUNTED: Subject[PodRow] = Subject(
    "pod_counted",
    POD_LABELS,
    lambda seen: (*seen.snapshot.pods, *seen.snapshot.ended),
    pod_attributes,
    per_snapshot=True,
)
"""The per-pod counters' series: the pods' rows and, until every reader has collected them,
those of the pods that have ended, at their final values (collect/usage.py)."""
# What a POD_COUNTED family's help says of its ended pods' series.
ENDED = (
    "A pod that ends keeps its series at its final value until every reader has collected it; one "
    "seen anew after that starts from 0."
)
GPU: Subject[GpuRow] = Subject("gpu", GPU_LABELS, lambda seen: seen.snapshot.gpus, gpu_attributes, per_snapshot=True)
"""Per GPU."""
SEED: Subject[SeedRow] = Subject(
    "seed",
    SEED_LABELS,
    lambda seen: seed_rows(seen.snapshot),
    lambda row: {"pod": row.pod, "gpu_id": row.gpu_id},
    per_snapshot=True,
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
    "known",
    GPU_LABELS,
    lambda seen: known_gpus(seen.snapshot),
    lambda row: identity_attributes(row[0]),
    per_snapshot=True,
)
"""Per GPU the agent knows, lost or not."""
INFO_LABELS = ("driver_version", "pci_bus_id")


def info_attributes(gpu: GpuIdentity) -> dict[str, str]:
    """The GPU's labels and what NVML says of it beside them; "" (no label, to Prometheus) where
    NVML would not tell."""
    return {**identity_attributes(gpu), "driver_version": gpu.driver_version or "", "pci_bus_id": gpu.pci_bus_id or ""}


GPU_INFO: Subject[tuple[GpuIdentity, bool]] = Subject(
    "gpu_info",
    (*GPU_LABELS, *INFO_LABELS),
    lambda seen: known_gpus(seen.snapshot),
    lambda row: info_attributes(row[0]),
    per_snapshot=True,
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
    per_snapshot=True,
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
READERS: Subject[tuple[Reader, Pass]] = Subject(
    "readers", ("reader",), lambda seen: seen.health.passes(), lambda row: {"reader": row[0].value}, per_snapshot=False
)
"""Each of the agent's readers that has made a pass, its last one (otel_vgpu/agent_health.py `Reader`)."""

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
    READERS,
)
