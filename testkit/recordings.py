"""The recordings of the real driver (tests/data/nvml-recordings, made by
bench/gpu_record_sampling.py on an H100 with driver 580): loaded as plain data, with each process's own truth,
for the tests, the simulated driver's checks, the replay backend and the bill's evaluation."""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from otel_vgpu.collect import estimator, ledger, trailing
from otel_vgpu.collect.reading import SAMPLE_EVERY_S, YOUNG_US
from otel_vgpu.gpu.backend import ProcessUse, UtilizationSample
from otel_vgpu.pods.cgroups import PodRef

SWEEP_US = 2_000_000
"""The agent's sweep: how often it reads each process's newest sample."""

DIRECTORY = Path(__file__).resolve().parents[1] / "tests" / "data" / "nvml-recordings"


@dataclass(frozen=True, slots=True)
class Truth:
    """One CUDA process as it noted itself: its kernels' bursts, in Unix microseconds."""

    pid: int
    worker: str
    pod: str
    context_us: tuple[int, int]
    """When it began to make its CUDA context, and when that was done."""
    exit_us: int
    bursts: tuple[tuple[int, int, int], ...]
    """[start, end, steps]: kernels ran between start and end, `steps` of them."""

    def work_s(self, solo_s: float, start_us: float = float("-inf"), end_us: float = float("inf")) -> float:
        """GPU seconds of work (steps x one step's solo time) in its bursts within (start, end],
        a burst cut by the window counted by the part of it inside."""
        total = 0.0
        for begin, finish, steps in self.bursts:
            if finish <= start_us or begin >= end_us:
                continue
            inside = min(finish, end_us) - max(begin, start_us)
            total += steps * solo_s * inside / max(1, finish - begin)
        return total


@dataclass(frozen=True, slots=True)
class Sample:
    arrived_us: int
    pid: int
    stamp_us: int
    sm: float
    """0-1."""
    memory: float


@dataclass(frozen=True, slots=True)
class Poll:
    at_us: int
    listed: dict[int, int]
    """PID -> used bytes (the compute listing)."""
    device_used: int
    utilization: float
    mps_clients: frozenset[int]


@dataclass(frozen=True)
class Recording:
    name: str
    about: str
    gpu: dict[str, Any]
    start_us: int
    workers: tuple[dict[str, Any], ...]
    """Each worker as the recorder planned it: name, pod, plan or spawn."""
    truths: tuple[Truth, ...]
    polls: tuple[Poll, ...]
    samples: tuple[Sample, ...]
    device: tuple[tuple[int, float], ...]
    """The GPU's own samples: [stamp us, busy 0-1], one per period."""
    mps: bool
    _poll_times: list[int] = field(default_factory=list, repr=False)

    @property
    def solo_s(self) -> float:
        return float(self.gpu["step_solo_s"])

    @property
    def end_us(self) -> int:
        return self.polls[-1].at_us

    def truth(self, pid: int) -> Truth | None:
        return next((t for t in self.truths if t.pid == pid), None)

    def poll_at(self, at_us: int) -> Poll:
        """The last poll at or before `at_us` (the first, before it)."""
        if not self._poll_times:
            self._poll_times.extend(p.at_us for p in self.polls)
        k = bisect.bisect_right(self._poll_times, at_us) - 1
        return self.polls[max(0, k)]

    def samples_of(self, pid: int) -> list[Sample]:
        return [s for s in self.samples if s.pid == pid]


def _recording(path: Path) -> Recording:
    with gzip.open(path, "rt") as raw:
        data = json.load(raw)
    truths = []
    for worker in data["workers"]:
        for process in worker["processes"]:
            truths.append(
                Truth(
                    pid=int(process["pid"]),
                    worker=worker["name"],
                    pod=worker["pod"],
                    context_us=(round(process["context"][0] * 1e6), round(process["context"][1] * 1e6)),
                    exit_us=round(process["exit"] * 1e6),
                    bursts=tuple((round(b * 1e6), round(e * 1e6), int(n)) for b, e, n in process["bursts"]),
                )
            )
    return Recording(
        # The file's name: a scenario recorded more than once is one file a take (idle-context-2).
        name=path.name.removesuffix(".json.gz"),
        about=data["about"],
        gpu=data["gpu"],
        start_us=int(data["start_us"]),
        # A tick-dodging worker (`dodge`) is in the recordings made since 2026-12-07 only.
        workers=tuple({k: w.get(k) for k in ("name", "pod", "plan", "spawn", "dodge")} for w in data["workers"]),
        truths=tuple(truths),
        polls=tuple(
            Poll(
                int(at),
                {int(pid): int(used) for pid, used in listed.items()},
                int(dev),
                rate / 100,
                frozenset(map(int, mps)),
            )
            for at, listed, dev, rate, mps in data["polls"]
        ),
        samples=tuple(Sample(int(a), int(p), int(s), sm / 100, mem / 100) for a, p, s, sm, mem, *_ in data["samples"]),
        device=tuple((int(stamp), value / 100) for stamp, value in data["device"]),
        mps=bool(data["mps"]),
    )


@cache
def load(name: str, directory: Path = DIRECTORY) -> Recording:
    """The recording of scenario `name` (bench/gpu_record_sampling.py's)."""
    return _recording(directory / f"{name}.json.gz")


def names(directory: Path = DIRECTORY) -> list[str]:
    return sorted(path.name.removesuffix(".json.gz") for path in directory.glob("*.json.gz"))


def every(directory: Path = DIRECTORY) -> Iterator[Recording]:
    for name in names(directory):
        yield load(name, directory)


@dataclass(frozen=True)
class Segment:
    """One stretch of a scenario in which every process kept one plan."""

    recording: str
    start_us: int
    end_us: int
    plans: dict[int, tuple[float, float]]
    """By PID: (period ms, on ms) in this stretch."""

    @property
    def asked(self) -> dict[int, float]:
        """By PID: the part of each period its plan runs kernels, 0-1."""
        return {pid: on / period for pid, (period, on) in self.plans.items()}

    @property
    def oversubscribed(self) -> bool:
        """Two processes or more, asking more of the GPU together than it has."""
        return len(self.plans) >= 2 and sum(self.asked.values()) > 1.0


def segments(recording: Recording) -> list[Segment]:
    """The stretches of the planned processes (spawned ones have none), each cut where any
    process's plan changes, its first and last second left out (the changes settle). None in a
    recording with a tenant that times itself to the driver's ticks (`dodge`): its rhythm is the
    driver's, not a plan, and what it asks of the GPU is what it hides (tick-dodging)."""
    if any(worker["dodge"] for worker in recording.workers):
        return []
    cuts: set[int] = set()
    plans: dict[int, list[tuple[int, int, tuple[float, float]]]] = {}
    for worker in recording.workers:
        if not worker["plan"]:
            continue
        (truth,) = [t for t in recording.truths if t.worker == worker["name"]]
        at = recording.start_us
        for seconds, period, on in worker["plan"]:
            end = at + round(seconds * 1e6)
            plans.setdefault(truth.pid, []).append((at, end, (period, on)))
            cuts |= {at, end}
            at = end
    ordered = sorted(cuts)
    out = []
    for start, end in itertools.pairwise(ordered):
        here = {pid: plan for pid, stretches in plans.items() for s, e, plan in stretches if s <= start and end <= e}
        if here and end - start > 3_000_000:
            out.append(Segment(recording.name, start + 1_000_000, end - 1_000_000, here))
    return out


def unwound_as_swept(recording: Recording, truth: Truth) -> list[trailing.Point]:
    """A process's figures as a sweep every 2 s reads them (NVML keeps each process's newest),
    unwound into what it ran by each (collect/trailing.py), every point kept."""
    figures = sorted({(s.stamp_us, s.sm) for s in recording.samples_of(truth.pid)})
    points: list[trailing.Point] = []
    history: list[trailing.Point] = []
    if not figures:
        return points
    read = figures[0][0] - figures[0][0] % SWEEP_US + SWEEP_US
    read_before = float("-inf")
    newest = None
    index = 0
    while index < len(figures):
        while index < len(figures) and figures[index][0] <= read:
            newest = figures[index]
            index += 1
        if newest is not None and (not history or newest[0] > history[-1].at_us):
            born = truth.context_us[0]
            since = max(history[-1].at_us if history else born, read_before - estimator.BACK_US, born)
            done = trailing.unwound(history, newest[0], ProcessUse(newest[1]), since)
            if done is not None:
                history = done[0]
                points.append(history[-1])
        read_before = read
        read += SWEEP_US
    return points


def replayed_bill(name: str, phase_us: int) -> dict[str, tuple[float, float]]:
    """By pod: (SM-busy seconds billed, seconds of work its processes noted) over the periods
    the bill settled, one replay of recording `name` with the sweeps at `phase_us`."""
    recorded = load(name)
    truths = {truth.pid: truth for truth in recorded.truths}
    owners = {
        pod: PodRef(f"{pod:0>8}-0000-4000-8000-{n:012d}", None)
        for n, pod in enumerate(sorted({t.pod for t in truths.values()}))
    }
    pod_of: dict[PodRef | None, str] = {ref: pod for pod, ref in owners.items()}
    # The watch reads a young process's samples at every look (collect/reading.py).
    look_us = round(SAMPLE_EVERY_S * 1e6)
    book = ledger.GpuLedger()
    billed: dict[str, float] = {}
    first_settled: float | None = None
    start = recorded.polls[0].at_us
    sweep = start + phase_us
    watch = start
    while min(sweep, watch) <= recorded.end_us:
        now = min(sweep, watch)
        swept = now == sweep
        poll = recorded.poll_at(now)
        seen = []
        for pid in poll.listed:
            truth = truths.get(pid)
            born = None if truth is None else truth.context_us[0]
            owner = None if truth is None else owners[truth.pod]
            seen.append(ledger.Seen(pid, None if born is None else born // 10_000, born, owner))
        ledger.listed(book, now, seen)
        young = any(now - life.since_us < YOUNG_US for key in book.listed.values() if (life := book.lives.get(key)))
        if swept or young:
            newest: dict[int, tuple[int, float]] = {}
            for sample in recorded.samples:
                shown = (
                    sample.arrived_us <= now
                    and sample.pid in poll.listed
                    and sample.stamp_us > now - trailing.WINDOW_US
                )
                if shown and sample.stamp_us > newest.get(sample.pid, (0, 0.0))[0]:
                    newest[sample.pid] = (sample.stamp_us, sample.sm)
            ledger.sampled(book, [UtilizationSample(pid, at, ProcessUse(sm)) for pid, (at, sm) in newest.items()], now)
        if swept:
            periods = [(stamp, value) for stamp, value in recorded.device if now - trailing.WINDOW_US < stamp <= now]
            window = ledger.close(book, periods, now)
            if window.seconds > 0 and first_settled is None:
                first_settled = min(stamp for stamp, _ in periods) - ledger.PERIOD_US
            for key, use in window.ran.items():
                pod = pod_of.get(window.lives[key].owner, "")
                billed[pod] = billed.get(pod, 0.0) + use.sm
            sweep += SWEEP_US
        else:
            watch += look_us
        if swept and watch <= now:
            watch = now + look_us
    if first_settled is None or book.settled_to is None:
        return {}
    ran: dict[str, float] = {}
    for truth in truths.values():
        ran[truth.pod] = ran.get(truth.pod, 0.0) + truth.work_s(recorded.solo_s, first_settled, book.settled_to)
    return {pod: (billed.get(pod, 0.0), ran.get(pod, 0.0)) for pod in owners}
