"""When a GPU's sample periods settle, to be split among the lives in them (collect/ledger.py
`close`): not before the driver has had time to stamp the samples that stand for them
(`estimator.SETTLE_US`), nor while a listed process's next sample may still come (`awaited`),
nor in part of a gap that a sample read stands back over (`whole_gaps`).

Pure: a life's samples in (`estimator.Track`), a time out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from otel_vgpu.collect import estimator


def cut(now_us: int, waiting: Iterable[estimator.Track], tracks: Iterable[estimator.Track]) -> float:
    """The end of the newest period that may settle at `now_us`: `waiting` are the samples of
    the listed processes that may yet have a new one (running, and of a use NVML can tell),
    `tracks` every life's. At most `estimator.SETTLE_US` plus a figure's window (17.2 s) before
    `now_us`, or `estimator.WAIT_US`, whatever the samples."""
    return min(now_us - estimator.SETTLE_US, awaited(waiting, now_us), whole_gaps(tracks, now_us))


def awaited(waiting: Iterable[estimator.Track], now_us: int) -> float:
    """How far the periods may settle while a listed process's next sample may still come: to
    the oldest newest sample of those sampled within `estimator.WAIT_US`. The recorded driver
    stamps about one process a period on a GPU, so a process that runs may wait seconds for its
    next sample, which then stands back to this one (collect/ledger.py `sampled`); settled
    before it comes, its periods would read as idle. One with no sample for longer holds nothing
    back (an idle context), nor does one that ended (NVML forgot its sample: its tail)."""
    floor = now_us - estimator.WAIT_US
    held = math.inf
    for track in waiting:
        if track:
            newest = track.stamps[-1]
            if floor < newest < held:
                held = newest
    return held


def whole_gaps(tracks: Iterable[estimator.Track], now_us: int) -> float:
    """How far the periods may settle so that a gap settles whole: a sample back from a gap (it
    stands surely only for its own period) whose own period does not settle yet (stamped less
    than `estimator.SETTLE_US` ago) holds back every period of its gap, at most a figure's
    window. `estimator.rebalance` places what the process ran over the gap in the gap's periods
    nearest the sample, which it cannot where those are still pending and the older ones
    settled without it. Only those: were a gap that a held one reaches into to hold back its own
    in turn, a tenant's staggered processes could hold every pod's periods back without end,
    past what the ledger keeps pending."""
    recent = now_us - estimator.SETTLE_US
    held = math.inf
    for track in tracks:
        for at in range(len(track) - 1, -1, -1):
            if track.stamps[at] <= recent:
                break
            if track.sure[at] > track.since[at]:
                held = min(held, track.since[at])
    return held
