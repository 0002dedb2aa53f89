"""Per-process SM utilization over the window since the last collection.

NVML returns the per-process samples newer than a given timestamp. Each GPU
remembers when it was last collected; the next collection asks for samples
since then, but never for less than the last second, so two scrapes close
together never read a busy process as idle. (On an H200 with driver 580,
NVML keeps one sample per process, its latest, refreshed every 200 ms
period in which the process ran: bench/results/h200-nvml-samples.md.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from otel_vgpu.gpu.backend import USE_FIGURES, ProcessUse, UtilizationSample

MIN_WINDOW_US = 1_000_000
# NVML stamps a sample at the end of its period (200 ms on an H200, bench/results/
# h200-nvml-samples.md): the last sample of a process that ended can be stamped up to a
# period after the next process that takes its PID started.
SAMPLE_PERIOD_US = 200_000


def of_their_process(
    samples: Iterable[UtilizationSample], born_us: Mapping[int, int]
) -> tuple[list[UtilizationSample], list[UtilizationSample]]:
    """The samples that belong to the process holding their PID now, and those older: those
    stamped a sample period or more after it started (`born_us`, by PID, on the samples'
    clock; a PID absent keeps its samples), and the rest. NVML keeps samples by PID, and
    keeps an ended process's last one while a new process holds its PID: the older ones are
    the ended process's work, never the new one's."""
    kept: list[UtilizationSample] = []
    older: list[UtilizationSample] = []
    for sample in samples:
        born = born_us.get(sample.pid)
        if born is not None and sample.timestamp_us < born + SAMPLE_PERIOD_US:
            older.append(sample)
        else:
            kept.append(sample)
    return kept, older


def window_start(last_collected_us: int | None, now_us: int, min_window_us: int = MIN_WINDOW_US) -> int:
    """Start of the sampling window for a GPU collected now."""
    floor = now_us - min_window_us
    if last_collected_us is None:
        return floor
    return min(last_collected_us, floor)


def mean_use_by_pid(samples: Iterable[UtilizationSample], since_us: int) -> dict[int, ProcessUse]:
    """Mean utilization (0-1) per PID of the samples inside the window, figure by figure.

    A PID without a sample in the window is absent: the caller reads it as
    idle. Values are clamped to 0-1, since drivers have been seen to report
    more than 100 %.
    """
    sums: dict[int, ProcessUse] = {}
    counts: dict[int, int] = {}
    for sample in samples:
        if sample.timestamp_us <= since_us:
            continue
        so_far = sums.get(sample.pid)
        sums[sample.pid] = sample.use if so_far is None else so_far.plus(sample.use)
        counts[sample.pid] = counts.get(sample.pid, 0) + 1
    return {
        pid: ProcessUse(**{f: min(1.0, max(0.0, getattr(total, f) / counts[pid])) for f in USE_FIGURES})
        for pid, total in sums.items()
    }


def until_they_ended(samples: Iterable[UtilizationSample], since_us: int, now_us: int) -> dict[int, ProcessUse]:
    """What processes that have ended used of a GPU over the window, by PID: the mean of their
    samples inside it times the part of the window before their last sample (a process runs
    until about its last busy period, and NVML's sample says how busy it was while it ran)."""
    window = max(1, now_us - since_us)
    samples = [s for s in samples if s.timestamp_us > since_us]
    latest: dict[int, int] = {}
    for sample in samples:
        latest[sample.pid] = max(latest.get(sample.pid, 0), sample.timestamp_us)
    return {
        pid: ProcessUse(**{f: getattr(use, f) * min(1.0, (latest[pid] - since_us) / window) for f in USE_FIGURES})
        for pid, use in mean_use_by_pid(samples, since_us).items()
    }


def mean_since(samples: Iterable[tuple[int, float]], since_us: int) -> float | None:
    """The mean of a GPU's own samples newer than `since_us`; None where there are none."""
    fresh = [value for stamp, value in samples if stamp > since_us]
    return sum(fresh) / len(fresh) if fresh else None


def fit_scale(total: float, limit: float) -> float:
    """What the processes' figures, `total` together, are multiplied by to be no more than
    the GPU's own figure, `limit`: 1 where they are not over it."""
    return limit / total if total > limit else 1.0


def fit_under(groups: Sequence[Mapping[int, ProcessUse]], gpu_window: float | None) -> list[Mapping[int, ProcessUse]]:
    """The processes' figures, by PID in each group (those holding their PIDs now, and those
    that held them before: `of_their_process`), scaled by one factor, in proportion, so that
    together they are no more than the GPU's own figure over the window.

    The GPU's samples (one per 200 ms period on an H200) say how much of the window
    a kernel ran; the processes' each say only what NVML last measured for them,
    refreshed irregularly for a process that runs in bursts, so at the end of a burst
    their sum can read above what the GPU ran (bench/results/h200-nvml-samples.md).
    The GPU's figure is the total; the processes' figures are how it splits.
    """
    if gpu_window is None:
        return list(groups)
    scale = fit_scale(sum(use.sm for group in groups for use in group.values()), gpu_window)
    if scale == 1.0:
        return list(groups)
    return [{pid: dataclasses.replace(use, sm=use.sm * scale) for pid, use in group.items()} for group in groups]


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
