"""What each pod has used so far: SM-busy seconds and peak memory, carried from sweep to sweep.

A gauge read at scrape time says "now"; chargeback needs "how much". Each
sweep adds, per (pod, GPU or MIG device[, container]), its SM share times the
seconds since that GPU's previous sweep, and per GPU the device's SM figure
times the same seconds: counters of busy seconds whose `rate()` over any
window is the mean SM use in it, whatever the scrape interval, since they
advance at the agent's sweep cadence (`--sweep-interval`). Pure functions
over plain data: no NVML, no clock.

- A gap longer than `max_gap_s` between two sweeps of a GPU (no sweeper and
  no scrape for a while, a driver that did not answer) counts as `max_gap_s`:
  the figures of one sweep are not stretched over minutes they did not see.
- A pod's counter is left out where its SM is unknown (MIG, MPS), as its
  gauges are; it resumes where it was when the figure comes back.
- A series that is not in a sweep (its pod ended, its GPU went away) is
  dropped; a pod that comes back starts from 0, as a restarted agent does:
  Prometheus' `rate()` and `increase()` read a drop as a counter reset.
- PIDs do not matter: the counters are keyed by pod and device.

Energy, per GPU, follows NVML's counter (millijoules since the driver loaded;
a value below the last one means a reload, and counts from 0). Each
interval's energy is split, so that the pods' and the unattributed add up to
the GPU's exactly:

- idle energy, the GPU's idle power times the interval (at most the whole),
  goes to the pods by the vGPU shares they hold (shares / ratio of the GPU),
  since a reserved share costs its part of an idle GPU; the shares nobody
  holds are unattributed. Idle power is configured (`--gpu-idle-watts`, for
  a node whose GPUs may never be seen idle), else learned: the lowest power
  seen over an interval in which the GPU was idle (utilization under 1 %);
  until one is seen, it is 0 and all the energy is active;
- active energy, the rest, goes by SM share: each pod's SM over the larger of
  the GPU's utilization and the pods' sum; what no pod ran is unattributed;
- where per-pod SM is unknown (MIG, MPS) no pod gets energy: all of it is
  unattributed, and the pods' energy families are left out, as their SM ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from otel_vgpu.collect import engines as engine_windows
from otel_vgpu.collect.aggregate import GpuRow, PodKey, PodRow, pod_key
from otel_vgpu.collect.engines import Engines

MAX_GAP_S = 10.0
# A GPU under this utilization over an interval is idle: its power then is its idle power.
IDLE_UTILIZATION = 0.01


@dataclass(frozen=True, slots=True)
class Usage:
    """The counters as of a sweep."""

    at: float | None = None
    """Monotonic time of that sweep; None before the first."""
    gpu_busy: dict[str, float] = field(default_factory=dict)
    """SM-busy seconds by GPU UUID."""
    pod_busy: dict[PodKey, float] = field(default_factory=dict)
    pod_peak: dict[PodKey, int] = field(default_factory=dict)
    energy_mj: dict[str, int] = field(default_factory=dict)
    """NVML's energy counter as last read, by GPU UUID."""
    idle_watts: dict[str, float] = field(default_factory=dict)
    gpu_joules: dict[str, float] = field(default_factory=dict)
    unattributed_joules: dict[str, float] = field(default_factory=dict)
    pod_joules: dict[PodKey, float] = field(default_factory=dict)
    pending: dict[str, Pending] = field(default_factory=dict)
    """By GPU UUID: the sweeps since its energy counter was last read."""
    engines: Engines = field(default_factory=Engines)
    """The other engines' figures and counters, over engine windows (collect/engines.py)."""


@dataclass(frozen=True, slots=True)
class EnergySplit:
    """One interval's energy of a GPU, in joules: the pods' parts and what no pod holds."""

    total: float
    pods: dict[PodKey, float]
    unattributed: float


@dataclass(frozen=True, slots=True)
class Pending:
    """What a GPU's energy is split by, summed over the sweeps since its counter was last
    read (the counter is read less often than the sweeps run). Each weight is a figure
    times the seconds it held, so that splitting the energy of several sweeps at once
    gives what splitting each sweep's would have, had the power been steady."""

    seconds: float = 0.0
    unknown_seconds: float = 0.0
    """Seconds in which per-pod SM was unknown (MIG, MPS, no figure): their energy is unattributed."""
    busy: float = 0.0
    """The larger of the GPU's utilization and the pods' sum, times seconds."""
    peak_utilization: float = 0.0
    held: dict[PodKey, float] = field(default_factory=dict)
    """Each pod's part of the GPU's vGPUs (shares / the larger of the ratio and all shares held), times seconds."""
    ran: dict[PodKey, float] = field(default_factory=dict)
    """Each pod's SM share times seconds."""


def note_interval(
    pending: Pending, seconds: float, utilization: float | None, ratio: float, pods: Sequence[PodRow]
) -> Pending:
    """`pending` with one more interval of `seconds` of a GPU added."""
    if any(row.sm_utilization is None for row in pods) or utilization is None:
        return dataclasses.replace(
            pending, seconds=pending.seconds + seconds, unknown_seconds=pending.unknown_seconds + seconds
        )
    held, ran = dict(pending.held), dict(pending.ran)
    total_shares = sum(row.shares for row in pods)
    for row in pods:
        key = pod_key(row)
        held[key] = held.get(key, 0.0) + (row.shares / max(ratio, total_shares) if total_shares > 0 else 0.0) * seconds
        ran[key] = ran.get(key, 0.0) + (row.sm_utilization or 0.0) * seconds
    pods_sum = sum(row.sm_utilization or 0.0 for row in pods)
    return Pending(
        seconds=pending.seconds + seconds,
        unknown_seconds=pending.unknown_seconds,
        busy=pending.busy + max(utilization, pods_sum) * seconds,
        peak_utilization=max(pending.peak_utilization, utilization),
        held=held,
        ran=ran,
    )


def split_pending(joules: float, idle_watts: float, pending: Pending) -> EnergySplit:
    """The `joules` a GPU drew over `pending`'s sweeps, split among the pods (module docstring)."""
    known = pending.seconds - pending.unknown_seconds
    if pending.seconds <= 0 or known <= 0:
        return EnergySplit(joules, {}, joules)
    mine = joules * known / pending.seconds
    idle = min(mine, max(0.0, idle_watts) * known)
    active = mine - idle
    parts = {}
    for key in pending.held.keys() | pending.ran.keys():
        idle_part = idle * pending.held.get(key, 0.0) / known
        active_part = active * pending.ran.get(key, 0.0) / pending.busy if pending.busy > 0 else 0.0
        parts[key] = idle_part + active_part
    return EnergySplit(joules, parts, joules - sum(parts.values()))


def accumulate(
    usage: Usage,
    gpus: Sequence[GpuRow],
    pods: Sequence[PodRow],
    now: float,
    max_gap_s: float = MAX_GAP_S,
    idle_watts: float | None = None,
) -> tuple[Usage, tuple[GpuRow, ...], tuple[PodRow, ...]]:
    """The counters after a sweep at `now` that read `gpus` and `pods`, and those
    rows with their counters filled in. `idle_watts`: every GPU's idle power as
    configured; None: learned."""
    seconds = 0.0 if usage.at is None else min(max(0.0, now - usage.at), max_gap_s)
    gpu_busy: dict[str, float] = {}
    for gpu in gpus:
        utilization = gpu.interval_utilization
        if utilization is not None:
            gpu_busy[gpu.uuid] = usage.gpu_busy.get(gpu.uuid, 0.0) + utilization * seconds
        elif gpu.uuid in usage.gpu_busy:
            gpu_busy[gpu.uuid] = usage.gpu_busy[gpu.uuid]  # held while the figure is unknown
    pod_busy: dict[PodKey, float] = {}
    pod_peak: dict[PodKey, int] = {}
    keys = [pod_key(row) for row in pods]
    for key, row in zip(keys, pods, strict=True):
        pod_peak[key] = max(usage.pod_peak.get(key, 0), row.memory_used)
        busy_so_far = usage.pod_busy.get(key)
        if row.sm_utilization is not None:
            pod_busy[key] = (busy_so_far or 0.0) + row.sm_utilization * seconds
        elif busy_so_far is not None:
            pod_busy[key] = busy_so_far  # held while the figure is unknown; not exported
    energy = _energy(usage, gpus, pods, seconds, idle_watts)
    engines = engine_windows.step(usage.engines, gpus, pods, keys, seconds)
    # One replace per row: on a node of hundreds of pods, replace() was a quarter of a sweep.
    new_gpus = tuple(
        dataclasses.replace(
            gpu,
            sm_busy_seconds=gpu_busy.get(gpu.uuid) if gpu.interval_utilization is not None else None,
            energy_joules=energy.gpu_joules.get(gpu.uuid),
            energy_unattributed_joules=energy.unattributed_joules.get(gpu.uuid),
            engine_utilization=engines.gpu_now.get(gpu.uuid, {}),
            engine_busy_seconds=engines.gpu_busy.get(gpu.uuid, {}),
        )
        for gpu in gpus
    )
    new_pods = tuple(
        dataclasses.replace(
            row,
            memory_peak=pod_peak[key],
            sm_busy_seconds=pod_busy.get(key) if row.sm_utilization is not None else None,
            energy_joules=energy.pod_joules.get(key),
            engine_utilization=engines.pod_now.get(key, {}) if row.use is not None else {},
            engine_busy_seconds=engines.pod_busy.get(key, {}) if row.use is not None else {},
        )
        for key, row in zip(keys, pods, strict=True)
    )
    counters = dataclasses.replace(
        energy, at=now, gpu_busy=gpu_busy, pod_busy=pod_busy, pod_peak=pod_peak, engines=engines
    )
    return counters, new_gpus, new_pods


def _energy(
    usage: Usage, gpus: Sequence[GpuRow], pods: Sequence[PodRow], seconds: float, configured: float | None
) -> Usage:
    """The energy counters after an interval of `seconds` (a Usage with only them set)."""
    seen: dict[str, int] = {}
    idle_watts: dict[str, float] = {}
    gpu_joules: dict[str, float] = {}
    unattributed: dict[str, float] = {}
    pod_joules: dict[PodKey, float] = {}
    pending: dict[str, Pending] = {}
    on_gpu: dict[str, list[PodRow]] = {}
    for row in pods:
        on_gpu.setdefault(row.gpu_uuid, []).append(row)
    for gpu in gpus:
        last = usage.energy_mj.get(gpu.uuid)
        if gpu.device.energy_mj is None and not (gpu.device.energy_skipped and last is not None):
            continue  # no counter: no energy families
        mine = on_gpu.get(gpu.uuid, [])
        utilization = gpu.interval_utilization
        if any(row.mig_uuid is not None for row in mine):
            utilization = None  # MIG: no per-pod SM, all of it unattributed
            mine = [row for row in mine if row.mig_uuid is None]
        so_far = usage.pending.get(gpu.uuid, Pending()) if last is not None else Pending()
        interval = note_interval(so_far, seconds, utilization, gpu.vgpus, mine)
        watts = configured if configured is not None else usage.idle_watts.get(gpu.uuid)
        gpu_joules[gpu.uuid] = usage.gpu_joules.get(gpu.uuid, 0.0)
        unattributed[gpu.uuid] = usage.unattributed_joules.get(gpu.uuid, 0.0)
        for row in mine:
            key = pod_key(row)
            pod_joules[key] = usage.pod_joules.get(key, 0.0)
        if gpu.device.energy_mj is None:  # not read in this sweep: the interval waits for the next read
            seen[gpu.uuid] = last or 0
            pending[gpu.uuid] = interval
            if watts is not None:
                idle_watts[gpu.uuid] = watts
            continue
        seen[gpu.uuid] = gpu.device.energy_mj
        # Below the last reading: the driver reloaded, its counter started again from 0.
        joules = (
            0.0
            if last is None
            else (gpu.device.energy_mj - last if gpu.device.energy_mj >= last else gpu.device.energy_mj) / 1000
        )
        idle_throughout = interval.unknown_seconds == 0 and interval.peak_utilization < IDLE_UTILIZATION
        if configured is None and last is not None and interval.seconds > 0 and idle_throughout:
            drawn = joules / interval.seconds
            watts = drawn if watts is None else min(watts, drawn)
        if watts is not None:
            idle_watts[gpu.uuid] = watts
        split = split_pending(joules, watts or 0.0, interval)
        gpu_joules[gpu.uuid] += split.total
        unattributed[gpu.uuid] += split.unattributed
        for key, part in split.pods.items():
            if key in pod_joules:
                pod_joules[key] += part
            else:  # a pod that ended since the last read: no series is left to carry its part
                unattributed[gpu.uuid] += part
    return Usage(
        energy_mj=seen,
        idle_watts=idle_watts,
        gpu_joules=gpu_joules,
        unattributed_joules=unattributed,
        pod_joules=pod_joules,
        pending=pending,
    )
