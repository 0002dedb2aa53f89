"""Each GPU's health figures, read once per collection (a scrape or an OTLP push), not every
sweep: the collections within `max_age` of a read share it, as they share a sweep. The read
runs beside no sweep and not while the driver is paused (the sampler's `read_devices`), on the
GPUs of the latest sweep."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from otel_vgpu.collect.aggregate import GpuRow, Snapshot
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.gpu.backend import GpuBackend, GpuError
from otel_vgpu.health import Health, Stage


@dataclass(frozen=True, slots=True)
class HealthRow:
    """One GPU's health figures as read at one collection."""

    gpu: GpuRow
    figures: Mapping[str, float]
    """By figure (gpu/device_figures.py `HEALTH_TABLE`); one the GPU does not report is absent."""


class DeviceHealth:
    def __init__(self, sampler: Sampler, health: Health, clock: Callable[[], float] = time.monotonic) -> None:
        self._sampler = sampler
        self._health = health
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: tuple[float, tuple[HealthRow, ...]] | None = None
        self._failing: set[str] = set()

    def rows(self, max_age: float) -> tuple[HealthRow, ...]:
        """The GPUs' health, read now unless a read no older than `max_age` seconds serves."""
        with self._lock:
            kept = self._kept
            if kept is not None and self._clock() - kept[0] <= max_age:
                return kept[1]
            rows = self._sampler.read_devices(self._read) or ()
            self._kept = (self._clock(), rows)
            return rows

    def _read(self, backend: GpuBackend, snapshot: Snapshot) -> tuple[HealthRow, ...]:
        rows, failing = [], set()
        for gpu in snapshot.gpus:
            try:
                rows.append(HealthRow(gpu, backend.health(gpu.index)))
            except GpuError as error:
                kind = f"{gpu.index}:{error.code.value}"
                failing.add(kind)
                self._health.failed(Stage.DEVICE_HEALTH, kind, f"GPU {gpu.index}: health figures: {error}")
        self._health.recovered(Stage.DEVICE_HEALTH, "device_health recovered ({kinds})", still=failing)
        return tuple(rows)
