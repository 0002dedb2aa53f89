"""What a process ran between two of its NVML samples, from figures that are trailing means.

NVML's figure for a process is not its use in the sample's period: it is the mean of its use
over the 71 sample periods (14.2 s) up to that period, in whole percent. Alone on an H100
with driver 580, a busy process's figure climbs from 0 to 55 % over its first 8 s and a
process that stops falls back over the next 14 s (tests/data/nvml-recordings/, fitted in
docs/nvml-sampling.md). Taken as the use of the time since the sample before, such a figure
bills a process for work it did up to 14 s earlier, and a burst is spread over the periods of
others: the neighbour of a bursty pod pays for its bursts.

The window undoes it. What a process ran over the window ending at a sample is the window
times the figure, so what it ran up to the sample is that plus what it had run up to the
window's start, which the samples before have told:

    ran(..t] = W x figure(t) + ran(..t - W]

`ran(..t - W]` is read from the history kept (between two points, what ran is spread evenly
over the time it may have run). A figure is in whole percent, rounded down:
what that takes off on average (half a percent) is added back, and the error left, half a
percent of 14.2 s (0.07 s), does not add up from sample to sample, since every point is
anchored by its own figure.

Pure: no clock, no NVML.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from otel_vgpu.gpu.backend import USE_FIGURES, ProcessUse, use_figures

WINDOW_US = 14_200_000
"""The span a process's figure is the mean of (71 periods of 200 ms)."""

FLOORED = 0.005
"""What NVML's whole percents, rounded down, take off a figure on average: added back, else a
process at 5 % would be billed a tenth less, at every step of the sum above."""

_IDLE = tuple(0.0 for _ in USE_FIGURES)
_SM = USE_FIGURES.index("sm")


@dataclass(frozen=True, slots=True)
class Point:
    """What a process had run by a time: figure-seconds of each of `USE_FIGURES`."""

    at_us: float
    ran: tuple[float, ...]


_at = operator.attrgetter("at_us")


def ran_by(history: Sequence[Point], at_us: float) -> tuple[float, ...]:
    """What the process had run by `at_us`: nothing before its first point, all of it after
    its last, and in between spread evenly."""
    if not history or at_us <= history[0].at_us:
        return _IDLE
    if at_us >= history[-1].at_us:
        return history[-1].ran
    i = bisect.bisect_right(history, at_us, key=_at)
    before, after = history[i - 1], history[i]
    part = (at_us - before.at_us) / (after.at_us - before.at_us)
    return tuple([b + (a - b) * part for b, a in zip(before.ran, after.ran, strict=True)])


def unwound(
    history: Sequence[Point], stamp_us: int, figure: ProcessUse, from_us: float, over_us: float | None = None
) -> tuple[list[Point], ProcessUse] | None:
    """A new sample of a process: its figure at `stamp_us` (a trailing mean), which the history
    holds as run no earlier than `from_us` (the sample before, or the read before it, whichever
    is later: collect/ledger.py `sampled`). Returns the history with it and the process's mean
    use over (`from_us`, `stamp_us`], or over (`over_us`, `stamp_us`] where given and earlier
    (no further back than the window): what it ran since, spread over the time the sample
    stands for; None for a sample no newer than the history's last."""
    window_s = WINDOW_US / 1e6
    # Whole percent rounded down leaves a figure on average half a percent under the use; a
    # figure of 0 may be none at all (a process decoding with no kernel): nothing is added.
    # Lists, not generators, in what follows: this runs for every sample of every process.
    figures = [value + FLOORED if value > 0 else 0.0 for value in use_figures(figure)]
    if not any(figures):
        # Every figure 0: under a whole percent of the window (nvml.h gives a sample only for a
        # use in its period), or nothing at all (a young context before its first kernel gets
        # one every period: the recordings). SM, the engine nearly all work runs on, is given
        # what a figure rounded down to 0 holds on average; collect/ledger.py `sampled` has such
        # a sample stand surely for none of its time. Read as nothing, twenty of a tenant's
        # processes pulsing under 1 % each hid their work where a neighbour's gap took it.
        figures[_SM] = FLOORED
    points = list(history)
    if points and stamp_us <= points[-1].at_us:
        return None
    if not points:
        # Its first: the whole window's use is in the part of it the process may have run in.
        start = max(from_us, stamp_us - WINDOW_US)
        points.append(Point(start, _IDLE))
    last = points[-1]
    # No further back than the window: what it ran before that, the figure does not hold.
    start = max(from_us, last.at_us, stamp_us - WINDOW_US)
    if start >= stamp_us:
        start = last.at_us
    if start > last.at_us:
        # It ran nothing between its last sample and `start`: no sample says it did (a figure
        # over the window holds all it ran since).
        points.append(Point(start, last.ran))
    span_s = (stamp_us - start) / 1e6
    lagged = ran_by(points, stamp_us - WINDOW_US)
    ran = tuple(
        [
            min(before + span_s, max(before, window_s * value + lag))
            for value, lag, before in zip(figures, lagged, last.ran, strict=True)
        ]
    )
    points.append(Point(stamp_us, ran))
    # Points older than a window before the newest are never read again, but the one before.
    keep = bisect.bisect_left(points, stamp_us - 2 * WINDOW_US, key=_at)
    del points[: max(0, keep - 1)]
    if over_us is not None and over_us < start:
        span_s = (stamp_us - max(over_us, stamp_us - WINDOW_US)) / 1e6
    mean = ProcessUse(*[min(1.0, (r - b) / span_s) for r, b in zip(ran, last.ran, strict=True)])
    return points, mean
