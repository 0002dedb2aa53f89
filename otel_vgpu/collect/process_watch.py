"""The process watch: each GPU's process list looked at between sweeps, so that no process is missed.

A sweep sees the processes alive at its instant. A process that lives between two sweeps
(a tenant's fresh CUDA process a second, phased or not) would be in no sweep's listing, and
its work in no bill. This thread looks at each GPU every `--watch-interval` seconds: it
probes the memory in use (0.007 ms on an H200: bench/results/h200-sweep-cost.md) and lists
the processes at every look for a second after it changed, since a process that comes or goes
holds or frees a context's memory, 220 ms before NVML lists it on an H200
(bench/results/h200-memory-probe.md); listing every look cost 4.5 ms a look at 48 processes on the H200
(bench/results/h200-tenant-restarts.md). A new PID is attributed at first sight, while its
/proc entry exists, and the GPU's per-process samples (2 ms a read) are read for it while it
lives, at most every `SAMPLE_EVERY_S` (collect/reading.py), so that its own figure splits
the periods it shared. The sweep then integrates every life over the window
(collect/ledger.py). The watch takes the sampler's lock: it never runs beside a sweep, and
it waits longer between looks that take long (`next_wait`), so that it spends at most a tenth
of the time looking.
"""

from __future__ import annotations

import logging
import threading

from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)

# The most of the time the watch may spend looking.
DUTY = 0.1


class ProcessWatch:
    def __init__(self, sampler: Sampler, interval_s: float) -> None:
        self._sampler = sampler
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = NamedThread(target=self._run, name="process-watch", daemon=True)
        self.looks = 0

    def start(self) -> None:
        if self._interval_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        wait = self._interval_s
        while not self._stop.wait(wait):
            took = 0.0
            try:
                took = self._sampler.watch()
                self.looks += 1
            except Exception as error:  # a bug, never a driver's answer (those are the sweep's to say)
                log.warning("the process watch failed: %s", error)
            wait = next_wait(self._interval_s, took)


def next_wait(interval_s: float, look_s: float) -> float:
    """The wait before the next look: the interval, or longer where a look took long (a node
    whose processes churn by thousands a second), so that the watch holds the sampler, and a
    core, at most `DUTY` of the time, and the sweeps and scrapes it waits beside go on."""
    return max(interval_s, look_s * (1 - DUTY) / DUTY)
