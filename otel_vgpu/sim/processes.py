"""Who runs on the simulated node at any scenario time: the scenario's pods' processes, the
churning pods' and the host's, each with its PID, start time, cgroup and what it uses of its
GPU's engines over time.

PIDs and start times are as a kernel would give them: a restarted container's process gets a
fresh PID, churning pods' PIDs wrap (so that PIDs are reused, told apart by start time), and
the pods that stay started before the scenario, each at its own moment.
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import zlib
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

from otel_vgpu.gpu.backend import ENGINES, ProcessUse
from otel_vgpu.sim.proc_tree import cgroup_file, cgroup_text, container_id, start_ticks
from otel_vgpu.sim.scenario import CgroupSpec, PodSpec, ProcessSpec, Scenario, Wave

_FIRST_PID = 4000
# A pod that does not come and go started this long before the scenario began: its processes
# have samples from the first sweep on.
STARTED_BEFORE_S = 60.0
_CHURN_FIRST_PID = 100_000
# The PIDs of the processes of pods that restart them (`restarts`), under Linux's default
# pid_max (4,194,304 on 64-bit).
_RESTARTED_FIRST_PID = 1_000_000
_RESTARTED_PIDS = 3_000_000
# Churning pods whose processes are kept made, in live pods' worth (`Workload._churn_processes`).
CHURNED_KEPT = 4
# The versions of each process `Workload.at` keeps as made (its memory, start or cycle apart).
_MADE_PER_PROCESS = 4
_CHURN_PIDS = 50_000


@dataclass(frozen=True, slots=True)
class Process:
    """One process on the simulated node: what /proc says of it, and what it runs over time."""

    pid: int
    start_time: int
    """Clock ticks after the node's boot, as /proc/<pid>/stat's field 22."""
    gpu: int
    memory: int
    sm: Callable[[float], float]
    cgroup: str
    mig: str | None = None
    command: str = "python3"
    engines: dict[str, Callable[[float], float]] = field(default_factory=dict)
    """Its use of each other engine over time, 0-1; absent: none."""
    mps: str = ""
    """server or client: its part in MPS, as the driver knows it."""
    starts_at: float = -math.inf
    """Scenario time it started: it has no sample from before."""
    ends_at: float = math.inf
    """Scenario time it ends: its last sample is from before, and NVML keeps it a while."""
    pipes: dict[str, Callable[[float], float]] = field(default_factory=dict)
    """What it keeps busy of the tensor cores and DRAM over time, 0-1 (GPM's figures)."""
    dodges_ticks: bool = False
    """It times its kernels to miss the driver's ticks (`stamped_in`)."""

    def wave(self, figure: str) -> Callable[[float], float]:
        """Its use of `figure` (SM, one of `ENGINES`, or of `PIPES`) over time."""
        if figure == "sm":
            return self.sm
        return self.engines.get(figure) or self.pipes.get(figure, _IDLE)


class Workload:
    """The processes of a scenario at any time (`at`); a churning pod's are made once while
    the pod is among the newest (`_churn_processes`)."""

    def __init__(self) -> None:
        self._churned: dict[int, tuple[Process, ...]] = {}
        """The churning pods' processes, by pod index, the newest pods' (`_churn_processes`)."""
        self._churned_lock = threading.Lock()
        """The sweep and the health readers ask on their own threads: one trimming `_churned`
        while another adds to it failed a health read ("dictionary changed size during iteration")."""
        self._made: dict[tuple[object, ...], tuple[Scenario, Process]] = {}
        """The pods' processes as made, by what makes each differ over time (`at`): each period,
        listing and sample asks for every process again, and making 3,200 anew each time was
        most of a sweep of the simulated 8-GPU node (tests/unit/export/test_telemetry.py). Each
        holds its scenario, so that no other scenario takes its `id` while it is kept."""
        self._pods_made: dict[tuple[object, ...], tuple[Scenario, tuple[Process, ...]]] = {}
        """Each pod's processes as made, by what makes them differ over time: a node of 3,200
        processes asked for them every period spent most of its look-up on `_made`'s keys."""

    def at(self, scenario: Scenario, t: float) -> list[Process]:
        """The processes at scenario time `t`, ended ones aside."""
        processes: list[Process] = []
        pid = _FIRST_PID
        # A few of each process's versions at most: one whose memory waves is another each time.
        if (
            len(self._made) > _MADE_PER_PROCESS * sum(len(pod.processes) for pod in scenario.pods) + 64
            or len(self._pods_made) > _MADE_PER_PROCESS * len(scenario.pods) + 64
        ):
            self._made.clear()
            self._pods_made.clear()
        for pod in scenario.pods:
            first = pid
            pid += len(pod.processes)
            # A pod that has ended runs nothing, whatever the kubelet still lists.
            if not pod.processes or not pod.running(t) or pod.phase in ("Succeeded", "Failed"):
                continue
            # Pods that stay started before the scenario, each at its own moment, as on a node.
            started = pod.started(t) if pod.period_s is not None else -STARTED_BEFORE_S - _jitter(pod.uid)
            cycle = pod.cycle(t) if pod.restarts else 0
            ends = pod.ends(t)
            memories = tuple(int(max(0.0, spec.memory.at(t))) for spec in pod.processes)
            # The pod's processes as last made while all of these hold, else each process's.
            pod_key = (id(scenario), first, started, memories, cycle, ends)
            kept = self._pods_made.get(pod_key)
            if kept is None or kept[0] is not scenario:
                made = tuple(
                    self._process(scenario, pod, spec, first + offset, (started, memory, cycle, ends))
                    for offset, (spec, memory) in enumerate(zip(pod.processes, memories, strict=True), start=1)
                )
                kept = self._pods_made[pod_key] = (scenario, made)
            processes.extend(kept[1])
        processes.extend(self._churn_at(scenario, t))
        for host in scenario.host_processes:
            pid += 1
            processes.append(
                Process(
                    pid=pid,
                    start_time=10,
                    gpu=host.gpu,
                    memory=int(max(0.0, host.memory.at(t))),
                    sm=_clamped(host.sm),
                    cgroup=host.cgroup + "\n",
                    command=host.command,
                    engines={engine: _clamped(wave) for engine, wave in host.engines.items()},
                    mps=host.mps,
                    pipes={pipe: _clamped(wave) for pipe, wave in host.pipes.items()},
                )
            )
        return processes

    def _process(
        self, scenario: Scenario, pod: PodSpec, spec: ProcessSpec, pid: int, state: tuple[float, int, int, float]
    ) -> Process:
        """Process `pid` of `pod` from its `spec`, in `state` (started, memory, cycle, ends): as
        made before while these hold, the same object."""
        started, memory, cycle, ends = state
        key = (id(scenario), pid, *state)
        kept = self._made.get(key)
        if kept is not None and kept[0] is scenario:
            return kept[1]
        cid = container_id(pod, spec.container)
        gpu = scenario.gpus[spec.gpu]
        if spec.pid is not None:
            own_pid = spec.pid
        elif pod.restarts:
            # A restarted container's process is a new process to the kernel, which
            # hands out the next free PID: fresh PIDs, cycle by cycle.
            own_pid = _RESTARTED_FIRST_PID + (cycle * 1000 + pid - _FIRST_PID) % _RESTARTED_PIDS
        else:
            own_pid = pid
        made = Process(
            pid=own_pid,
            # A new cycle of a coming-and-going pod, or another pod,
            # may reuse the PID; like a real one, its start time differs.
            start_time=start_ticks(started),
            gpu=spec.gpu,
            memory=memory,
            sm=_clamped(spec.sm),
            cgroup=cgroup_file(pod.cgroup, pod.uid, cid, spec.nested),
            mig=None if spec.mig is None else gpu.migs[spec.mig].uuid,
            command=spec.command,
            engines={engine: _clamped(wave) for engine, wave in spec.engines.items()},
            mps=spec.mps,
            starts_at=started,
            ends_at=ends,
            pipes={pipe: _clamped(wave) for pipe, wave in spec.pipes.items()},
            dodges_ticks=spec.dodges_ticks,
        )
        self._made[key] = (scenario, made)
        return made

    def _churn_at(self, scenario: Scenario, t: float) -> list[Process]:
        churn = scenario.churn
        if churn is None:
            return []
        return [process for index in churn_pods(scenario, t) for process in self._churn_processes(scenario, index)]

    def _churn_processes(self, scenario: Scenario, index: int) -> tuple[Process, ...]:
        """Churning pod `index`'s processes, made once while the pod is among the newest: each
        period, listing and sample asks for the live pods' processes again."""
        with self._churned_lock:
            made = self._churned.get(index)
            if made is not None:
                return made
        churn = scenario.churn
        assert churn is not None
        pod = churn_pod(index)
        cgroup = cgroup_text(pod.cgroup, pod.uid, container_id(pod, "main"))
        gpus = len(scenario.gpus)
        made = tuple(
            Process(
                # PIDs wrap as on a real node, so reuse happens; the
                # start time tells the processes apart.
                pid=_CHURN_FIRST_PID + (index * churn.processes + k) % _CHURN_PIDS,
                start_time=start_ticks(index * churn.lifetime_s / churn.live) + k,
                starts_at=index * churn.lifetime_s / churn.live,
                gpu=(index + k) % gpus,
                memory=churn.memory,
                sm=_CHURN_SM,
                cgroup=cgroup,
            )
            for k in range(churn.processes)
        )
        with self._churned_lock:
            made = self._churned.setdefault(index, made)
            while len(self._churned) > CHURNED_KEPT * churn.live:
                del self._churned[next(iter(self._churned))]
        return made


def whole_percent(fraction: float) -> float:
    """A figure as NVML gives it: whole percent, rounded down (with a hair of room for the
    binary fractions that a sum of periods makes of an exact percent)."""
    return math.floor(fraction * 100 + 1e-9) / 100


def churn_pods(scenario: Scenario, t: float) -> range:
    """Indexes of the churning pods alive at scenario time `t`."""
    churn = scenario.churn
    if churn is None:
        return range(0)
    # One new pod every lifetime/live seconds; each lives lifetime_s.
    newest = int(t * churn.live / churn.lifetime_s)
    return range(max(0, newest - churn.live + 1), min(churn.pods, newest + 1))


def churn_pod(index: int) -> PodSpec:
    """Churning pod `index`: its namespace, name, UID and cgroup layout, from the index alone."""
    return PodSpec(
        namespace=f"churn-{index % 10}",
        name=f"job-{index}",
        uid=f"{index:08x}-c0de-4000-8000-{index:012x}",
        cgroup=CgroupSpec(version=1 + index % 2, driver=("systemd", "cgroupfs")[index % 2]),
        processes=(),
    )


def _jitter(uid: str) -> float:
    """A pod's own moment in a thousand seconds, to the clock tick, the same every run."""
    return zlib.crc32(uid.encode()) % 100_000 / 100


def _constant(value: float) -> Callable[[float], float]:
    return lambda t: value


_IDLE = _constant(0.0)
_CHURN_SM = _constant(0.01)


def uses(processes: Sequence[Process], t: float) -> list[ProcessUse]:
    """Each process's use of its GPU at `t`, each figure shared out by `shares`."""
    engines = {engine for p in processes for engine in p.engines}
    if not engines:
        # SM alone, as most processes use: a period of a node of 3,200 asks this of each.
        return [ProcessUse(sm) for sm in shares([p.sm for p in processes], t)]
    used = ("sm", *(e for e in ENGINES if e in engines))
    by_figure = {figure: shares([p.wave(figure) for p in processes], t) for figure in used}
    return [ProcessUse(**{figure: by_figure[figure][k] for figure in used}) for k in range(len(processes))]


def summed(uses: Sequence[ProcessUse]) -> ProcessUse:
    """The uses added up: an MPS server's sample holds its clients' and its own."""
    total = ProcessUse()
    for use in uses:
        total = total.plus(use)
    return total


def own_uses(alive: list[Process], t: float) -> dict[tuple[int, int], ProcessUse]:
    """Each process's use of its GPU at `t` by (PID, start time): an MPS server its clients'
    and its own, a client none of its own."""
    if not alive:
        return {}
    used = uses(alive, t)
    clients = summed([u for p, u in zip(alive, used, strict=True) if p.mps == "client"])
    return {
        (process.pid, process.start_time): summed([own, clients]) if process.mps == "server" else own
        for process, own in zip(alive, used, strict=True)
        if process.mps != "client"
    }


def busy(processes: Sequence[Process], figure: str, t: float, used: Container[str]) -> float:
    """What one GPU's `processes` used together of `figure` at `t`, at most all of it; one that
    no process of the node uses (not in `used`) is 0 without asking each process."""
    wanted = shares([p.wave(figure) for p in processes], t) if figure in used else [0.0] * len(processes)
    return min(1.0, sum(wanted))


def shares(waves: Sequence[Callable[[float], float]], t: float) -> list[float]:
    """The processes' use of one engine of a GPU (its SMs, or another) at `t`. A GPU has all
    of the engine to give and no more: where the scenario asks for more in all, time-slicing
    shares it, as `time_sliced` says."""
    wanted = [wave(t) for wave in waves]
    return wanted if sum(wanted) <= 1.0 else time_sliced(wanted)


def _gauss_legendre(points: int) -> tuple[list[float], list[float]]:
    """Gauss-Legendre's points and weights on [0, 1] (Newton's method on the Legendre polynomial)."""
    nodes, weights = [], []
    for i in range(1, points + 1):
        x = math.cos(math.pi * (i - 0.25) / (points + 0.5))
        for _ in range(100):
            before, here = 1.0, x
            for k in range(2, points + 1):
                before, here = here, ((2 * k - 1) * x * here - (k - 1) * before) / k
            slope = points * (x * here - before) / (x * x - 1)
            step = here / slope
            x -= step
            if abs(step) < 1e-15:
                break
        nodes.append((x + 1) / 2)
        weights.append(1 / ((1 - x * x) * slope * slope))
    return nodes, weights


_NODES, _WEIGHTS = _gauss_legendre(16)


def time_sliced(wanted: Sequence[float]) -> list[float]:
    """What each process gets of an engine that the processes together ask more of than it has
    (`wanted`, each the part of the time it has work queued, 0-1): the driver runs one context
    at a time, a slice each in turn, so a process gets the engine alone while no other has
    work queued, and a half of it beside one other, a third beside two. Each process's
    bursts fall at its own moments, so another is queued beside it for that one's part of
    the time: its use is its part times the mean of 1 / (1 + others queued), scaled so that
    the engine's whole is given.

    This is what the recordings show (tests/data/nvml-recordings/, docs/nvml-sampling.md): a
    process running 30 % of every 100 ms beside a busy one did 0.132 of the two's work, where
    a split in proportion to what each asked gives it 0.23; this model gives 0.15. Below the
    engine's whole the simulated driver gives each what it asks (the recordings' 20 % + 40 %
    did 0.435 where they asked 0.6: where bursts meet they wait too, which is not modelled)."""
    # The mean of 1 / (1 + others queued) is the integral over [0, 1] of the product of each
    # other's (1 - part + part x): a polynomial of degree one less than the processes, which
    # Gauss-Legendre's 16 points give exactly up to 32 processes and to rounding beyond. Worked
    # out over every subset of others queued it grew with the cube of the processes: 0.36 s a
    # period on a GPU of 192, and a node of 384 pods stopped answering scrapes.
    everyone = [math.prod([1 - part + part * x for part in wanted]) for x in _NODES]
    # Worked out once per part asked: a GPU of 192 processes asking the same is one sum, not 192.
    each = {
        part: part
        * sum(w * whole / (1 - part + part * x) for x, w, whole in zip(_NODES, _WEIGHTS, everyone, strict=True))
        for part in set(wanted)
    }
    raw = [each[part] for part in wanted]
    total = sum(raw)
    return [v / total for v in raw] if total > 0 else list(wanted)


DODGE_MARGIN_US = 25_000
"""How far from each tick a process that dodges the ticks keeps its kernels (the recorder's
`tick-dodging`, bench/gpu_record_sampling.py)."""
DODGE_MOST = 0.75
"""The most of a period such a process can run: the driver's 200 ms period (sim/node.py
SAMPLE_PERIOD_US) less `DODGE_MARGIN_US` each side of its tick. One that asks more is on the
GPU at the ticks, as any other."""


def stamped_in(
    index: int,
    stamp: int,
    used: dict[tuple[int, int], ProcessUse],
    seed: int = 0,
    rhythm_us: int = 0,
    dodging: frozenset[tuple[int, int]] = frozenset(),
) -> tuple[int, int] | None:
    """The one process of those that ran SM in the period ending at `stamp` that the driver
    gives a new sample for it. The recordings show about one new sample a period on a GPU,
    whatever ran (31-35 in 30 periods for one, two or three processes: docs/nvml-sampling.md),
    shared among the processes about as they shared the GPU (a busy one beside one running
    30 % of every 100 ms: 25 and 7): the driver's pick is drawn in proportion to each one's use
    of the period, the same draw for a GPU and period every time it is asked (and `seed`).
    With `rhythm_us`, as the recordings show it picks: the one on the GPU at the tick.

    A process in `dodging` that asks at most `DODGE_MOST` of the period keeps its kernels off the
    GPU at every tick, ending them `DODGE_MARGIN_US` before it: at the tick rule it is never the
    one on the GPU, and is given the sample where none is and it ran last (its neighbour off the
    GPU since before); drawn by use, it is drawn only where it alone ran (what the tick rule
    gives it beside a process on the GPU at the tick, as the recordings' was)."""
    ran = [(key, use.sm) for key, use in sorted(used.items()) if use.sm > 0]
    if len(ran) <= 1:
        return ran[0][0] if ran else None
    if rhythm_us <= 0 and dodging:
        ran = [(key, sm) for key, sm in ran if key not in dodging or sm > DODGE_MOST] or ran
    if rhythm_us > 0:
        # What the recordings show the driver does (docs/nvml-sampling.md): the sample goes to
        # the process on the GPU at the tick, or where none is, to the last one that was. Each
        # runs its use as kernels at the start of every `rhythm_us`, at a phase of its own (its
        # PID and start); a rhythm that divides the period keeps its phase to the ticks, so the
        # same process is on at every tick.
        into = [(key, sm, _at_tick(key, sm, stamp, rhythm_us, seed, key in dodging)) for key, sm in ran]
        on = [(key, sm) for key, sm, at in into if at < sm * rhythm_us]
        if len(on) == 1:
            return on[0][0]
        if not on:
            return min(into, key=lambda each: each[2] - each[1] * rhythm_us)[0]
        ran = on
    # A draw of its own for each GPU and period: a CRC of the two was tried, and its draws for
    # nearby periods were far from independent (a bursting pod went without a sample for
    # whole bursts of five periods, twice in three).
    draw = random.Random(f"{index}:{stamp}" if seed == 0 else f"{seed}:{index}:{stamp}").random()
    draw *= sum(sm for _, sm in ran)
    for key, sm in ran:
        draw -= sm
        if draw < 0:
            return key
    return ran[-1][0]


class Picks:
    """Which process the driver gives each period's sample on GPU `index` (`stamped_in`), asked
    once a period however many samples' windows reach it, and what it credits each process with."""

    def __init__(
        self,
        index: int,
        uses: Callable[[int], dict[tuple[int, int], ProcessUse]],
        seed: int,
        rhythm_us: int,
        dodging: Callable[[int], frozenset[tuple[int, int]]] = lambda stamp: frozenset(),
    ) -> None:
        """`dodging`: the processes that dodge the ticks among those that ran in the period
        ending at a stamp."""
        self._index, self._uses, self._seed, self._rhythm_us = index, uses, seed, rhythm_us
        self._dodging = dodging
        self._taken: dict[int, tuple[int, int] | None] = {}

    def taker(self, stamp: int) -> tuple[int, int] | None:
        if stamp not in self._taken:
            self._taken[stamp] = stamped_in(
                self._index, stamp, self._uses(stamp), self._seed, self._rhythm_us, self._dodging(stamp)
            )
        return self._taken[stamp]

    def credited(self, key: tuple[int, int], stamp: int, own: ProcessUse) -> ProcessUse:
        """What process `key` is credited with in the period ending at `stamp`: its own use, or
        where the processes keep a rhythm, as the recordings show, the taker every process's SM
        of the period and the rest none (test_nvml_recordings.py,
        `test_a_time_sliced_process_s_figure_is_the_gpu_s_not_its_own`); its other figures its own."""
        if not self._rhythm_us:
            return own
        period = sum(use.sm for use in self._uses(stamp).values())
        return dataclasses.replace(own, sm=min(1.0, period) if self.taker(stamp) == key else 0.0)


def dodgers(
    scenario: Scenario, alive: Callable[[int], Sequence[Process]], index: int
) -> Callable[[int], frozenset[tuple[int, int]]]:
    """The processes of GPU `index` that dodge the ticks among those `alive` in the period
    ending at a stamp: asked of that period's, so that one that has ended since still dodges in
    its kept periods (none where the scenario has no such process)."""
    if not any(spec.dodges_ticks for pod in scenario.pods for spec in pod.processes):
        return lambda stamp: frozenset()
    return lambda stamp: frozenset((p.pid, p.start_time) for p in alive(stamp) if p.gpu == index and p.dodges_ticks)


def _at_tick(key: tuple[int, int], sm: float, stamp: int, rhythm_us: int, seed: int, dodges: bool) -> float:
    """Where in its rhythm a process is at the tick `stamp`: at its own phase, or dodging the
    ticks, its kernels ended `DODGE_MARGIN_US` before (off the GPU: past its use of the rhythm)."""
    if dodges and sm <= DODGE_MOST:
        return sm * rhythm_us + DODGE_MARGIN_US
    return (stamp + _phase(key, rhythm_us, seed)) % rhythm_us


def _phase(key: tuple[int, int], rhythm_us: int, seed: int) -> int:
    """Where in its rhythm a process's kernels start, the same every time it is asked."""
    return random.Random(f"{seed}:{key[0]}:{key[1]}").randrange(rhythm_us)


def _clamped(wave: Wave) -> Callable[[float], float]:
    if wave.amplitude == 0.0 and wave.on_s is None:
        # A steady figure is worked out once: a period of a node of 3,200 processes asks each.
        steady = _clamp(wave.mean)
        return lambda t: steady
    at = wave.at
    return lambda t: _clamp(at(t))


def _clamp(v: float) -> float:
    return min(1.0, max(0.0, v)) if math.isfinite(v) else 0.0
