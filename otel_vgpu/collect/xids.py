"""XID errors per GPU and code, counted as NVML reports them: a thread takes the events queued
in NVML's event set once a second (nvmlEventSetWait without waiting, gpu/nvml_health.py) and
counts each; while the GPU Operator pauses the driver for an upgrade it asks nothing.

An event storm (a GPU stuck in a loop of errors) costs bounded memory and CPU: each GPU has at
most MAX_XID_CODES codes counted apart (the rest as `other`), and the thread takes at most
MAX_XID_EVENTS_PER_S events a second. The rest wait in NVML's queue until the next second
(nvml.h documents no bound of that queue; what the driver drops there, no one counts). The
storm is said once in the log, when it starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from otel_vgpu.gpu.backend import GpuBackend, GpuError, XidEvent
from otel_vgpu.gpu.device_figures import MAX_XID_CODES
from otel_vgpu.health import Health, Stage
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)

MAX_XID_EVENTS_PER_S = 2000
# How often the event set is looked at. Each look waits 0 ms in NVML (nvmlEventSetWait with a
# zero timeout): one call a second whatever NVML's wait does inside, and a driver pause never
# waits for a call blocked in NVML. On an H200 with 48 processes, the agent with a thread
# blocked in 500 ms waits used 23 % more CPU than without these families
# (bench/results/h200-health.md); an XID is counted within a second either way.
POLL_S = 1.0
OTHER = "other"


@dataclass(frozen=True, slots=True)
class XidCount:
    """One GPU's count of one XID code."""

    gpu_index: int
    gpu_uuid: str
    xid: str
    count: int


class XidCounts:
    """The counts, safe to add to from the watch's thread and read from a collection's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, str], dict[str, int]] = {}

    def add(self, events: Sequence[XidEvent]) -> None:
        with self._lock:
            for event in events:
                codes = self._counts.setdefault((event.index, event.uuid), {})
                code = str(event.xid)
                if code not in codes and len(codes) >= MAX_XID_CODES:
                    code = OTHER
                codes[code] = codes.get(code, 0) + 1

    def rows(self) -> tuple[XidCount, ...]:
        with self._lock:
            return tuple(
                XidCount(index, uuid, code, count)
                for (index, uuid), codes in self._counts.items()
                for code, count in codes.items()
            )


class XidWatch:
    """The thread that waits on NVML's events and counts them."""

    def __init__(
        self,
        backend: GpuBackend,
        counts: XidCounts,
        health: Health,
        clock: Callable[[], float] = time.monotonic,
        most_per_s: int = MAX_XID_EVENTS_PER_S,
    ) -> None:
        self._backend = backend
        self._counts = counts
        self._health = health
        self._clock = clock
        self._most_per_s = most_per_s
        self._stop = threading.Event()
        self._thread = NamedThread(target=self._run, name="xid-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * POLL_S)

    def _run(self) -> None:
        storming = False
        while not self._stop.is_set():
            started = self._clock()
            taken = self._drain()
            if taken is None:
                self._stop.wait(POLL_S)
                continue
            if taken >= self._most_per_s and not storming:
                log.warning(
                    "XID event storm: over %d events a second; counting at that rate, the rest wait in NVML's queue",
                    self._most_per_s,
                )
            storming = taken >= self._most_per_s
            self._stop.wait(max(0.0, POLL_S - (self._clock() - started)))

    def _drain(self) -> int | None:
        """Take the events queued now, at most a second's worth: how many; None on a failure."""
        taken = 0
        while taken < self._most_per_s and not self._stop.is_set():
            try:
                events = self._backend.xid_events(0.0)
            except GpuError as error:
                self._health.failed(Stage.XID_EVENTS, error.code.value, f"XID events: {error}")
                return None
            except Exception as error:  # the thread must outlive a bug; the sweeps go on
                self._health.failed(Stage.XID_EVENTS, type(error).__name__, f"XID events: {error!r}")
                return None
            self._health.recovered(Stage.XID_EVENTS, "xid_events recovered ({kinds})")
            if not events:
                break
            self._counts.add(events)
            taken += len(events)
        return taken
