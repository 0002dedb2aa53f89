"""Every process that touched a GPU, billed what it ran, however short it lived.

NVML keeps one utilization sample per process, its latest, and forgets it when the process
ends (bench/results/h200-nvml-ended-samples.md). A sweep every few seconds would know only
the processes alive at its instant, and a process's latest sample times the whole interval:
a tenant that times its work around the sweeps would shed its bill. So the watch
(collect/process_watch.py) lists each GPU's processes between sweeps, and this ledger keeps each
process's life on the GPU: when it was first and last listed, its pod as read at first
sight, and every sample read of it while it lived. At each sweep the GPU's own samples (one
per sample period, 200 ms on an H200) that have settled (`estimator.SETTLE_US` old: the
driver has stamped every sample that will stand for them) are split among the lives in each
period by one estimator (collect/estimator.py, docs/chargeback.md "The estimator"):

- a process lived from halfway between the listing that first had it and the one before,
  to halfway between the last listing that had it and the first without it, so that a
  listing's cadence neither adds nor takes on average;
- its evidence in a period is the sample that stands for it, its tail after its newest
  sample where it ended, or none: it ran nothing then;
- a process whose use NVML cannot tell (an MPS client, or a server serving several pods)
  gets no figure, and neither does any process of its pod on the GPU (the pod's row has no
  SM figure to carry it: collect/aggregate.py); what the period's figures leave is `mps`;
- where an administrator turned NVML's accounting mode on, a process that no listing saw is
  known from its record (`accounted`): a life of no pod, without a figure, over the time the
  record gives; what the figures leave in its periods is `unseen`. Its lifetime figure is not
  used: nvml.h calls it "utilization stats just like returned by
  nvmlDeviceGetUtilizationRates but for the life time of a process", which may be the
  device's.

What no pod is given is counted by its reason (`Window.unattributed`, the estimator's).

Pure: no NVML, no clock; the watch and the sweep bring the listings and samples.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from otel_vgpu.collect import estimator, settling, trailing
from otel_vgpu.gpu.backend import USE_FIGURES, AccountingRecord, ProcessUse, UtilizationSample, use_figures
from otel_vgpu.pods.cgroups import PodRef

# NVML's sample period on an H200 (bench/results/h200-nvml-samples.md); a window's own
# spacing of the GPU's samples is used where it has two or more.
PERIOD_US = 200_000
# A sample stamped this soon after a process started is its PID's earlier holder's: NVML
# stamps a sample at the end of its period (bench/results/h200-nvml-samples.md).
BORN_SLACK_US = 200_000
# The shortest time between two samples of a process that the ledger keeps both of.
MIN_SPAN_US = 1_000_000
# Samples kept per process: the newest, a minute's worth at the watch's cadence at most.
SAMPLES_KEPT = 64
# Lives that ended this long before the newest period settled are forgotten, whatever
# else: no window reaches that far back.
FORGET_US = 60_000_000
# The GPU's periods waiting to settle, at most: NVML's own buffer holds 71 (14 s), read anew at
# each sweep, and a period may wait up to `estimator.WAIT_US` (71 periods) for a process's next
# sample (collect/settling.py `awaited`): both, and a margin.
PENDING_KEPT = 160

# Why the GPU's SM time went to no pod (collect/estimator.py says each).
UNATTRIBUTED_REASONS = estimator.REASONS

LifeKey = tuple[int, int | None]
"""(PID, start time in clock ticks): who a process is; the start time tells a reused PID apart."""


@dataclass(frozen=True, slots=True)
class Seen:
    """A process in one listing of a GPU."""

    pid: int
    start: int | None
    """/proc/<pid>/stat's start time (clock ticks after boot); None where it could not be read."""
    born_us: int | None
    """The same, on the samples' clock (microseconds)."""
    owner: PodRef | None
    """Its pod, read from its cgroup at first sight; None: of no pod, or gone already."""


@dataclass(slots=True)
class Life:
    """One process's life on a GPU, as the listings and samples saw it."""

    pid: int
    start: int | None
    born_us: int | None
    owner: PodRef | None
    since_us: float
    """When it appeared (-inf: listed at the first listing, it may have run for long)."""
    last_listed_us: int
    until_us: float | None = None
    """When it went; None while it is listed."""
    absent_us: int | None = None
    """The first listing without it: it had ended by then."""
    samples: estimator.Track = field(default_factory=estimator.Track)
    """Its samples, by stamp, oldest first: each its mean use since the time it may stand for
    the process, unwound from NVML's trailing mean (collect/trailing.py), and from when it may
    stand and from when surely (`sampled`)."""
    trail: list[trailing.Point] = field(default_factory=list)
    """What it had run by each sample, as its figures tell: what the next is unwound with."""
    unknown: bool = False
    """NVML cannot tell its use (MPS): it gets no figure."""
    unseen: bool = False
    """Known from accounting alone: no listing had it."""

    @property
    def key(self) -> LifeKey:
        return (self.pid, self.start)

    def overlap_us(self, start_us: int, end_us: int) -> float:
        """How much of (start, end] it lived."""
        until = math.inf if self.until_us is None else self.until_us
        return max(0.0, min(until, end_us) - max(self.since_us, start_us))


@dataclass(slots=True)
class GpuLedger:
    """The lives of one GPU's processes not yet integrated to their end."""

    lives: dict[LifeKey, Life] = field(default_factory=dict)
    listed: dict[int, LifeKey] = field(default_factory=dict)
    """By PID: the life each PID of the last listing is."""
    listed_at: int | None = None
    """When it was last listed, on the samples' clock."""
    pending: list[tuple[int, float | None]] = field(default_factory=list)
    """The GPU's periods read and not yet settled: each one's end and its SM figure."""
    settled_to: int | None = None
    """The end of the newest period settled."""
    read_at: int | None = None
    """When its processes' samples were last read."""
    gaps: dict[tuple[LifeKey, int], float] = field(default_factory=dict)
    """By life and sample stamp: what is left to place of what a process back from a gap ran
    over it (`estimator.rebalance`), while the gap's periods settle."""
    shown: tuple[dict[int, ProcessUse], float | None] = field(default_factory=lambda: ({}, None))
    """The last window that settled a period: each listed process's mean use over it, by PID,
    and the GPU's own figure; what the gauges show while no new period settles."""


@dataclass(frozen=True, slots=True)
class Window:
    """What the processes of a GPU ran over one window, in figure-seconds."""

    seconds: float
    """How long the window is: its periods together."""
    ran: dict[LifeKey, ProcessUse]
    """By life: each figure times the seconds it held (SM fitted under the GPU's own)."""
    gpu_busy: float
    """The GPU's own SM-busy seconds over the window."""
    unexplained: float
    """The part of `gpu_busy` no process was given."""
    users: frozenset[str]
    """The pods (UIDs) whose processes lived in the window, and "" for any of no pod."""
    lives: Mapping[LifeKey, Life] = field(default_factory=dict)
    """The lives behind `ran`, as they stood when the window closed."""
    unattributed: Mapping[str, float] = field(default_factory=dict)
    """The GPU's SM-busy seconds no pod was given, by reason (the module's); each at least 0."""


def listed(ledger: GpuLedger, at_us: int, seen: Sequence[Seen]) -> list[Life]:
    """The ledger after a listing at `at_us` that had `seen`; the lives it begins."""
    before = ledger.listed_at
    since = -math.inf if before is None else (before + at_us) / 2
    now: dict[int, LifeKey] = {}
    begun = []
    for process in seen:
        key = ledger.listed.get(process.pid)
        life = ledger.lives.get(key) if key is not None else None
        if life is None or (process.start is not None and life.start is not None and process.start != life.start):
            life = Life(process.pid, process.start, process.born_us, process.owner, since, at_us)
            ledger.lives[life.key] = life
            begun.append(life)
        elif process.start is not None:
            # Read anew (the sweep's pass, its refusals applied): that is whose it is.
            life.owner = process.owner
        life.last_listed_us = at_us
        now[process.pid] = life.key
    for pid, key in ledger.listed.items():
        if now.get(pid) != key and (gone := ledger.lives.get(key)) is not None and gone.until_us is None:
            # A sample stamped later says it ran till then (a driver that keeps an ended
            # process's sample; or the listings far apart).
            last_sample = gone.samples.stamps[-1] if gone.samples else -math.inf
            gone.until_us = min(at_us, max((gone.last_listed_us + at_us) / 2, last_sample))
            gone.absent_us = at_us
    ledger.listed = now
    ledger.listed_at = at_us
    return begun


def confirmed(ledger: GpuLedger, at_us: int) -> None:
    """The last listing still holds at `at_us`: a probe saw nothing come or go since."""
    for key in ledger.listed.values():
        life = ledger.lives.get(key)
        if life is not None:
            life.last_listed_us = at_us
    ledger.listed_at = at_us


def sampled(ledger: GpuLedger, samples: Sequence[UtilizationSample], at_us: int | None = None) -> frozenset[int]:
    """Each sample given to the life that held its PID when it was taken; the PIDs listed now
    whose sample is older than the process holding them (an earlier holder's, never theirs).
    `at_us`: when NVML was asked for them (every process's at once). A sample stands back to the
    process's sample before it (no further than its figure's window; a first one, to the read
    before less `estimator.BACK_US`, or to the process's start). It stands surely where it
    continues a sample there to read at the read before (less `estimator.BACK_US`), or is the
    process's first; one that comes back after a gap (the recorded driver may leave a process
    that runs seconds without a sample, and one that idles has none) surely only for its own
    period, and for the rest of the gap only where the GPU ran more (`estimator.rebalance`)."""
    before = ledger.read_at
    if at_us is not None:
        ledger.read_at = at_us
    reach = -math.inf if before is None else before - estimator.BACK_US
    older = set()
    by_pid: dict[int, list[Life]] = {}
    for each in ledger.lives.values():
        by_pid.setdefault(each.pid, []).append(each)
    for sample in samples:
        life = _holder(by_pid.get(sample.pid, ()), sample.timestamp_us)
        if life is None:
            continue  # of no process known here, or from before the one holding the PID began
        current = ledger.lives.get(ledger.listed.get(sample.pid, (-1, None)))
        born = None if current is None else current.born_us
        if current is not life and born is not None and sample.timestamp_us < born + BORN_SLACK_US:
            older.add(sample.pid)  # the earlier holder's, and given to it
        track = life.samples
        if track and sample.timestamp_us <= track.stamps[-1]:
            continue  # one it has, or older: NVML keeps a process's newest
        # Drivers have been seen to report more than 100 %. A sample within bounds is its own
        # clamp: not made anew for every process at every sweep.
        use = sample.use
        figures = use_figures(use)
        if not all(0.0 <= value <= 1.0 for value in figures):
            use = ProcessUse(*(min(1.0, max(0.0, value)) for value in figures))
        replaced = None
        if track and track.stamps[-1] - track.since[-1] < MIN_SPAN_US and track.stamps[-1] >= reach:
            # Whole percents of a 14.2 s window tell what ran between two samples to 0.14 s:
            # over less than `MIN_SPAN_US`, most of it. The newest stands in for the last where
            # it continues it; back from a gap it is the gap's (in for the last, it stood back
            # to the one before, and its history spread the gap's work over the whole window).
            stamp, replaced = track.stamps[-1], track.since[-1]
            track.pop()
            life.trail = [point for point in life.trail if point.at_us < stamp]
        earlier = track.stamps[-1] if track else -math.inf
        # It stands back to its sample before (a first, to the read before: what its figure's
        # window holds from further back is the agent's start's, not known to be this read's).
        # Its history holds what it ran since as run after the read before (less BACK_US): a
        # sample is read soon after a burst, and spread evenly back over a gap, a bursty
        # process's work would be read into the lag of its next samples, whose figures then
        # read high, and never low again (a figure's increment is no less than 0).
        covers = (reach if earlier == -math.inf else earlier) if replaced is None else replaced
        held = max(earlier, reach) if replaced is None else replaced
        if earlier == -math.inf and life.born_us is not None:
            covers = max(covers, life.born_us)  # its figure's window reaches before it began
            held = max(held, life.born_us)
        # A sample stands at least for its own period (nvml.h: one for a process that had a use
        # in it). A first one that NVML shows only after a read it was stamped BACK_US or more
        # before would stand back to that read, after its own stamp, over no time or less.
        own = sample.timestamp_us - PERIOD_US
        covers, held = min(covers, own), min(held, own)
        unwound = trailing.unwound(life.trail, sample.timestamp_us, use, held, covers)
        if unwound is None:
            continue
        life.trail, use = unwound
        covers = max(covers, sample.timestamp_us - trailing.WINDOW_US)
        # Its first, or it had a sample as new at the read before: it ran on, surely. Else it
        # comes back after a gap: whether it ran all along unstamped or came back from idle, no
        # sample says; only its own period is sure.
        continues = earlier == -math.inf or earlier >= reach
        sure = covers if continues else own
        if not any(figures):
            # Every figure 0: under a whole percent of the window, or none at all (a young
            # context before its first kernel gets such a sample every period: the recordings).
            # What it may have run is placed only where the GPU ran more than the sure figures.
            sure = sample.timestamp_us
        # Newer than every sample it has (above): appended, the samples stay in order.
        track.append(sample.timestamp_us, use, covers, sure)
        if life.until_us is not None and life.until_us < sample.timestamp_us:
            life.until_us = sample.timestamp_us  # it ran at least until its sample's period ended
        if len(track) > SAMPLES_KEPT:
            track.keep_newest(SAMPLES_KEPT)
    return frozenset(older)


def _holder(lives: Sequence[Life], stamp_us: int) -> Life | None:
    """Of the lives of one PID, the one that held it at `stamp_us`."""
    best = None
    for life in lives:
        if life.born_us is not None and stamp_us < life.born_us + BORN_SLACK_US:
            continue
        if life.absent_us is not None and stamp_us > life.absent_us:
            continue
        if best is None or life.since_us > best.since_us:
            best = life
    return best


def unknown(ledger: GpuLedger, pids: frozenset[int]) -> None:
    """The listed processes among `pids` have a use NVML cannot tell (MPS), from now on."""
    for pid in pids:
        key = ledger.listed.get(pid)
        if key is not None and key in ledger.lives:
            ledger.lives[key].unknown = True


def accounted(ledger: GpuLedger, records: Sequence[AccountingRecord]) -> None:
    """NVML's accounting of processes that have ended (nvmlDeviceGetAccountingStats): each
    that no life of its PID overlaps lived between two listings, and becomes a life of no pod,
    without a figure, from its start for as long as its context was active. A record that a
    life overlaps adds nothing to what the looks and samples say of it."""
    by_pid: dict[int, list[Life]] = {}
    for each in ledger.lives.values():
        by_pid.setdefault(each.pid, []).append(each)
    for record in records:
        if record.running or record.seconds <= 0:
            continue  # `time` is 0 until it ends (nvml.h); a running process is listed
        end_us = record.started_us + round(record.seconds * 1e6)
        if any(
            life.since_us <= end_us and (life.until_us is None or life.until_us >= record.started_us)
            for life in by_pid.get(record.pid, ())
        ):
            continue
        unseen = Life(
            record.pid,
            None,
            record.started_us,
            None,
            since_us=record.started_us,
            last_listed_us=end_us,
            until_us=end_us,
            absent_us=end_us,
            unseen=True,
        )
        if unseen.key not in ledger.lives:
            ledger.lives[unseen.key] = unseen
            by_pid.setdefault(record.pid, []).append(unseen)


def close(
    ledger: GpuLedger,
    periods: Sequence[tuple[int, float | None]],
    now_us: int | None = None,
    period_us: int | None = None,
) -> Window:
    """What each life ran over the periods that settle by `now_us` (None: all of them), of
    those read so far (`periods`: each the GPU's own sample, the end of its period on the
    samples' clock and its SM figure, None where the GPU has none), by the estimator; the
    lives that ended before the newest settled period are forgotten afterwards. `period_us`:
    how long each period is; by default, the samples' spacing."""
    newest = ledger.settled_to if ledger.settled_to is not None else -math.inf
    known = {end for end, _ in ledger.pending}
    ledger.pending.extend((end, gpu) for end, gpu in periods if end > newest and end not in known)
    ledger.pending.sort(key=lambda each: each[0])
    del ledger.pending[:-PENDING_KEPT]
    period_us = period_us or _spacing(ledger.pending)
    cut = math.inf
    if now_us is not None:
        waiting = [
            life.samples
            for key in ledger.listed.values()
            if (life := ledger.lives.get(key)) is not None and life.until_us is None and not life.unknown
        ]
        cut = settling.cut(now_us, waiting, [life.samples for life in ledger.lives.values()])
    ripe = [each for each in ledger.pending if each[0] <= cut]
    ledger.pending = [each for each in ledger.pending if each[0] > cut]
    return _settle(ledger, ripe, period_us)


def _settle(ledger: GpuLedger, periods: Sequence[tuple[int, float | None]], period_us: int) -> Window:
    ran: dict[LifeKey, _Ran] = {}
    busy = 0.0
    unattributed = dict.fromkeys(UNATTRIBUTED_REASONS, 0.0)
    seconds = period_us / 1e6
    first = min((end for end, _ in periods), default=0) - period_us
    last = max((end for end, _ in periods), default=0)
    reaching = [life for life in ledger.lives.values() if life.overlap_us(first, last) > 0]
    # A pod with a process whose use NVML cannot tell has no SM figure on the GPU at all.
    blind = {_uid(life) for life in reaching if life.unknown}
    # Each life in the periods it reaches only: on a churning node most live a few periods.
    within, users = _within(periods, period_us, reaching, blind)
    # Periods in a row whose lives and evidence are the same (a sample stands for several)
    # are split at once (`estimator.split_run`), and share their lists of lives.
    runs: list[tuple[list[_Present], list[float]]] = []
    after = False  # whether the period before was split
    for (_, gpu_sm), present in zip(periods, within, strict=True):
        if gpu_sm is None:
            after = False
            continue
        busy += gpu_sm * seconds
        if after and runs[-1][0] == present:
            runs[-1][1].append(gpu_sm)
        else:
            runs.append((present, [gpu_sm]))
        after = True
    split: list[tuple[list[_Present], list[estimator.Present], list[tuple[list[float], dict[str, float]]]]] = []
    rebalanced: list[tuple[list[LifeKey], list[estimator.Evidence], list[float], list[float], dict[str, float]]] = []
    for present, gpus in runs:
        lives = [said for _, _, said in present]
        keys = [key for _, key, _ in present]
        evidence = [said.evidence for said in lives]
        parts = [said.part for said in lives]
        results = estimator.split_run(gpus, lives, tails=False)
        split.append((present, lives, results))
        rebalanced.extend((keys, evidence, parts, shares, left) for shares, left in results)
    # What `rebalance` gives a process of no pod's share is no pod's: counted by its reason, as
    # `split` and `give_tails` count theirs, or the pods and the reasons fall short of the GPU.
    unowned = [
        (nobody, results, [[shares[k] for k, _ in nobody] for shares, _ in results])
        for _, lives, results in split
        if (nobody := [(k, why) for k, said in enumerate(lives) if (why := said.unowned) is not None])
    ]
    estimator.rebalance(rebalanced, ledger.gaps)  # type: ignore[arg-type]
    for nobody, results, before in unowned:
        for (shares, left), was in zip(results, before, strict=True):
            for (k, why), share in zip(nobody, was, strict=True):
                if shares[k] != share:
                    left[why] += shares[k] - share
    for present, lives, results in split:
        estimator.give_tails_run(lives, results)
        for _, left in results:
            for reason, value in left.items():
                unattributed[reason] += value * seconds
        # Each life's sums over the run's periods, in their order: the same additions as
        # period by period, without a call for each.
        for k, (life, key, said) in enumerate(present):
            acc = _ran(ran, key)
            sm = acc.sm
            for shares, _ in results:
                sm += shares[k] * seconds
            acc.sm = sm
            use = _use(life, said)
            if use is not None:
                acc.weigh(use, said.part * seconds, len(results))
    given = sum(acc.sm for acc in ran.values())
    window = Window(
        seconds=seconds * len(periods),
        ran={key: acc.use() for key, acc in ran.items()},
        gpu_busy=busy,
        unexplained=max(0.0, busy - given),
        users=frozenset(users),
        lives={key: ledger.lives[key] for key in ran},
        unattributed=unattributed,
    )
    if periods:
        ledger.settled_to = max(end for end, _ in periods)
        # A gap's periods all end before its sample: settled, what is left of its claim goes.
        ledger.gaps = {key: left for key, left in ledger.gaps.items() if key[1] > ledger.settled_to}
        _forget(ledger, ledger.settled_to)
    return window


def _ran(ran: dict[LifeKey, _Ran], key: LifeKey) -> _Ran:
    """A life's sums over the window, begun where it is first given a share: `Window.ran` keeps
    the order of the periods and lives."""
    acc = ran.get(key)
    if acc is None:
        acc = ran[key] = _Ran()
    return acc


def _use(life: Life, said: estimator.Present) -> ProcessUse | None:
    """The use of the sample that stands for the life in a period; None: no sample does."""
    at = said.evidence.sample
    return life.samples.uses[at] if at is not None else None


_Present = tuple[Life, LifeKey, estimator.Present]
"""A life in one period: who it is, and what the estimator is given of it."""


def _within(
    periods: Sequence[tuple[int, float | None]], period_us: int, reaching: Sequence[Life], blind: set[str]
) -> tuple[list[list[_Present]], set[str]]:
    """Each period's lives, in the order of `reaching`: each life only in the periods it reaches
    (on a churning node most live a few periods), its evidence stepped from one sample's run of
    periods to the next (`estimator.LifeEvidence.run`), and one entry kept while its part and
    evidence hold; and the pods (UIDs, "" for none) of the lives in any period."""
    ends = [end for end, _ in periods]
    within: list[list[_Present]] = [[] for _ in periods]
    users: set[str] = set()
    for life in reaching:
        key = life.key
        since = life.since_us
        until = math.inf if life.until_us is None else life.until_us
        low = bisect.bisect_right(ends, since)
        high = len(ends) if until == math.inf else bisect.bisect_left(ends, until + period_us)
        evidence = estimator.LifeEvidence(life.samples, life.until_us, life.unknown or _uid(life) in blind)
        owner = None if life.owner is None else life.owner.pod_uid
        entry: _Present | None = None
        said = estimator.IDLE
        to = before = -math.inf
        for k in range(low, min(high + 1, len(ends))):
            end_us = ends[k]
            start_us = end_us - period_us
            if since <= start_us and end_us <= until:
                part = 1.0  # lived the whole period: `Life.overlap_us` is the period's length
            else:
                part = max(0.0, min(until, end_us) - max(since, start_us)) / period_us
                if part <= 0:
                    continue
            # A period without the GPU's figure is not split: its lives' evidence is not read.
            if periods[k][1] is None:
                now = estimator.IDLE
            elif end_us <= to and end_us < before:
                now = said  # the same sample, the same samples around: the same evidence
            else:
                said, to, before = evidence.run(start_us, end_us)
                now = said
            if entry is None or entry[2].part != part or entry[2].evidence is not now:
                entry = (life, key, estimator.Present(owner, part, now, life.unseen))
            within[k].append(entry)
        if entry is not None:
            users.add(owner or "")
    return within, users


_SM = USE_FIGURES.index("sm")


class _Ran:
    """What one life ran over a window, added up period by period: its SM seconds, and its
    other figures' weights, kept by the figure they come from (a life's figure is the same
    object over many periods), so that a period costs two additions, not one per figure."""

    __slots__ = ("sm", "weights")

    def __init__(self) -> None:
        self.sm = 0.0
        self.weights: list[tuple[ProcessUse, float]] = []

    def weigh(self, use: ProcessUse, seconds: float, periods: int) -> None:
        """`seconds` of each of `periods` in a row at `use`'s figures, added one at a time."""
        if self.weights and self.weights[-1][0] is use:
            weight = self.weights[-1][1]
        else:
            self.weights.append((use, seconds))
            weight = seconds
            periods -= 1
        for _ in range(periods):
            weight += seconds
        self.weights[-1] = (use, weight)

    def use(self) -> ProcessUse:
        # Each figure summed weight by weight from 0, as `sum` adds: the figures in one pass.
        sums: list[float] = [0] * len(USE_FIGURES)
        for use, weight in self.weights:
            sums = [total + value * weight for total, value in zip(sums, use_figures(use), strict=True)]
        sums[_SM] = self.sm
        return ProcessUse(*sums)


def _uid(life: Life) -> str:
    return life.owner.pod_uid if life.owner is not None else ""


def _spacing(periods: Sequence[tuple[int, float | None]]) -> int:
    stamps = sorted(end for end, _ in periods)
    gaps = [b - a for a, b in itertools.pairwise(stamps) if b > a]
    return min(gaps) if gaps else PERIOD_US


def _forget(ledger: GpuLedger, integrated_us: int) -> None:
    """The lives that can reach no later period, and those of a minute ago, let go."""
    listed = set(ledger.listed.values())
    ledger.lives = {
        key: life
        for key, life in ledger.lives.items()
        if life.until_us is None
        or (life.until_us > integrated_us and life.until_us > integrated_us - FORGET_US)
        or key in listed
    }


def means(window: Window) -> tuple[dict[int, ProcessUse], dict[PodRef, ProcessUse]]:
    """Each listed process's mean use over the window, by PID, and what the processes that
    have ended ran, by pod (those of no pod, or whose use is unknown, left out)."""
    by_pid: dict[int, ProcessUse] = {}
    ended: dict[PodRef, ProcessUse] = {}
    if window.seconds <= 0:
        return by_pid, ended
    for key, ran in window.ran.items():
        life = window.lives.get(key)
        if life is None or life.unknown:
            continue
        use = ProcessUse(*(min(1.0, value / window.seconds) for value in use_figures(ran)))
        if life.until_us is None:
            by_pid[life.pid] = use
        elif life.owner is not None:
            ended[life.owner] = ended.get(life.owner, ProcessUse()).plus(use)
    return by_pid, ended
