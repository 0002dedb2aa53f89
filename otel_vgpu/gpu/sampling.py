"""The sampling windows of each GPU, and the means over them.

NVML returns the per-process samples newer than a given timestamp. Each GPU
remembers when it was last collected; the next collection asks for samples
since then, but never for less than the last second, so two scrapes close
together never read a busy process as idle. (On an H200 with driver 580,
NVML keeps one sample per process, its latest, refreshed every 200 ms
period in which the process ran: bench/results/h200-nvml-samples.md.) What
each process ran of a window is the ledger's (collect/ledger.py).
"""

from __future__ import annotations

from collections.abc import Iterable

MIN_WINDOW_US = 1_000_000


def window_start(last_collected_us: int | None, now_us: int, min_window_us: int = MIN_WINDOW_US) -> int:
    """Start of the sampling window for a GPU collected now."""
    floor = now_us - min_window_us
    if last_collected_us is None:
        return floor
    return min(last_collected_us, floor)


def mean_since(samples: Iterable[tuple[int, float]], since_us: int) -> float | None:
    """The mean of a GPU's own samples newer than `since_us`; None where there are none."""
    fresh = [value for stamp, value in samples if stamp > since_us]
    return sum(fresh) / len(fresh) if fresh else None


def fit_scale(total: float, limit: float) -> float:
    """What the processes' figures, `total` together, are multiplied by to be no more than
    the GPU's own figure, `limit`: 1 where they are not over it."""
    return limit / total if total > limit else 1.0


class SamplingWindows:
    """The last collection time of each GPU, by UUID (indexes can change
    across a driver reload; UUIDs do not)."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def start(self, gpu_uuid: str, now_us: int) -> int:
        return window_start(self._last.get(gpu_uuid), now_us)

    def collected(self, gpu_uuid: str) -> bool:
        """Whether the GPU was collected before."""
        return gpu_uuid in self._last

    def advance(self, gpu_uuid: str, now_us: int) -> None:
        self._last[gpu_uuid] = now_us

    def keep_only(self, gpu_uuids: Iterable[str]) -> None:
        keep = set(gpu_uuids)
        self._last = {uuid: ts for uuid, ts in self._last.items() if uuid in keep}
