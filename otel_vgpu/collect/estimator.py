"""One estimator splits each sample period's GPU busy time among the processes that lived in it.
docs/chargeback.md ("The estimator") states its model and its error; in short:

- **Evidence.** A process's NVML sample (its SM figure, stamped at the end of the driver's
  period) is the only figure of its own use. NVML keeps one, its latest, and refreshes it only
  while the process runs; the agent reads it at its sweeps. A sample read stands for the time
  back to the one before it (no further than its figure's window). It stands there surely
  where the one before was there to read at the read before it (less `BACK_US`, the driver's
  delay in showing a sample). Else it comes back from a gap: about one process a period gets
  a sample on the recorded driver, so a process may run for seconds unstamped, or it may have
  idled; surely it stands only for its own period, and what it ran over the gap is placed
  where the GPU ran more than the sure figures (`rebalance`). It stands for no time after
  its stamp.
- **Absence.** A period after a process's newest sample, once the driver has had `SETTLE_US`
  to stamp a new one (and up to `WAIT_US` while the process may yet have one; a gap settles
  whole: collect/settling.py), is a period it did not run in (nvml.h: a process idle over a
  period has no sample for it). A process that ended took its sample with it (the driver forgets it); the
  periods between its newest sample and its end are its `tail`: it may have run in them, at
  most at the rate its newest sample says.
- **The split.** Each life claims its figure times the part of the period it lived. Where the
  claims add up to more than the GPU ran, the figures that swing give way first, each down to
  the lowest its own samples read within `PEAK_US`; then (time-slicing: a waiting process's
  figure counts its waiting) each is scaled down alike. Where they add up to less, each life
  may take more, in turn and up to its own room: a pod alone with figures on the GPU
  up to `SLACK` more than them (the driver's own error: docs/nvml-sampling.md); a life at an
  edge of its life its figure over the rest of the period (the listings' cadence blurs when it
  came and went). Over the periods a sweep settles (`rebalance`), a process back from a gap
  takes what its sample says it ran over the gap from what is unexplained there, the nearest
  its sample first: at its rate first (where the GPU ran more than the sure figures by more
  than `SLACK`, down to a swinging neighbour's lowest reading), then up to the whole period;
  then a life given less than its own figures claim takes it back. Then (`give_tails`) a tail
  up to its newest figure (and SLACK), and a figure that swings up to the highest its own
  samples read within `PEAK_US` (one read at a trough). The rest is unattributed.
- **What no pod is given,** by reason: `no_pod` (a process of no pod's share), `unseen` (what a
  process known from accounting alone may have run), `mps` (a period with a process whose use
  NVML cannot tell: an MPS client, or its server, whose figure holds its clients' work),
  `unexplained` (what the GPU ran beyond every figure and tail).

It conserves: in every period, the lives' shares and the unattributed reasons add up to the
GPU's figure exactly. No pod is given more than its own figures (and SLACK) or its own tails
allow, and no input of one pod changes what another's evidence allows: a tenant's timing, idle
contexts or extra pods can shrink its own bill only into the unattributed.

Pure: plain data in, plain data out.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_vgpu.gpu.backend import ProcessUse

# How far past a period the driver may stamp the next sample of a process that ran in it
# (a bursty process beside a busy one: a sample every 2 s or so on an H200,
# docs/nvml-sampling.md), and the arrival delay besides: a period is settled that long after it.
SETTLE_US = 3_000_000
# How far before the read that preceded it a sample may stand surely: NVML shows a sample some
# time after its stamp, so a process that ran just before a read may have had no sample to read
# yet. One whose sample before is older comes back from a gap: surely only for its own period,
# the rest of its work placed where the GPU ran more than the sure figures (`rebalance`). Wider
# (10 s, tried 2026-12-07), a bursty pod's figure stood surely over its idle seconds and took a
# steady neighbour's share: billed up to 1.37 of what it ran, bursts of 1 s every 10 s.
BACK_US = 1_000_000
# The longest a process that runs may go without a new sample: the recorded driver stamps about
# one process a period on a GPU, drawn by use (docs/nvml-sampling.md), and time-sliced processes
# that ran every period went up to 3 s without one inside a steady stretch, and 4.6 s (two) and
# 8.4 s (three processes) at the 99th percentile across their plans' changes. The periods after
# a process's newest sample wait for its next before they settle (collect/settling.py
# `awaited`), so that its work is placed where it ran, not read as idle: up to a figure's window
# (collect/trailing.py), the longest the next sample's figure still holds what it ran after this
# one. At 10 s, a server's seconds after its last sample of a batch settled idle before its next
# batch's sample came back over them (billed 0.885 of what it ran: bench/results/).
WAIT_US = 14_200_000
# How far back a tail's rate is read from a life's newest samples.
TAIL_US = 1_000_000
# How far around a period a life's samples show how high its figure runs.
PEAK_US = 5_000_000
# How much more than its figure a life may be given where the GPU ran more than every figure
# says: the error of one process's figure alone on the GPU (docs/nvml-sampling.md).
SLACK = 0.05

REASONS = ("no_pod", "unseen", "mps", "unexplained")


class Kind(enum.Enum):
    FIGURE = "figure"
    """A sample stands for the period: `value` is its figure."""
    IDLE = "idle"
    """Settled, and no sample stands for it: the process ran nothing."""
    TAIL = "tail"
    """The process ended after this period, past its newest sample, which the driver forgot
    with it: it may have run, at most at its newest figure (`value`)."""
    UNKNOWN = "unknown"
    """NVML cannot tell its use (MPS)."""


@dataclass(frozen=True, slots=True)
class Evidence:
    kind: Kind
    value: float = 0.0
    """Its SM figure, 0-1 (a FIGURE's, or a TAIL's newest)."""
    sample: int | None = None
    """Which of the life's samples it is, by position."""
    peak: float = 0.0
    """The highest figure of its samples within `PEAK_US` of the period: what its own samples
    show it runs at, at most, around then."""
    low: float = 0.0
    """The lowest of them."""
    sure: bool = True
    """A FIGURE that surely stands for the period; else one that may (a process back from a
    gap, before its own period): it is given only what the sure ones leave (`rebalance`)."""
    stamp: int | None = None
    """The stamp of the sample it is."""
    gap: float = 0.0
    """A FIGURE of a sample back from a gap (in the gap, and in its own period): what its sample
    claims over the whole gap it may stand for, in periods' worth of the GPU (its figure times
    the gap's periods): its work there, when in the gap no sample tells."""

    @property
    def lowest(self) -> float:
        """The lowest its figure may read here: its own, or the lowest of its samples around."""
        return min(self.low, self.value)


@dataclass(frozen=True, slots=True)
class Present:
    """One life in one period."""

    owner: str | None
    """Its pod's UID; None: of no pod."""
    part: float
    """The part of the period it lived, 0-1."""
    evidence: Evidence
    unseen: bool = False
    """Known from NVML's accounting alone: no listing saw it."""

    @property
    def unowned(self) -> str | None:
        """The reason what it is given is no pod's (`REASONS`); None: it is its pod's."""
        if self.owner is not None:
            return None
        return "unseen" if self.unseen else "no_pod"


@dataclass(frozen=True, slots=True)
class Split:
    shares: tuple[float, ...]
    """Each life's part of the GPU's figure, in the order given."""
    unattributed: dict[str, float]
    """What no pod was given, by reason; with the pods' shares, the GPU's figure."""


@dataclass(slots=True)
class Track:
    """A life's samples, oldest first, in parallel lists: each one's stamp, its use (unwound:
    its mean use since it may stand, collect/trailing.py), its SM figure (0-1, the use's, kept
    apart for the estimator's reads), from when it may stand and from when surely. The ledger
    keeps it as samples come and go (collect/ledger.py `sampled`), so that a period's evidence
    is a few bisects of plain integers, not a list of every sample built at every sweep."""

    stamps: list[int] = field(default_factory=list)
    uses: list[ProcessUse] = field(default_factory=list)
    figures: list[float] = field(default_factory=list)
    since: list[float] = field(default_factory=list)
    sure: list[float] = field(default_factory=list)

    def append(self, stamp: int, use: ProcessUse, since: float, sure: float) -> None:
        """A sample newer than every one it has."""
        self.stamps.append(stamp)
        self.uses.append(use)
        self.figures.append(use.sm)
        self.since.append(since)
        self.sure.append(sure)

    def pop(self) -> None:
        """The newest sample gone (a newer one stands in for it)."""
        for column in self._columns():
            column.pop()

    def keep_newest(self, count: int) -> None:
        for column in self._columns():
            del column[:-count]

    def _columns(self) -> tuple[list[Any], ...]:
        return (self.stamps, self.uses, self.figures, self.since, self.sure)

    def __len__(self) -> int:
        return len(self.stamps)


# Evidence that carries no figure is the same in every period: made once, not per life and period.
IDLE = Evidence(Kind.IDLE)
_UNKNOWN = Evidence(Kind.UNKNOWN)


def evidence_at(
    samples: Track,
    start_us: int,
    end_us: int,
    ended_us: float | None,
    unknown: bool = False,
) -> Evidence:
    """What a life's samples (`Track`) say of the period (start, end]: the first sample at or
    after its end stands for it, if it stands from before that end; with none after it, a life
    that ended after the period began is in its tail, at its newest figure (none: no evidence,
    nothing given), and any other ran nothing."""
    return LifeEvidence(samples, ended_us, unknown).at(start_us, end_us)


class LifeEvidence:
    """`evidence_at` of one life, period after period: the periods a sample stands for share one
    `Evidence` where nothing it holds differs (its sample, the samples around, whether it stands
    surely, the period's length), so that a sweep makes one per sample, not one per period."""

    __slots__ = (
        "_after",
        "_before",
        "_ended_us",
        "_from",
        "_key",
        "_last",
        "_period",
        "_samples",
        "_tail",
        "_to",
        "_unknown",
    )

    def __init__(self, samples: Track, ended_us: float | None, unknown: bool = False) -> None:
        self._samples = samples
        self._ended_us = ended_us
        self._unknown = unknown
        self._key: tuple[int, int, int, bool, int] | None = None
        self._last = IDLE
        self._tail: Evidence | None = None
        # The ends of the periods (of `_period`) that `_key` holds for: after `_after`, from
        # `_from`, up to `_to` and before `_before`. A period's end in there has `_last`
        # without a bisect: the periods a sample stands for are stepped through, not searched.
        self._after, self._to, self._from, self._before = math.inf, -math.inf, math.inf, -math.inf
        self._period = -1

    def at(self, start_us: int, end_us: int) -> Evidence:
        """The evidence of the period (start, end] (`evidence_at`)."""
        if self._holding(start_us, end_us):
            return self._last
        return self.run(start_us, end_us)[0]

    def run(self, start_us: int, end_us: int) -> tuple[Evidence, float, float]:
        """`at`, and the later periods of the same length that have the same `Evidence`: those
        that end up to the first bound and before the second (none after an idle period or a
        tail's: they are read anew; every one where NVML cannot tell the life's use)."""
        if self._unknown:
            return _UNKNOWN, math.inf, math.inf
        samples = self._samples
        stamps = samples.stamps
        at = bisect.bisect_left(stamps, end_us)
        if at < len(stamps):
            since = samples.since[at]
            if since >= end_us:
                return IDLE, -math.inf, -math.inf
            sure = samples.sure[at]
            period = end_us - start_us
            key = (
                at,
                bisect.bisect_left(stamps, end_us - PEAK_US),
                bisect.bisect_right(stamps, end_us + PEAK_US),
                end_us > sure,
                period,
            )
            if key != self._key:
                self._key = key
                self._figure(key, since, sure, end_us)
            return self._last, self._to, self._before
        if self._ended_us is not None and self._ended_us > start_us and stamps:
            # The rate it was last seen running at, up to its end: over its last second at least,
            # since a figure over less is NVML's whole percents more than its use.
            if self._tail is None:
                self._tail = Evidence(Kind.TAIL, _newest_rate(samples), len(stamps) - 1)
            return self._tail, -math.inf, -math.inf
        return IDLE, -math.inf, -math.inf

    def _holding(self, start_us: int, end_us: int) -> bool:
        """Whether the period is one `_key` holds for (`_figure`)."""
        held = self._after < end_us <= self._to and self._from <= end_us < self._before
        return held and end_us - start_us == self._period

    def _figure(self, key: tuple[int, int, int, bool, int], since: float, sure: float, end_us: int) -> None:
        """The evidence of `key` made `_last`, and the ends of the periods of the same length
        that have the same key: each bisect of `run` lands where it did, the sample stands from
        before the end, and it stands as surely (`_holding`)."""
        at, low, high, unsure, period = key
        samples = self._samples
        stamps = samples.stamps
        figures = samples.figures
        value = figures[at]
        # A sample back from a gap reads its mean over the gap, not a rate it ran at: no reading
        # of how low its figure runs (a bursty process gave way for its idle seconds).
        whole = samples.sure
        around = [value, *(figures[k] for k in range(low, high) if whole[k] <= samples.since[k])]
        gap = value * max(0.0, sure - since) / period if period > 0 else 0.0
        self._last = Evidence(Kind.FIGURE, value, at, max(around), min(around), unsure, stamps[at], gap)
        count = len(stamps)
        after = since
        to = float(stamps[at])
        if at > 0:
            after = max(after, stamps[at - 1])
        if low > 0:
            after = max(after, stamps[low - 1] + PEAK_US)
        if low < count:
            to = min(to, stamps[low] + PEAK_US)
        if unsure:
            after = max(after, sure)
        else:
            to = min(to, sure)
        self._after, self._to, self._period = after, to, period
        self._from = stamps[high - 1] - PEAK_US if high > 0 else -math.inf
        self._before = stamps[high] - PEAK_US if high < count else math.inf


def _newest_rate(samples: Track) -> float:
    """A life's mean figure over its newest samples, back to `TAIL_US` before the newest."""
    ran = spanned = 0.0
    for at in range(len(samples.stamps) - 1, -1, -1):
        span = samples.stamps[at] - samples.since[at]
        if span == float("inf") or span <= 0:
            break
        ran += samples.figures[at] * span
        spanned += span
        if spanned >= TAIL_US:
            break
    return samples.figures[-1] if spanned <= 0 else ran / spanned


def split(gpu: float, present: Sequence[Present], tails: bool = True) -> Split:
    """The GPU's figure of one period (0-1, of the whole period) among the lives in it (the
    module's rules); without `tails`, the tails and the peaks are left for `give_tails` (after
    `rebalance`: what a life's own figures owe it, and what a process back from a gap ran in
    it, come before what an ended one may have run, or a swinging figure may have read low)."""
    [(shares, unattributed)] = split_run([gpu], present, tails)
    return Split(tuple(shares), unattributed)


def split_run(
    gpus: Sequence[float], present: Sequence[Present], tails: bool = True
) -> list[tuple[list[float], dict[str, float]]]:
    """`split` of each of a run of periods that share their lives and each life's part and
    evidence (a sample stands for several periods), the GPU's figure of each in `gpus`: each
    period's shares and unattributed. What the lives alone decide (their claims, lows, rooms,
    reasons) is worked out once for the run; each period does only the sums its figure moves,
    in the order `split` does them, so that each period's result is the one it would have alone."""
    claims = [p.part * p.evidence.value if p.evidence.kind is Kind.FIGURE and p.evidence.sure else 0.0 for p in present]
    wanted = sum(claims)
    lows = [p.part * p.evidence.lowest if c > 0 else 0.0 for p, c in zip(present, claims, strict=True)]
    floor = sum(lows)
    slack = wanted - floor
    alone = [c * SLACK for c in claims] if _alone(present) else None
    # A life at an edge of its life lived the part of the period the listings tell, give
    # or take a listing's cadence: at its own figure, it may have run the rest of it.
    room = [(1.0 - p.part) * p.evidence.value if p.evidence.kind in (Kind.FIGURE, Kind.TAIL) else 0.0 for p in present]
    tail_room = _tail_room(present) if tails else None
    # A figure that swings may have been read at a trough: each life may run up to the highest
    # its own samples read around the period (a tenant's troughs timed at the sweeps shed
    # nothing, and a still neighbour takes none of it).
    peaks = _peaks(present) if tails else []
    no_pod = [(k, why) for k, p in enumerate(present) if (why := p.unowned) is not None]
    if any(p.evidence.kind is Kind.UNKNOWN for p in present):
        reason = "mps"
    elif any(p.unseen for p in present):
        reason = "unseen"
    else:
        reason = "unexplained"
    out = []
    for gpu in gpus:
        unattributed = dict.fromkeys(REASONS, 0.0)
        if wanted >= gpu and wanted > 0:
            # More than the GPU ran: the figures that swing give way first, each down to the
            # lowest its own samples read around the period (a crest read high takes nothing
            # from a still neighbour); then, time-slicing, every figure alike.
            excess = wanted - gpu
            if slack >= excess and slack > 0:
                shares = [c - (c - lo) * excess / slack for c, lo in zip(claims, lows, strict=True)]
            else:
                shares = [gpu * lo / floor for lo in lows] if floor > 0 else [gpu * c / wanted for c in claims]
            left = 0.0
        else:
            shares = list(claims)
            left = gpu - wanted
            # A process back from a gap, before its own period, takes nothing here: what it ran
            # over the gap is placed by `rebalance`, in the periods nearest its sample first.
            # The driver's own error, where one pod's figures alone explain the GPU: they may
            # read up to SLACK low. Beside another pod, or what NVML cannot tell, what the GPU
            # ran beyond the figures may be theirs: none of it is this pod's.
            if alone is not None:
                left = _give(shares, alone, left)
            left = _give(shares, room, left)
            # The tails: what ended processes may have run past their last sample, at the rate
            # they were last seen at. Never more: what a neighbour's figure leaves is no
            # evidence of what this process ran.
            if tail_room is not None:
                left = _give(shares, tail_room, left)
                left = _give(shares, _peak_room(peaks, shares), left)
        for k, why in no_pod:
            unattributed[why] += shares[k]
        if left > 0:
            unattributed[reason] += left
        out.append((shares, unattributed))
    return out


def _tail_room(present: Sequence[Present]) -> list[float]:
    return [p.part * p.evidence.value * (1 + SLACK) if p.evidence.kind is Kind.TAIL else 0.0 for p in present]


def _peaks(present: Sequence[Present]) -> list[tuple[int, float]]:
    """The sure figures' highest readings around the period, by life: how much a figure read at
    a trough may be given."""
    return [
        (k, p.part * p.evidence.peak)
        for k, p in enumerate(present)
        if p.evidence.kind is Kind.FIGURE and p.evidence.sure
    ]


def _peak_room(peaks: Sequence[tuple[int, float]], shares: Sequence[float]) -> list[float]:
    room = [0.0] * len(shares)
    for k, peak in peaks:
        room[k] = max(0.0, peak - shares[k])
    return room


def give_tails(present: Sequence[Present], shares: list[float], unattributed: dict[str, float]) -> None:
    """The tails and the peaks of a period that `split` left without (`tails=False`), given in
    place from what it left unattributed for want of a figure: after `rebalance`, so that what
    a process back from a gap surely ran there comes before what a swinging figure may have."""
    give_tails_run(present, [(shares, unattributed)])


def give_tails_run(present: Sequence[Present], periods: Sequence[tuple[list[float], dict[str, float]]]) -> None:
    """`give_tails` of each of a run of periods that share their lives (`split_run`'s): the
    lives' rooms worked out once for the run."""
    rooms: tuple[list[float], list[tuple[int, float]], list[tuple[int, str]]] | None = None
    for shares, unattributed in periods:
        reason = next((r for r in ("mps", "unseen", "unexplained") if unattributed.get(r, 0.0) > 0), None)
        if reason is None:
            continue  # most periods: the figures explain the GPU, and nothing is worked out
        if rooms is None:
            tail_room, peaks = _tail_room(present), _peaks(present)
            if not peaks and not any(tail_room):
                return  # no tail and no sure figure: nothing to give in any period
            nobody = [(k, why) for k, life in enumerate(present) if (why := life.unowned) is not None]
            rooms = (tail_room, peaks, nobody)
        tail_room, peaks, nobody = rooms
        before = [shares[k] for k, _ in nobody]
        left = _give(shares, tail_room, unattributed[reason])
        unattributed[reason] = _give(shares, _peak_room(peaks, shares), left) if peaks else left
        for (k, why), old in zip(nobody, before, strict=True):
            if shares[k] > old:
                unattributed[why] += shares[k] - old


def rebalance(
    periods: Sequence[tuple[Sequence[Hashable], Sequence[Evidence], Sequence[float], list[float], dict[str, float]]],
    gaps: dict[tuple[Hashable, int], float] | None = None,
) -> None:
    """A window's periods as `split` left them (each: who its lives are, their evidence, the
    part of it each lived, their shares and the unattributed), evened out over the window, in
    place. A figure is a mean over the time its sample stands for, not the use of each period:
    a life whose use swings inside that time was given less than its figure where the GPU ran
    less than the figures together (its troughs, or a neighbour's), and the GPU's peaks went
    unexplained. What a life's own figures claim over the window, less what it was given, it may
    take back from what is unexplained in the periods where its figure stands, up to the whole
    period. No life is given more than its figures claim over the window.

    A process back from a gap: what it ran over the gap is known (its figure over the gap), not
    when. It is given from what is unexplained in the gap's periods and its sample's own, the
    nearest its sample first (a process that comes back runs on until its sample), at most at
    its figure's rate first, then up to the whole period, up to what its sample claims over the
    whole gap: `gaps`, by life and sample, holds what is left of each claim from one window to
    the next (a window may end inside a gap whose sample is read later), and is updated in place."""
    claims = {} if gaps is None else gaps
    # Which lives may stand back from a gap, and which stand surely with what their figure
    # claims, by list of evidence: a run of periods shares one (collect/ledger.py), so each is
    # read once, not once a period.
    plans: dict[int, tuple[list[tuple[int, int]], list[tuple[int, Hashable, float]]]] = {}
    for keys, evidence, parts, _, _ in periods:
        if id(evidence) not in plans:
            plans[id(evidence)] = (
                [
                    (k, said.stamp)
                    for k, said in enumerate(evidence)
                    if said.kind is Kind.FIGURE and said.gap > 0 and said.stamp is not None
                ],
                [
                    (k, key, part * said.value)
                    for k, (key, said, part) in enumerate(zip(keys, evidence, parts, strict=True))
                    if said.kind is Kind.FIGURE and said.sure
                ],
            )
    # Twice over the gaps' periods, the nearest each sample first: at the rate its figure says
    # it ran over the gap (a steady process the driver stamped seconds apart ran all along, and
    # leaves an ended neighbour's tail its room), then up to the whole period (a process that
    # came back ran its gap's work in its last seconds).
    for at_rate in (True, False):
        if not at_rate and not any(claim > 1e-12 for claim in claims.values()):
            break  # every claim placed at its rate: nothing for the second pass
        for keys, evidence, parts, shares, left in reversed(periods):
            unsure, sure = plans[id(evidence)]
            if not unsure:
                continue  # no life back from a gap: no room, and no claim to begin
            spare = left.get("unexplained", 0.0)
            room = [0.0] * len(shares)
            for k, stamp in unsure:
                claim = claims.setdefault((keys[k], stamp), evidence[k].gap)
                most = parts[k] * evidence[k].value if at_rate else parts[k]
                room[k] = min(claim, max(0.0, most - shares[k]))
            total = sum(room)
            if total <= 0:
                continue
            # Where the GPU ran more than the sure figures say (by more than one figure's own
            # error), someone beside them ran: at its rate, a process back from a gap may have
            # the part of a swinging neighbour's figure that its own lowest reading leaves.
            # Where the sure figures explain the GPU, none: a bursty process's rate is no
            # evidence that it ran in its idle periods, and takes nothing from a steady one.
            if at_rate and spare > SLACK:
                spare += _give_way(evidence, parts, shares, sure, total - spare)
            if spare <= 0:
                continue
            left["unexplained"] = _give(shares, room, spare)
            scale = min(1.0, spare / total)
            for key, said, r in zip(keys, evidence, room, strict=True):
                if r > 0 and said.stamp is not None:
                    claims[(key, said.stamp)] -= r * scale
    owed: dict[Hashable, float] = {}
    for _, evidence, _, shares, _ in periods:
        for k, key, claim in plans[id(evidence)][1]:
            owed[key] = owed.get(key, 0.0) + claim - shares[k]
    for _, evidence, parts, shares, left in periods:
        spare = left.get("unexplained", 0.0)
        if spare <= 0:
            continue
        room = [0.0] * len(shares)
        for k, key, _ in plans[id(evidence)][1]:
            room[k] = min(max(0.0, owed.get(key, 0.0)), parts[k] - shares[k])
        total = sum(room)
        left["unexplained"] = _give(shares, room, spare)
        scale = 0.0 if total <= 0 else min(1.0, spare / total)
        for k, key, _ in plans[id(evidence)][1]:
            if room[k] > 0:
                owed[key] -= room[k] * scale


def _give_way(
    evidence: Sequence[Evidence],
    parts: Sequence[float],
    shares: list[float],
    sure: Sequence[tuple[int, Hashable, float]],
    wanted: float,
) -> float:
    """Up to `wanted` taken, in place, from the sure figures that swing, each down to the
    lowest its own samples read around the period (as `split` has them give way to each
    other): what a process back from a gap ran at its own rate is not left to a neighbour's
    crest. Returns what was taken."""
    if wanted <= 0:
        return 0.0
    pool = [(k, max(0.0, shares[k] - parts[k] * evidence[k].lowest)) for k, _, _ in sure]
    total = sum(above for _, above in pool)
    if total <= 0:
        return 0.0
    scale = min(1.0, wanted / total)
    for k, above in pool:
        shares[k] -= above * scale
    return total * scale


def _alone(present: Sequence[Present]) -> bool:
    """Whether every life that may have run in the period is of one pod."""
    owners = set()
    for life in present:
        if life.evidence.kind is Kind.UNKNOWN or life.unseen:
            return False
        if life.evidence.kind is not Kind.IDLE:
            owners.add(life.owner)
    return len(owners) == 1 and None not in owners


def _give(shares: list[float], room: Sequence[float], left: float) -> float:
    """Up to `left` more, spread over `room` in proportion: what is left after."""
    total = sum(room)
    if left <= 0 or total <= 0:
        return left
    scale = min(1.0, left / total)
    for k, r in enumerate(room):
        shares[k] += r * scale
    return left - total * scale
