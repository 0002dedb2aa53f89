"""Per-process SM utilization, and the GPU's own, over the window since the last collection.

NVML keeps recent per-process samples, and the GPU's own utilization
samples, and returns those newer than a given timestamp. Each GPU remembers
when it was last collected; the next collection asks for samples since then,
but never for less than the last second, so two scrapes close together never
read a busy process as idle. The window ends at the collection's own clock
reading: a sample stamped later belongs to the next window. The pods' SM
and the GPU's are means over the same window, so on a time-sliced GPU the
pods never add up to more than the GPU.
"""

from __future__ import annotations

from collections.abc import Iterable

from otel_vgpu.gpu.backend import BusySample, UtilizationSample

MIN_WINDOW_US = 1_000_000


def window_start(last_collected_us: int | None, now_us: int, min_window_us: int = MIN_WINDOW_US) -> int:
    """Start of the sampling window for a GPU collected now."""
    floor = now_us - min_window_us
    if last_collected_us is None:
        return floor
    return min(last_collected_us, floor)


def mean_sm_by_pid(samples: Iterable[UtilizationSample], since_us: int, until_us: int) -> dict[int, float]:
    """Mean SM utilization (0-1) per PID of the samples inside the window (since, until].

    A PID without a sample in the window is absent: the caller reads it as
    idle. Values are clamped to 0-1, since drivers have been seen to report
    more than 100 %.
    """
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for sample in samples:
        if not since_us < sample.timestamp_us <= until_us:
            continue
        sums[sample.pid] = sums.get(sample.pid, 0.0) + sample.sm
        counts[sample.pid] = counts.get(sample.pid, 0) + 1
    return {pid: min(1.0, max(0.0, total / counts[pid])) for pid, total in sums.items()}


def mean_busy(samples: Iterable[BusySample], since_us: int, until_us: int) -> float | None:
    """The GPU's mean utilization (0-1) over the window (since, until]; None without a sample in it."""
    inside = [min(1.0, max(0.0, s.busy)) for s in samples if since_us < s.timestamp_us <= until_us]
    return sum(inside) / len(inside) if inside else None


class SamplingWindows:
    """The last collection time of each GPU, by UUID (indexes can change
    across a driver reload; UUIDs do not)."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def start(self, gpu_uuid: str, now_us: int) -> int:
        return window_start(self._last.get(gpu_uuid), now_us)

    def advance(self, gpu_uuid: str, now_us: int) -> None:
        self._last[gpu_uuid] = now_us

    def keep_only(self, gpu_uuids: Iterable[str]) -> None:
        keep = set(gpu_uuids)
        self._last = {uuid: ts for uuid, ts in self._last.items() if uuid in keep}
