"""Every process that touched a GPU, billed what it ran, however short it lived.

NVML keeps one utilization sample per process, its latest, and forgets it when the process
ends (bench/results/h200-nvml-ended-samples.md). A sweep every few seconds would know only
the processes alive at its instant, and a process's latest sample times the whole interval:
a tenant that times its work around the sweeps would shed its bill. So the watch
(collect/watch.py) lists each GPU's processes between sweeps, and this ledger keeps each
process's life on the GPU: when it was first and last listed, its pod as read at first
sight, and every sample taken of it while it lived. At each sweep the GPU's own samples of
the window (one per sample period, 200 ms on an H200) are split among the processes that
lived in each period:

- a period in which the processes of one pod alone lived is that pod's, whole: nothing else
  held a context on the GPU, and a kernel runs only in a context, which NVML lists;
- a period shared by several pods, or with a process of none, is split by each process's
  own figure (its first sample taken at or after the period, else its last before), those
  listed through the period first, scaled down where they add up to more than the GPU ran;
  beside settled figures that hold still, what the GPU ran beyond them is the one pod's
  whose figures swing, since a sample of a swinging figure can be a trough or a crest;
  what they leave goes to the processes younger than `YOUNG_US`, whose NVML figure may not
  have settled, each held to the rise its coming made over what the GPU ran for the other
  pods just before it, and only beside settled figures that hold still; the rest is
  unattributed, never a settled neighbour's;
- a process lived from halfway between the listing that first had it and the one before,
  to halfway between the last listing that had it and the first without it, so that a
  listing's cadence neither adds nor takes on average;
- a process whose use NVML cannot tell (an MPS client, or a server serving several pods)
  gets no figure, and no period it shares is given whole to anyone;
- where an administrator turned NVML's accounting mode on, a process that no listing saw is
  known from its record (`accounted`): a life of no pod, without a figure, over the time the
  record gives, so that no period it ran in is another pod's whole, and what the figures leave
  there is counted as its. Its lifetime figure is not used as its figure: nvml.h calls it
  "utilization stats just like returned by nvmlDeviceGetUtilizationRates but for the life
  time of a process", which may be the device's, and a lifetime's mean says nothing of the
  last window, where a process that idled then ran hard would hide its work.

What no pod is given is counted by its reason (`Window.unattributed`): `no_pod` (a process
of no pod), `unseen` (a period with a process no listing saw, known from accounting alone),
`mps` (a period with a process whose use NVML cannot tell), `unexplained` (what the GPU ran
beyond what its processes' figures say).

Pure: no NVML, no clock; the watch and the sweep bring the listings and samples.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from otel_vgpu.gpu.backend import USE_FIGURES, AccountingRecord, ProcessUse, UtilizationSample
from otel_vgpu.pods.cgroups import PodRef

# NVML's sample period on an H200 (bench/results/h200-nvml-samples.md); a window's own
# spacing of the GPU's samples is used where it has two or more.
PERIOD_US = 200_000
# A sample stamped this soon after a process started is its PID's earlier holder's: NVML
# stamps a sample at the end of its period (bench/results/h200-nvml-samples.md).
BORN_SLACK_US = 200_000
# Samples kept per process: the newest, a minute's worth at the watch's cadence at most.
SAMPLES_KEPT = 64
# A process this young (since it was first listed) has a figure that may not have settled yet:
# NVML smooths it (bench/results/h200-nvml-samples.md); how fast it settles is not measured.
YOUNG_US = 5_000_000
# A settled process's figure holds still when its last samples agree within this: on an H200 a
# busy process's samples read 90-93 % and a bursty one's 6-7 % (bench/results/h200-nvml-samples.md).
STILL_SAMPLES = 5
STILL_SPREAD = 0.15
# What a young process's share is held to: the GPU's figure for the other pods over this long
# before it began; the periods integrated are kept this long for it.
BEFORE_US = 2_000_000
HISTORY_US = YOUNG_US + BEFORE_US
# Lives that ended this long before the newest period integrated are forgotten, whatever
# else: no window reaches that far back.
FORGET_US = 60_000_000

# Why the GPU's SM time went to no pod (the module's docstring says each).
UNATTRIBUTED_REASONS = ("no_pod", "unseen", "mps", "unexplained")

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
    samples: list[tuple[int, ProcessUse]] = field(default_factory=list)
    """Its samples, by stamp, oldest first."""
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

    def figure_at(self, end_us: int, period_us: int) -> ProcessUse | None:
        """Its figure for the period ending at `end_us`: its first sample at or after the
        period, else its last before; None with no sample at all."""
        if not self.samples:
            return None
        at = bisect.bisect_right(self.samples, end_us - period_us, key=lambda sample: sample[0])
        return self.samples[min(at, len(self.samples) - 1)][1]


@dataclass(slots=True)
class GpuLedger:
    """The lives of one GPU's processes not yet integrated to their end."""

    lives: dict[LifeKey, Life] = field(default_factory=dict)
    listed: dict[int, LifeKey] = field(default_factory=dict)
    """By PID: the life each PID of the last listing is."""
    listed_at: int | None = None
    """When it was last listed, on the samples' clock."""
    history: list[tuple[int, float, dict[str, float], frozenset[str]]] = field(default_factory=list)
    """The periods integrated in the last `HISTORY_US`: each one's end, the GPU's figure, what
    each pod (UID, "" for none) was given of it, and the pods with a young process in it: what
    a young process's share is held to."""


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
            last_sample = gone.samples[-1][0] if gone.samples else -math.inf
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


def sampled(ledger: GpuLedger, samples: Sequence[UtilizationSample]) -> frozenset[int]:
    """Each sample given to the life that held its PID when it was taken; the PIDs listed now
    whose sample is older than the process holding them (an earlier holder's, never theirs)."""
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
        if any(stamp == sample.timestamp_us for stamp, _ in life.samples):
            continue
        # Drivers have been seen to report more than 100 %.
        use = ProcessUse(**{f: min(1.0, max(0.0, getattr(sample.use, f))) for f in USE_FIGURES})
        life.samples.append((sample.timestamp_us, use))
        if life.until_us is not None and life.until_us < sample.timestamp_us:
            life.until_us = sample.timestamp_us  # it ran at least until its sample's period ended
        life.samples.sort(key=lambda s: s[0])
        del life.samples[:-SAMPLES_KEPT]
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


def close(ledger: GpuLedger, periods: Sequence[tuple[int, float | None]], period_us: int | None = None) -> Window:
    """What each life ran over `periods` (each the GPU's own sample: the end of its period on
    the samples' clock, and its SM figure, None where the GPU has none), by the module's
    rules; the lives that ended before the last period are forgotten afterwards. `period_us`:
    how long each period is; by default, the samples' spacing."""
    period_us = period_us or _spacing(periods)
    ran: dict[LifeKey, _Ran] = {}
    busy = 0.0
    given = 0.0
    users: set[str] = set()
    unattributed = dict.fromkeys(UNATTRIBUTED_REASONS, 0.0)
    seconds = period_us / 1e6
    # The lives that reach into the window at all, once, rather than every life every period.
    first = min((end for end, _ in periods), default=0) - period_us
    last = max((end for end, _ in periods), default=0)
    reaching = [life for life in ledger.lives.values() if life.overlap_us(first, last) > 0]
    # Whether each life's figure holds still: its samples do not change while the window closes.
    still = {life.key: _holds_still(life) for life in reaching}
    for end_us, gpu_sm in periods:
        start_us = end_us - period_us
        present = [(life, life.overlap_us(start_us, end_us) / period_us) for life in reaching]
        present = [(life, part) for life, part in present if part > 0]
        if gpu_sm is not None:
            busy += gpu_sm * seconds
        if not present:
            if gpu_sm:
                unattributed["unexplained"] += gpu_sm * seconds
            continue
        owners = {life.owner.pod_uid if life.owner is not None else "" for life, _ in present}
        users |= owners
        figures = [(life, part, None if life.unknown else life.figure_at(end_us, period_us)) for life, part in present]
        alone = len(owners) == 1 and "" not in owners and not any(life.unknown for life, _ in present)
        sms = _split(
            figures, gpu_sm, alone, start_us, end_us, lambda life: _others_before(ledger, life), still.__getitem__
        )
        by_owner: dict[str, float] = {}
        if gpu_sm is not None:
            young = frozenset(_uid(life) for life, _ in present if end_us - life.since_us < YOUNG_US)
            ledger.history.append((end_us, gpu_sm, by_owner, young))
        unknown_here = unseen_here = False
        for (life, part, use), sm in zip(figures, sms, strict=True):
            uid = _uid(life)
            by_owner[uid] = by_owner.get(uid, 0.0) + sm
            acc = ran.get(life.key)
            if acc is None:
                acc = ran[life.key] = _Ran()
            acc.add(sm * seconds, use, part * seconds)
            given += sm * seconds
            unknown_here |= life.unknown
            unseen_here |= life.unseen
            if life.unknown:
                unattributed["mps"] += sm * seconds
            elif life.owner is None:
                unattributed["unseen" if life.unseen else "no_pod"] += sm * seconds
        if gpu_sm is not None:
            left = max(0.0, gpu_sm - sum(sms)) * seconds
            unattributed["mps" if unknown_here else "unseen" if unseen_here else "unexplained"] += left
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
        newest = max(end for end, _ in periods)
        _forget(ledger, newest)
        ledger.history = [h for h in ledger.history if h[0] > newest - HISTORY_US]
    return window


class _Ran:
    """What one life ran over a window, added up period by period: its SM seconds, and its
    other figures' weights, kept by the figure they come from (a life's figure is the same
    object over many periods), so that a period costs two additions, not one per figure."""

    __slots__ = ("sm", "weights")

    def __init__(self) -> None:
        self.sm = 0.0
        self.weights: list[tuple[ProcessUse, float]] = []

    def add(self, sm_seconds: float, use: ProcessUse | None, seconds: float) -> None:
        self.sm += sm_seconds
        if use is None:
            return
        if self.weights and self.weights[-1][0] is use:
            self.weights[-1] = (use, self.weights[-1][1] + seconds)
        else:
            self.weights.append((use, seconds))

    def use(self) -> ProcessUse:
        figures = {f: sum(getattr(u, f) * w for u, w in self.weights) for f in USE_FIGURES if f != "sm"}
        return ProcessUse(sm=self.sm, **figures)


def _others_before(ledger: GpuLedger, life: Life) -> float | None:
    """What the GPU ran for others than `life`'s pod just before `life` began: the mean, over
    the periods of the last `BEFORE_US` before it, of the GPU's figure less what its pod was
    given, and less what no one was given where the pod had a young process then (a pod that
    restarts its processes back to back: what its predecessor's figure left was its own, and
    counted for the others it would hold each successor lower and lower); None where no
    period was integrated then (the agent had just started)."""
    uid = life.owner.pod_uid if life.owner is not None else ""
    before = [
        gpu_sm - given.get(uid, 0.0) - (max(0.0, gpu_sm - sum(given.values())) if uid in young else 0.0)
        for end, gpu_sm, given, young in ledger.history
        if life.since_us - BEFORE_US < end <= life.since_us
    ]
    return sum(before) / len(before) if before else None


def _split(
    figures: Sequence[tuple[Life, float, ProcessUse | None]],
    gpu_sm: float | None,
    alone: bool,
    start_us: int,
    end_us: int,
    others_before: Callable[[Life], float | None] = lambda life: None,
    is_still: Callable[[LifeKey], bool] | None = None,
) -> list[float]:
    """The GPU's SM over one period, split among the lives present in it (`figures`: each
    life, the part of the period it lived, its figure), by the module's rules. A life listed
    at both ends of the period is sure to have run through it; one whose presence rests on
    the halfway rule alone comes second, with what the sure ones leave. Each tier is scaled
    down where it wants more than is left. What the GPU ran beyond goes to the lives at an
    edge (up to their figure over the whole period), then to the young ones (up to the whole
    of the period they lived); no life older than `YOUNG_US`, whose figure has settled, is
    given more than its figure says it ran."""
    wanted = [part * use.sm if use is not None else 0.0 for _, part, use in figures]
    if gpu_sm is None:
        return wanted
    if alone:
        # One pod's processes alone: the GPU's period is theirs, split by presence.
        presence = sum(part for _, part, _ in figures)
        return [gpu_sm * part / presence for _, part, _ in figures]
    holds_still = (lambda life: is_still(life.key)) if is_still is not None else _holds_still
    swinging = _swinging(figures, end_us, holds_still)
    if swinging:
        # Beside settled figures that hold still, a figure that swings from sample to sample is
        # the one a sample can have caught at a trough or a crest: the GPU's period beyond what
        # the still ones read is its pod's, each of its lives up to the part it lived. A trough
        # timed at the sweeps sheds nothing, and a crest takes nothing from a neighbour.
        read = sum(w for k, w in enumerate(wanted) if k not in swinging)
        if read <= gpu_sm:
            presence = sum(figures[k][1] for k in swinging)
            given = list(wanted)
            for k in swinging:
                life, part, _ = figures[k]
                # Never past the most its own recent samples read: what is beyond that may be a
                # still neighbour's, read low, as well as its own.
                given[k] = min(part * _highest(life), (gpu_sm - read) * part / presence)
            return given
    # A process known from accounting alone comes second: what the looks saw was measured beside
    # it, and it gets what their figures leave, up to its own.
    sure = [life.since_us <= start_us and life.last_listed_us >= end_us and not life.unseen for life, _, _ in figures]
    given = list(wanted)
    left = gpu_sm
    for tier in (True, False):
        tier_wanted = sum(w for w, s in zip(wanted, sure, strict=True) if s is tier)
        scale = 1.0 if tier_wanted <= left else left / tier_wanted
        for k, is_sure in enumerate(sure):
            if is_sure is tier:
                given[k] = wanted[k] * scale
        left = max(0.0, left - tier_wanted * scale)
    # What the GPU ran beyond: first to the lives at an edge, up to their figure over the whole
    # period (a listing's cadence can have cut their presence short); the rest is unexplained.
    room = [
        (part and use.sm * (1.0 - part)) if use is not None and not is_sure else 0.0
        for (_, part, use), is_sure in zip(figures, sure, strict=True)
    ]
    if left > 0 and sum(room) > 0:
        scale = min(1.0, left / sum(room))
        given = [g + r * scale for g, r in zip(given, room, strict=True)]
        left = max(0.0, left - sum(room) * scale)
    # The rest to the young lives, up to the whole of the part they lived: NVML smooths a
    # process's figure, so one just begun reads below what it runs (on an H200, fresh 1 s
    # processes beside a steady pod were billed half their work without this, and 1.05 of it
    # with it: bench/results/h200-tenant-restarts.md). A settled figure stands as read.
    # Each is held to what the GPU ran beyond what it ran for the other pods just before the
    # process began: a young process is given the rise its coming made, never a neighbour's
    # figure that reads low (a bursty pod's, say) beside it.
    if left <= 0:
        return given
    young = [k for k, (life, _, _) in enumerate(figures) if end_us - life.since_us < YOUNG_US]
    # Only beside settled lives whose figures hold still or read at their crest: where one
    # swings and reads below its recent high, what the figures leave may be its own, read at a
    # trough, as well as a young one's. One at its crest hides nothing below it: on an H200 a
    # time-sliced process's figure rises while a neighbour runs beside it, to 4.5 times the
    # work it does then (bench/results/h200-shared-samples.md), and held to that rise the
    # young neighbour was billed 0.65 of its work (h200-restarts-holds.md).
    is_young = set(young)
    steady = all(
        holds_still(life) or _at_crest(life, use)
        for k, (life, _, use) in enumerate(figures)
        if k not in is_young and not life.unknown
    )
    if young and steady:
        mine: dict[str, float] = {}
        for (life, _, _), g in zip(figures, given, strict=True):
            mine[_uid(life)] = mine.get(_uid(life), 0.0) + g
        befores: dict[tuple[str, float], float | None] = {}
        room = []
        for k in young:
            life, part, _ = figures[k]
            uid = _uid(life)
            if (uid, life.since_us) not in befores:  # a churning pod's processes come together
                befores[uid, life.since_us] = others_before(life)
            before = befores[uid, life.since_us]
            rise = 0.0 if before is None else max(0.0, gpu_sm - before - mine[uid])
            room.append(max(0.0, min(part - given[k], rise)))
        if sum(room) > 0:
            scale = min(1.0, left / sum(room))
            for k, r in zip(young, room, strict=True):
                given[k] += r * scale
    return given


def _swinging(
    figures: Sequence[tuple[Life, float, ProcessUse | None]], end_us: int, holds_still: Callable[[Life], bool]
) -> frozenset[int]:
    """The lives (by position) whose figures swing, where they are all of one pod and every
    other life is of a pod, settled, with a figure that holds still; else none. Any process of
    no pod, of unknown use, without a figure, or young in another pod, and what the figures
    leave may be its: the rule is off."""
    swinging = set()
    pods = set()
    for k, (life, _, use) in enumerate(figures):
        if use is None or life.unknown or life.owner is None:
            return frozenset()
        if not holds_still(life):
            swinging.add(k)
            pods.add(life.owner.pod_uid)
    if len(pods) != 1:
        return frozenset()
    (pod,) = pods
    for k, (life, _, _) in enumerate(figures):
        young = end_us - life.since_us < YOUNG_US
        if k not in swinging and young and _uid(life) != pod:
            return frozenset()
    return frozenset(swinging)


def _highest(life: Life) -> float:
    """The highest of a life's last few samples' SM figures."""
    return max((use.sm for _, use in life.samples[-STILL_SAMPLES:]), default=0.0)


def _at_crest(life: Life, use: ProcessUse | None) -> bool:
    """Whether the figure a period used is within `STILL_SPREAD` of the life's recent high."""
    return use is not None and use.sm >= _highest(life) - STILL_SPREAD


def _holds_still(life: Life) -> bool:
    """Whether a life's last few samples agree within `STILL_SPREAD` (one with none is idle)."""
    recent = [use.sm for _, use in life.samples[-STILL_SAMPLES:]]
    return not recent or max(recent) - min(recent) <= STILL_SPREAD


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
        use = ProcessUse(**{f: min(1.0, getattr(ran, f) / window.seconds) for f in USE_FIGURES})
        if life.until_us is None:
            by_pid[life.pid] = use
        elif life.owner is not None:
            ended[life.owner] = ended.get(life.owner, ProcessUse()).plus(use)
    return by_pid, ended
