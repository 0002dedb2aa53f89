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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from otel_vgpu.collect.aggregate import GpuRow, PodRow

MAX_GAP_S = 10.0

PodKey = tuple[str, str, str, str]
"""(pod UID, container or "", GPU UUID, MIG UUID or "")."""


def pod_key(row: PodRow) -> PodKey:
    return (row.pod_uid, row.container or "", row.gpu_uuid, row.mig_uuid or "")


@dataclass(frozen=True, slots=True)
class Usage:
    """The counters as of a sweep."""

    at: float | None = None
    """Monotonic time of that sweep; None before the first."""
    gpu_busy: dict[str, float] = field(default_factory=dict)
    """SM-busy seconds by GPU UUID."""
    pod_busy: dict[PodKey, float] = field(default_factory=dict)
    pod_peak: dict[PodKey, int] = field(default_factory=dict)


def accumulate(
    usage: Usage, gpus: Sequence[GpuRow], pods: Sequence[PodRow], now: float, max_gap_s: float = MAX_GAP_S
) -> tuple[Usage, tuple[GpuRow, ...], tuple[PodRow, ...]]:
    """The counters after a sweep at `now` that read `gpus` and `pods`, and those
    rows with their counters filled in."""
    seconds = 0.0 if usage.at is None else min(max(0.0, now - usage.at), max_gap_s)
    gpu_busy: dict[str, float] = {}
    new_gpus = []
    for gpu in gpus:
        busy = usage.gpu_busy.get(gpu.uuid, 0.0)
        # The mean of the GPU's own samples over the interval where NVML gave them; else
        # its last period's figure, which a sweep every few seconds samples, not averages.
        utilization = gpu.utilization_window if gpu.utilization_window is not None else gpu.utilization
        if utilization is not None:
            busy += utilization * seconds
            gpu_busy[gpu.uuid] = busy
            new_gpus.append(dataclasses.replace(gpu, sm_busy_seconds=busy))
        else:
            if gpu.uuid in usage.gpu_busy:
                gpu_busy[gpu.uuid] = busy  # held while the figure is unknown
            new_gpus.append(gpu)
    pod_busy: dict[PodKey, float] = {}
    pod_peak: dict[PodKey, int] = {}
    new_pods = []
    for row in pods:
        key = pod_key(row)
        peak = max(usage.pod_peak.get(key, 0), row.memory_used)
        pod_peak[key] = peak
        busy_so_far = usage.pod_busy.get(key)
        if row.sm_utilization is None:
            if busy_so_far is not None:
                pod_busy[key] = busy_so_far
            new_pods.append(dataclasses.replace(row, memory_peak=peak))
            continue
        busy = (busy_so_far or 0.0) + row.sm_utilization * seconds
        pod_busy[key] = busy
        new_pods.append(dataclasses.replace(row, memory_peak=peak, sm_busy_seconds=busy))
    return Usage(now, gpu_busy, pod_busy, pod_peak), tuple(new_gpus), tuple(new_pods)
