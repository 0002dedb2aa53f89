"""Each GPU's health figures, read off every scrape's path.

A health read is a dozen NVML calls a GPU, and a driver can take seconds over one, or never
answer: read serially inside each scrape, eight GPUs whose health call took 1.5 s each made
every scrape take 12 s, past Prometheus' default 10 s `scrape_timeout`, and the whole scrape,
every pod's bill with it, was lost. node_exporter's rule holds here: one collector never
fails a scrape. So:

- each GPU is read by a worker thread of its own, every `every_s` (`start`), beside the
  sweeps (NVML is thread-safe: nvml.h) and never while the driver is paused
  (`Sampler.driver_use`);
- a read has `deadline_s`: a GPU whose read is still in flight then is said to fail
  (`device_health`, kind `<index>:DEADLINE`), and is not asked again until that read
  returns, so that a hung call holds one thread, not one per cadence;
- a collection serves each GPU's last values, with their age (`HealthRow.age_s`), and leaves
  out a GPU whose last values are older than `stale_s`: a slow or hung GPU costs its own
  health families, never the scrape's time nor the pods' families.

Each round over the GPUs is one pass of the `health` reader (vgpu_agent_reader_duration_seconds
and vgpu_agent_reader_success): one figure for the node, as node_exporter has one a collector,
not one a GPU; the GPUs are read in parallel, so the round is as long as its slowest GPU's
read, at most the deadline, and it fails where any GPU's read failed or was late, which
`device_health` errors and the log say by GPU.

Without `start` (the in-process tests, a sampler driven by hand), a collection reads the GPUs
itself when the last read is older than its `max_age`, through the same workers and deadline.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from otel_vgpu.agent_health import AgentHealth, Reader, Stage
from otel_vgpu.collect.aggregate import GpuRow
from otel_vgpu.collect.deadline import CallThread
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.gpu.backend import GpuBackend, GpuError, HealthReading
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)

# How soon a round is asked again while no GPU has been read yet (`DeviceHealth._run`).
FIRST_READ_POLL_S = 0.25

# How often each GPU's health is read: Prometheus scrapes every 15-60 s, and a health figure
# (a temperature, a clock, an error count) that is 10 s old tells what a fresher one would.
HEALTH_EVERY_S = 10.0
# How long one GPU's read may take: on an H200 it takes milliseconds
# (bench/results/h200-health.md); a read still in flight after this is the driver's trouble.
HEALTH_DEADLINE_S = 2.0
# A GPU's values older than this are not served: three reads missed.
STALE_READS = 3


@dataclass(frozen=True, slots=True)
class HealthRow:
    """One GPU's health figures, as last read."""

    gpu: GpuRow
    figures: Mapping[str, float]
    """By figure (gpu/device_figures.py `HEALTH_TABLE`); one the GPU does not report is absent."""
    age_s: float = 0.0
    """How long ago they were read."""


@dataclass(frozen=True, slots=True)
class _Read:
    at: float
    figures: Mapping[str, float]


class DeviceHealth:
    def __init__(
        self,
        sampler: Sampler,
        health: AgentHealth,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = HEALTH_EVERY_S,
        deadline_s: float = HEALTH_DEADLINE_S,
    ) -> None:
        self._sampler = sampler
        self._health = health
        self._clock = clock
        self._every_s = every_s
        self._deadline_s = deadline_s
        self._lock = threading.Lock()
        self._workers: dict[int, CallThread] = {}
        self._last: dict[int, _Read] = {}
        """Each GPU's last figures read, by index."""
        self._failing: set[str] = set()
        """The kinds of failure in force, by GPU (`<index>:<code>`), which the workers change too."""
        self._failing_lock = threading.Lock()
        self._refreshed_at: float | None = None
        self._stop = threading.Event()
        self._thread: NamedThread | None = None

    def start(self) -> None:
        """Read on the cadence, on a thread of its own, from now on."""
        self._thread = NamedThread(target=self._run, name="device-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No more reads: the cadence ends, and each GPU's thread once its read in flight
        returns (a read hung in the driver holds its daemon thread until the process exits)."""
        self._stop.set()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.stop()

    def rows(self, max_age: float) -> tuple[HealthRow, ...]:
        """Each GPU's last health figures, with their age; without `start`, read now unless a read
        no older than `max_age` seconds serves."""
        if self._thread is None:
            refreshed = self._refreshed_at
            if refreshed is None or self._clock() - refreshed > max_age:
                self.refresh()
        snapshot = self._sampler.latest()
        if snapshot is None:
            return ()
        now = self._clock()
        stale = max(self._every_s if self._thread is not None else max_age, self._deadline_s) * STALE_READS
        rows = []
        for gpu in snapshot.gpus:
            last = self._last.get(gpu.index)
            if last is not None and now - last.at <= stale:
                rows.append(HealthRow(gpu, last.figures, max(0.0, now - last.at)))
        return tuple(rows)

    def refresh(self) -> None:
        """Each GPU of the last sweep read once, in parallel, waiting at most `deadline_s`: one
        pass of the health reader, as long as its slowest GPU's read, which fails where any GPU's
        read failed or was late."""
        with self._lock:
            self._refreshed_at = self._clock()
            snapshot = self._sampler.latest()
            if snapshot is None:
                return
            started = time.monotonic()
            asked, late, failed = [], set(), set()
            for gpu in snapshot.gpus:
                worker = self._workers.get(gpu.index)
                if worker is None:
                    worker = self._workers[gpu.index] = CallThread(f"gpu{gpu.index}-health")
                if not worker.start(functools.partial(self._read, gpu.index)):
                    late.add(gpu.index)  # its last read has not returned: not asked again meanwhile
                    continue
                asked.append((gpu.index, worker))
            until = time.monotonic() + self._deadline_s
            for index, worker in asked:
                if not worker.wait(max(0.0, until - time.monotonic())):
                    late.add(index)
                elif not worker.result():
                    failed.add(index)
            self._health.passed(Reader.DEVICE_HEALTH, time.monotonic() - started, not late and not failed)
            for index in late:
                kind = f"{index}:DEADLINE"
                with self._failing_lock:
                    self._failing.add(kind)
                self._health.failed(
                    Stage.DEVICE_HEALTH,
                    kind,
                    f"GPU {index}: health figures: no answer from the driver in {self._deadline_s:g} s; "
                    "its health families are left out until it answers",
                )
            with self._failing_lock:
                self._failing -= {f"{index}:DEADLINE" for index in self._workers if index not in late}
                failing = set(self._failing)
            self._health.recovered(Stage.DEVICE_HEALTH, "device_health recovered ({kinds})", still=failing)

    def _read(self, index: int) -> bool:
        """GPU `index`'s figures read, on its thread, and kept; nothing kept where they could not be.
        False where the read failed, whole or in part (not where the driver is paused, which asks
        nothing): the health reader's success says so while the figures that were read serve."""
        try:
            with self._sampler.driver_use() as backend:
                if backend is None:
                    return True
                reading = self._figures(backend, index)
        except Exception as error:  # a bug, never the driver's answer (`_figures` says those)
            log.warning("GPU %d: reading its health failed: %s", index, error)
            return False
        if reading is not None:
            self._last[index] = _Read(self._clock(), reading.figures)
        return reading is not None and not reading.failed

    def _figures(self, backend: GpuBackend, index: int) -> HealthReading | None:
        """The GPU's figures read now; None where the read failed whole (the GPU or the session
        lost). A read of some figures that failed costs those alone, counted once, each kind
        said once (`<index>:<first figure>:<code>`)."""
        try:
            reading = backend.health(index)
        except GpuError as error:
            kind = f"{index}:{error.code.value}"
            with self._failing_lock:
                self._failing.add(kind)
            self._health.failed(Stage.DEVICE_HEALTH, kind, f"GPU {index}: health figures: {error}")
            return None
        kinds = {f"{index}:{failure.figures[0]}:{failure.error.code.value}": failure for failure in reading.failed}
        with self._failing_lock:
            self._failing = {kind for kind in self._failing if not kind.startswith(f"{index}:")} | set(kinds)
        for kind, failure in kinds.items():
            self._health.failed(
                Stage.DEVICE_HEALTH,
                kind,
                f"GPU {index}: health figures {', '.join(failure.figures)}: {failure.error}; "
                "left out of this read, the GPU's other figures kept",
            )
        return reading

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.refresh()
            except Exception as error:  # a bug: said, and the next round tries again
                log.warning("reading the GPUs' health failed: %s", error)
            # Until a GPU has been read, the round is asked again soon: the first sweep runs on a
            # thread of its own beside this one, and a round that found no sweep to read the GPUs
            # of would otherwise leave every health family out for the whole first cadence.
            every_s = self._every_s if self._last else min(self._every_s, FIRST_READ_POLL_S)
            self._stop.wait(max(0.0, every_s - (time.monotonic() - started)))
