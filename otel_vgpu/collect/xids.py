"""XID errors per GPU and code, counted as NVML reports them: a thread waits on NVML's event set
(nvmlEventSetWait, with a timeout, so that it lets go of the driver within it when the GPU
Operator pauses it for an upgrade: gpu/nvml_health.py) and counts each event.

An event storm (a GPU stuck in a loop of errors) costs bounded memory and CPU: each GPU has at
most MAX_XID_CODES codes counted apart (the rest as `other`), and the thread takes at most
MAX_XID_EVENTS_PER_S events a second. Past that rate it waits for the next second: NVML keeps
the events queued meanwhile (nvml.h documents no bound of its queue; what the driver drops
there, no one counts). The storm is said once in the log, when it starts.
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

log = logging.getLogger(__name__)

MAX_XID_EVENTS_PER_S = 2000
# How long one wait on the event set lasts: what a driver pause waits for, at most.
WAIT_S = 0.5
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
        self._thread = threading.Thread(target=self._run, name="xid-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * WAIT_S)

    def _run(self) -> None:
        second, taken, storming = self._clock(), 0, False
        while not self._stop.is_set():
            try:
                events = self._backend.xid_events(WAIT_S)
            except GpuError as error:
                self._health.failed(Stage.XID_EVENTS, error.code.value, f"XID events: {error}")
                self._stop.wait(WAIT_S)
                continue
            except Exception as error:  # the thread must outlive a bug; the sweeps go on
                self._health.failed(Stage.XID_EVENTS, type(error).__name__, f"XID events: {error!r}")
                self._stop.wait(WAIT_S)
                continue
            self._health.recovered(Stage.XID_EVENTS, "xid_events recovered ({kinds})")
            self._counts.add(events)
            now = self._clock()
            if now - second >= 1.0:
                storming = storming and taken >= self._most_per_s  # a calm second ends the storm
                second, taken = now, 0
            taken += len(events)
            if taken >= self._most_per_s:
                if not storming:
                    log.warning(
                        "XID event storm: over %d events a second; counting at that rate, the rest wait in "
                        "NVML's queue",
                        self._most_per_s,
                    )
                    storming = True
                self._stop.wait(max(0.0, 1.0 - (self._clock() - second)))
