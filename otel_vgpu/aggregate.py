"""One collection's readings, aggregated per GPU and per (pod, GPU).

Pure functions over plain data: no NVML, no files, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from otel_vgpu.allocation import Shares
from otel_vgpu.cgroups import PodRef
from otel_vgpu.gpu import Device, GpuProcess
from otel_vgpu.pods import PodMeta


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
    gpu_index: int
    gpu_uuid: str
    shares: int
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


@dataclass(slots=True)
class _PodAccumulator:
    namespace: str
    pod: str
    shares: int = 0
    memory_used: int = 0
    sm: float = 0.0
    processes: int = 0
    pod_uids: set[str] = field(default_factory=set)


def aggregate(
    readings: Sequence[GpuReading],
    pods_by_pid: Mapping[int, PodRef | None],
    lookup: Callable[[str], PodMeta | None],
    shares: Shares,
    ratio: float,
) -> tuple[tuple[GpuRow, ...], tuple[PodRow, ...]]:
    """Per-GPU and per-(pod, GPU) rows.

    - A PID missing from `pods_by_pid`, or mapped to None, is unattributed.
    - A pod with processes on a GPU and no known allocation there counts one
      share; a pod with shares and no process there is an idle allocation
      (memory 0, SM 0).
    - Pods that resolve to the same namespace and name (a StatefulSet pod and
      its terminating predecessor) share a series, so their figures add up.
    """
    gpu_rows: list[GpuRow] = []
    pod_rows: list[PodRow] = []
    shares_by_gpu: dict[str, dict[str, int]] = {}
    for (pod_uid, gpu_uuid), count in shares.items():
        if count > 0:
            shares_by_gpu.setdefault(gpu_uuid, {})[pod_uid] = count

    for reading in readings:
        device = reading.device
        unattributed: int | None = None
        if reading.processes is not None:
            rows, unattributed = _gpu_pods(
                reading, reading.processes, pods_by_pid, lookup, shares_by_gpu.get(device.uuid, {}), ratio
            )
            pod_rows.extend(rows)
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


def _gpu_pods(
    reading: GpuReading,
    processes: Sequence[GpuProcess],
    pods_by_pid: Mapping[int, PodRef | None],
    lookup: Callable[[str], PodMeta | None],
    gpu_shares: Mapping[str, int],
    ratio: float,
) -> tuple[list[PodRow], int]:
    """The pod rows of one GPU whose processes are known, and its unattributed memory."""
    device = reading.device
    per_pod: dict[tuple[str, str], _PodAccumulator] = {}

    def accumulator(pod_uid: str) -> _PodAccumulator:
        meta = lookup(pod_uid)
        key = (meta.namespace, meta.name) if meta else ("", pod_uid)
        acc = per_pod.get(key)
        if acc is None:
            acc = per_pod[key] = _PodAccumulator(namespace=key[0], pod=key[1])
        if pod_uid not in acc.pod_uids:
            acc.pod_uids.add(pod_uid)
            # One share where the allocation is unknown: the pod runs here,
            # so it was given at least that much.
            acc.shares += gpu_shares.get(pod_uid, 1)
        return acc

    unattributed = 0
    for process in processes:
        ref = pods_by_pid.get(process.pid)
        used = process.used_memory or 0
        if ref is None:
            unattributed += used
            continue
        acc = accumulator(ref.pod_uid)
        acc.memory_used += used
        acc.processes += 1
        if reading.sm_by_pid is not None:
            acc.sm += reading.sm_by_pid.get(process.pid, 0.0)
    for pod_uid in gpu_shares:
        accumulator(pod_uid)

    rows = []
    for acc in per_pod.values():
        sm = None if reading.sm_by_pid is None else min(1.0, acc.sm)
        rows.append(
            PodRow(
                namespace=acc.namespace,
                pod=acc.pod,
                gpu_index=device.index,
                gpu_uuid=device.uuid,
                shares=acc.shares,
                memory_used=acc.memory_used,
                memory_allocated=int(acc.shares * device.memory_total / ratio),
                sm_utilization=sm,
                vgpu_utilization=None if sm is None else sm * ratio / acc.shares,
                processes=acc.processes,
            )
        )
    return rows, unattributed
