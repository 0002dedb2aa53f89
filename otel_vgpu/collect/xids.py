"""XID errors per GPU and code, counted as NVML reports them: a thread takes the events queued
for each GPU once a second (each GPU's own event set, without waiting: gpu/nvml_health.py) and
counts each; while the GPU Operator pauses the driver for an upgrade it asks nothing.

Fair across GPUs: each GPU's events wait in a queue of their own (one NVML event set per GPU),
and a round takes them in turns, at most XID_SLICE of one GPU at a time, so that a GPU with a
few events has them all taken at its first turn however many another GPU has queued. With one
event set for every GPU, an XID 79 on GPU 1 behind 3x10^6 events of a storm on GPU 0 waited
~25 minutes at the bound below; now it waits for one round.

Each take has a deadline, on a thread of its GPU's own (collect/deadline.py): a call hung in
the driver on GPU 0 held the whole round, GPU 3's XID 79 uncounted behind it, while the `xid`
reader still read its last pass's success. Now a GPU whose take is late is left out of the
round (`<index>:DEADLINE` in `xid_events`, the round failed), not asked again until the call
returns, and the events that call took are counted then; the other GPUs go on.

An event storm (a GPU stuck in a loop of errors) costs bounded memory and CPU: each GPU has at
most MAX_XID_CODES codes counted apart (the rest as `other`), and a round takes at most
MAX_XID_EVENTS_PER_S events over every GPU. What a storming GPU has beyond its turns waits in
its own NVML queue until the next round, delaying only that GPU's later events (nvml.h
documents no bound of that queue; what the driver drops there, no one counts). A storm is said
once in the log per GPU, when it starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from otel_vgpu.agent_health import AgentHealth, Reader, Stage
from otel_vgpu.collect.deadline import CallThread
from otel_vgpu.gpu.backend import GpuBackend, GpuError, XidEvent
from otel_vgpu.gpu.device_figures import MAX_XID_CODES
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)

MAX_XID_EVENTS_PER_S = 2000
# The most events of one GPU taken at its turn: a GPU with fewer queued is drained at its first
# turn, so another GPU's storm holds its events back by at most this many calls per storming GPU.
XID_SLICE = 64
# How often the event sets are looked at. Each look waits 0 ms in NVML (nvmlEventSetWait with a
# zero timeout): one round a second whatever NVML's wait does inside, and a driver pause never
# waits for a call blocked in NVML. On an H200 with 48 processes, the agent with a thread
# blocked in 500 ms waits used 23 % more CPU than without these families
# (bench/results/h200-health.md); an XID is counted within a second either way.
POLL_S = 1.0
# How long one take of a GPU's events may run: it waits 0 ms in NVML, and answers in
# microseconds; one still in flight after this is hung in the driver.
XID_DEADLINE_S = 1.0
OTHER = "other"


@dataclass(frozen=True, slots=True)
class XidCount:
    """One GPU's count of one XID code."""

    gpu_index: int
    gpu_uuid: str
    xid: str
    count: int
    last: int = 0
    """The code of the GPU's latest XID, whichever code this row counts: the same on each of
    the GPU's rows, and never `other`, since it is one code (vgpu_gpu_xid_last)."""


class XidCounts:
    """The counts, safe to add to from the watch's thread and read from a collection's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, str], dict[str, int]] = {}
        self._last: dict[tuple[int, str], int] = {}

    def add(self, events: Sequence[XidEvent]) -> None:
        with self._lock:
            for event in events:
                codes = self._counts.setdefault((event.index, event.uuid), {})
                code = str(event.xid)
                if code not in codes and len(codes) >= MAX_XID_CODES:
                    code = OTHER
                codes[code] = codes.get(code, 0) + 1
                # Events come in the order the driver queued them: the round's last is the latest.
                self._last[(event.index, event.uuid)] = event.xid

    def rows(self) -> tuple[XidCount, ...]:
        with self._lock:
            return tuple(
                XidCount(index, uuid, code, count, self._last[(index, uuid)])
                for (index, uuid), codes in self._counts.items()
                for code, count in codes.items()
            )


@dataclass(frozen=True, slots=True)
class Round:
    """What one round took: by GPU index, how many events; the GPUs that still had events when
    the round's budget ran out (storming); those whose events could not be taken, and why; those
    whose take did not answer within its deadline."""

    taken: dict[int, int] = field(default_factory=dict)
    cut: tuple[int, ...] = ()
    failed: dict[int, GpuError] = field(default_factory=dict)
    late: tuple[int, ...] = ()


def take_round(
    take: Callable[[int, int], Sequence[XidEvent] | None],
    gpus: Sequence[int],
    count: Callable[[Sequence[XidEvent]], None],
    most: int = MAX_XID_EVENTS_PER_S,
    slice_of: int = XID_SLICE,
) -> Round:
    """One round over `gpus`: each in turn takes up to `slice_of` of its events (`take(index,
    at_most)`, which never waits, and answers None where the driver did not answer in time) and
    `count`s them, until every GPU is drained or `most` are taken. A GPU whose take fails or is
    late is left out of the round; the others go on."""
    pending = list(dict.fromkeys(gpus))
    taken = dict.fromkeys(pending, 0)
    failed: dict[int, GpuError] = {}
    late: list[int] = []
    left = most
    while pending and left > 0:
        for index in list(pending):
            ask = min(slice_of, left)
            if ask <= 0:
                break
            try:
                events = take(index, ask)
            except GpuError as error:
                failed[index] = error
                pending.remove(index)
                continue
            if events is None:
                late.append(index)
                pending.remove(index)
                continue
            count(events)
            taken[index] += len(events)
            left -= len(events)
            if len(events) < ask:
                pending.remove(index)  # drained
    return Round(taken, tuple(pending), failed, tuple(late))


class XidWatch:
    """The thread that takes each GPU's events, round by round, and counts them."""

    def __init__(
        self,
        backend: GpuBackend,
        counts: XidCounts,
        health: AgentHealth,
        gpus: Callable[[], Sequence[int]],
        most_per_s: int = MAX_XID_EVENTS_PER_S,
        deadline_s: float = XID_DEADLINE_S,
    ) -> None:
        """`gpus`: the indices of the GPUs to look at, those of the last sweep, read or lost
        (Sampler.gpu_indices). `deadline_s`: how long one take of a GPU's events may run."""
        self._backend = backend
        self._counts = counts
        self._health = health
        self._gpus = gpus
        self._most_per_s = most_per_s
        self._deadline_s = deadline_s
        self._callers: dict[int, CallThread] = {}
        """Each GPU's thread for its takes, by index."""
        self._unanswered: set[int] = set()
        """The GPUs whose last take missed its deadline: what it took is counted once it returns."""
        self._storming: set[int] = set()
        self._stop = threading.Event()
        self._thread = NamedThread(target=self._run, name="xid-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * POLL_S)
        for caller in list(self._callers.values()):
            caller.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.take()
            except Exception as error:  # the thread must outlive a bug; the sweeps go on
                self._health.failed(Stage.XID_EVENTS, type(error).__name__, f"XID events: {error!r}")
            self._stop.wait(POLL_S)

    def take(self) -> Round:
        """One round: every GPU's queued events taken in turns and counted, failures reported;
        one pass of the `xid` reader where there was a GPU to look at (none before the first
        sweep, and while the driver is paused)."""
        gpus = self._gpus()
        started = time.monotonic()
        if gpus:
            # Each GPU's takes wait at most a deadline once a round (a late GPU is then left out).
            self._health.began(Reader.XID, self._deadline_s * len(gpus))
        try:
            done = take_round(self._take, gpus, self._counts.add, self._most_per_s)
        except Exception:
            self._health.passed(Reader.XID, time.monotonic() - started, False)
            raise
        if gpus:
            self._health.passed(Reader.XID, time.monotonic() - started, not done.failed and not done.late)
        for index, error in done.failed.items():
            self._health.failed(Stage.XID_EVENTS, f"{index}:{error.code.value}", f"XID events of GPU {index}: {error}")
        for index in done.late:
            self._health.failed(
                Stage.XID_EVENTS,
                f"{index}:DEADLINE",
                f"XID events of GPU {index}: no answer from the driver in {self._deadline_s:g} s; "
                "the other GPUs' events are counted, and its own once it answers",
            )
        still = {f"{index}:{error.code.value}" for index, error in done.failed.items()}
        still |= {f"{index}:DEADLINE" for index in done.late}
        self._health.recovered(Stage.XID_EVENTS, "xid_events recovered ({kinds})", still=still)
        for index in sorted(set(done.cut) - self._storming):
            log.warning(
                "XID event storm on GPU %d: over %d events a second on this node; its events are counted at "
                "that rate in turns with the other GPUs', whose events it does not hold back; the rest wait "
                "in its own NVML queue",
                index,
                self._most_per_s,
            )
        self._storming = set(done.cut)
        return done

    def _take(self, index: int, most: int) -> Sequence[XidEvent] | None:
        """Up to `most` of GPU `index`'s events, taken on its thread within the deadline; None
        where the take is late, or the last one still is. A late take's events, once it
        returns, are this turn's answer: taken from NVML's queue, they are counted, never lost."""
        caller = self._callers.get(index)
        if caller is None:
            caller = self._callers[index] = CallThread(f"gpu{index}-xid")
        if index in self._unanswered:
            if caller.busy:
                return None
            self._unanswered.discard(index)
            events: Sequence[XidEvent] = caller.result()
            return events
        answered, events = caller.run(lambda: self._backend.xid_events(index, most), self._deadline_s)
        if not answered:
            self._unanswered.add(index)
            return None
        return events
