"""Sweeps on the agent's own cadence, whether or not anyone scrapes.

The usage counters (collect/usage.py) advance at each sweep: with sweeps only
when Prometheus scrapes, their resolution would be the scrape interval's.
A thread sweeps every `--sweep-interval` seconds; a scrape or push shares the latest
sweep when it is within `--min-interval`, else sweeps itself (that sweep
counts too). A sweep is skipped when one happened in the last half interval
(a scrape's).
"""

from __future__ import annotations

import logging
import threading

from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)


class Sweeper:
    def __init__(self, sampler: Sampler, interval_s: float) -> None:
        self._sampler = sampler
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = NamedThread(target=self._run, name="sweeper", daemon=True)

    def start(self) -> None:
        if self._interval_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            # The sampler counts and logs a failed sweep itself; this thread must outlive it.
            try:
                self._sampler.snapshot(self._interval_s / 2)
            except Exception as error:  # pragma: no cover - the sampler catches its own
                log.warning("sweep failed: %s", error)
