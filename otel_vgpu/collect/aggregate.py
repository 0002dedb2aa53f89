"""One collection's readings, aggregated per GPU and per (pod, GPU).

Pure functions over plain data: no NVML, no files, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from otel_vgpu.allocation.shares import Allocation
from otel_vgpu.gpu.backend import Device, GpuProcess
from otel_vgpu.gpu.pidns import BlindGpu
from otel_vgpu.pods.cgroups import PodRef
from otel_vgpu.pods.directory import PodMeta


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What one GPU gave in a sweep. None marks a call that failed."""

    device: Device
    processes: Sequence[GpuProcess] | None
    sm_by_pid: Mapping[int, float] | None


@dataclass(frozen=True, slots=True)
class GpuRow:
    index: int
    uuid: str
    model: str
    memory_total: int
    memory_used: int
    utilization: float
    vgpus: float
    unattributed_memory: int | None
    """None when the GPU's processes could not be listed."""


@dataclass(frozen=True, slots=True)
class PodRow:
    namespace: str
    """Empty when the pod's name is not known."""
    pod: str
    """The pod's name, or its UID when the name is not known."""
    container: str | None
    """The container's name (else its ID) with --by-container; None otherwise."""
    gpu_index: int
    gpu_uuid: str
    shares: float
    memory_used: int
    memory_allocated: int
    sm_utilization: float | None
    """Share of the physical GPU's SMs, 0-1; None when NVML could not tell."""
    vgpu_utilization: float | None
    """SM use relative to the pod's shares: 1 = exactly its share."""
    processes: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The result of one sweep."""

    taken_at: float
    """Monotonic time the sweep finished."""
    ok: bool
    """False when the sweep failed as a whole (no GPU could be enumerated)."""
    gpus: tuple[GpuRow, ...] = ()
    pods: tuple[PodRow, ...] = ()
    errors: tuple[tuple[str, str], ...] = field(default=())
    """(stage, message) of every failure in the sweep."""
    blind: tuple[BlindGpu, ...] = ()
    """GPUs in use whose processes the driver hides from the agent (no hostPID)."""


@dataclass(slots=True)
class _Row:
    namespace: str
    pod: str
    container: str
    memory_used: int = 0
    sm: float = 0.0
    processes: int = 0
    keys: set[tuple[str, str]] = field(default_factory=set)
    """(pod UID, container label) behind this row: the keys of its shares."""


def aggregate(
    readings: Sequence[GpuReading],
    pods_by_pid: Mapping[int, PodRef | None],
    lookup: Callable[[str], PodMeta | None],
    allocation: Allocation,
    ratio: float,
    by_container: bool = False,
) -> tuple[tuple[GpuRow, ...], tuple[PodRow, ...]]:
    """Per-GPU and per-(pod, GPU) rows (per (pod, container, GPU) with `by_container`).

    - A PID missing from `pods_by_pid`, or mapped to None, is unattributed.
    - Shares on a GPU: those placed there; else the pod's unplaced shares
      spread evenly over the GPUs it runs processes on; else one share.
      A pod with shares and no process on a GPU is an idle allocation
      (memory 0, SM 0).
    - Pods that resolve to the same namespace and name (a StatefulSet pod and
      its terminating predecessor) share a series, so their figures add up.
    """
    labeller = _Labeller(lookup, by_container)
    placed: dict[str, dict[tuple[str, str], float]] = {}
    for (pod_uid, container, gpu_uuid), count in allocation.placed.items():
        if count > 0:
            key = (pod_uid, container if by_container else "")
            per_gpu = placed.setdefault(gpu_uuid, {})
            per_gpu[key] = per_gpu.get(key, 0.0) + count
    unplaced: dict[tuple[str, str], float] = {}
    for (pod_uid, container), count in allocation.unplaced.items():
        key = (pod_uid, container if by_container else "")
        unplaced[key] = unplaced.get(key, 0.0) + count
    # Unplaced shares are spread over the GPUs each pod runs processes on.
    running_on: dict[tuple[str, str], int] = {}
    for reading in readings:
        keys = {labeller.key(ref) for p in reading.processes or () if (ref := pods_by_pid.get(p.pid)) is not None}
        for key in keys:
            running_on[key] = running_on.get(key, 0) + 1

    gpu_rows: list[GpuRow] = []
    pod_rows: list[PodRow] = []
    for reading in readings:
        device = reading.device
        unattributed: int | None = None
        if reading.processes is not None:
            rows, unattributed = _gpu_rows(
                reading, reading.processes, pods_by_pid, labeller, placed.get(device.uuid, {})
            )
            for row in rows.values():
                shares = _shares(row.keys, placed.get(device.uuid, {}), unplaced, running_on)
                sm = None if reading.sm_by_pid is None else min(1.0, row.sm)
                pod_rows.append(
                    PodRow(
                        namespace=row.namespace,
                        pod=row.pod,
                        container=row.container if by_container else None,
                        gpu_index=device.index,
                        gpu_uuid=device.uuid,
                        shares=shares,
                        memory_used=row.memory_used,
                        memory_allocated=int(shares * device.memory_total / ratio),
                        sm_utilization=sm,
                        vgpu_utilization=None if sm is None else sm * ratio / shares,
                        processes=row.processes,
                    )
                )
        gpu_rows.append(
            GpuRow(
                index=device.index,
                uuid=device.uuid,
                model=device.model,
                memory_total=device.memory_total,
                memory_used=device.memory_used,
                utilization=device.utilization,
                vgpus=ratio,
                unattributed_memory=unattributed,
            )
        )
    return tuple(gpu_rows), tuple(pod_rows)


class _Labeller:
    """Names a process's row: (namespace, pod, container label)."""

    def __init__(self, lookup: Callable[[str], PodMeta | None], by_container: bool) -> None:
        self._lookup = lookup
        self._by_container = by_container
        self._metas: dict[str, PodMeta | None] = {}

    def meta(self, pod_uid: str) -> PodMeta | None:
        if pod_uid not in self._metas:
            self._metas[pod_uid] = self._lookup(pod_uid)
        return self._metas[pod_uid]

    def key(self, ref: PodRef) -> tuple[str, str]:
        """(pod UID, container label): the container's name where the
        directory knows it, else its ID; "" unless rows are per container."""
        if not self._by_container:
            return (ref.pod_uid, "")
        meta = self.meta(ref.pod_uid)
        cid = ref.container_id or ""
        name = meta.containers.get(cid) if meta is not None else None
        return (ref.pod_uid, name or cid)

    def row(self, key: tuple[str, str]) -> tuple[str, str, str]:
        meta = self.meta(key[0])
        if meta is None:
            return ("", key[0], key[1])
        return (meta.namespace, meta.name, key[1])


def _gpu_rows(
    reading: GpuReading,
    processes: Sequence[GpuProcess],
    pods_by_pid: Mapping[int, PodRef | None],
    labeller: _Labeller,
    placed_here: Mapping[tuple[str, str], float],
) -> tuple[dict[tuple[str, str, str], _Row], int]:
    """The rows of one GPU whose processes are known, and its unattributed memory."""
    rows: dict[tuple[str, str, str], _Row] = {}

    def row_for(key: tuple[str, str]) -> _Row:
        label = labeller.row(key)
        row = rows.get(label)
        if row is None:
            row = rows[label] = _Row(*label)
        row.keys.add(key)
        return row

    unattributed = 0
    for process in processes:
        ref = pods_by_pid.get(process.pid)
        used = process.used_memory or 0
        if ref is None:
            unattributed += used
            continue
        row = row_for(labeller.key(ref))
        row.memory_used += used
        row.processes += 1
        if reading.sm_by_pid is not None:
            row.sm += reading.sm_by_pid.get(process.pid, 0.0)
    for key in placed_here:
        row_for(key)
    return rows, unattributed


def _shares(
    keys: set[tuple[str, str]],
    placed_here: Mapping[tuple[str, str], float],
    unplaced: Mapping[tuple[str, str], float],
    running_on: Mapping[tuple[str, str], int],
) -> float:
    total = 0.0
    for key in keys:
        if key in placed_here:
            total += placed_here[key]
        elif key in unplaced:
            total += unplaced[key] / max(1, running_on.get(key, 1))
        else:
            # The pod runs here, so it was given at least one share.
            total += 1.0
    return total
