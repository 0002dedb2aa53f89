"""Sweeps on the agent's own cadence, whether or not anyone scrapes, at instants no client
can move or predict.

The usage counters (collect/usage.py) advance at each sweep. A thread sweeps about every
`--sweep-interval` seconds: each wait is drawn at random, from half the interval to one and a
half times it, from the operating system's generator (`random.SystemRandom`), so that neither
`/metrics` nor the last sweeps tell when the next one comes. A scrape or an OTLP push never
sweeps: it serves the last sweep, or waits for the one in flight (collect/sampler.py `drive`).
docs/trust.md says why, and what it costs in freshness.
"""

from __future__ import annotations

import logging
import random
import threading

from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)

# Each wait is the interval times a factor drawn uniformly from this range: its mean is 1.
JITTER = (0.5, 1.5)


def next_wait(interval_s: float, draw: random.Random) -> float:
    """The wait before the next sweep: `interval_s` jittered, on average `interval_s`."""
    return interval_s * draw.uniform(*JITTER)


class Sweeper:
    def __init__(self, sampler: Sampler, interval_s: float, draw: random.Random | None = None) -> None:
        self._sampler = sampler
        self._interval_s = interval_s
        self._draw = draw or random.SystemRandom()
        self._stop = threading.Event()
        self._thread = NamedThread(target=self._run, name="sweeper", daemon=True)

    def start(self) -> None:
        if self._interval_s > 0:
            self._sampler.drive()
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            # The sampler counts and logs a failed sweep itself; this thread must outlive it.
            try:
                self._sampler.sweep()
            except Exception as error:  # pragma: no cover - the sampler catches its own
                log.warning("sweep failed: %s", error)
            if self._stop.wait(next_wait(self._interval_s, self._draw)):
                return
