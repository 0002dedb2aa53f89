"""How each GPU is read in a sweep (otel_vgpu/collect/reading.py), against a fake backend that counts its calls."""

from __future__ import annotations

from typing import Any

import pytest

from otel_vgpu.collect.reading import GpuReader, SweepErrors
from otel_vgpu.gpu.backend import MigDevice, ProcessUse, UtilizationSample
from otel_vgpu.gpu.sampling import MIN_WINDOW_US
from otel_vgpu.health import Stage
from testkit.fake_gpu import FakeBackend, asked

S = 1_000_000
GIB = 1024**3


def reader_of(backend: FakeBackend, clock: list[float], **policy: Any) -> GpuReader:
    return GpuReader(backend, clock=lambda: clock[0], **policy)


def test_each_sweep_reads_the_window_since_the_last_and_never_less_than_a_second() -> None:
    backend, clock = FakeBackend(), [0.0]
    reader = reader_of(backend, clock)
    reader.read(0, SweepErrors())
    backend.now += 5 * S  # five seconds later: the window is those five
    reader.read(0, SweepErrors())
    backend.now += S // 10  # a tenth of a second later: still the last second
    reader.read(0, SweepErrors())
    assert asked(backend, "processes") == [100 * S - MIN_WINDOW_US, 100 * S, 105 * S + S // 10 - MIN_WINDOW_US]


def test_the_processes_are_fitted_under_the_gpus_own_samples_of_the_window() -> None:
    backend, clock = FakeBackend(), [0.0]
    backend.samples = [
        UtilizationSample(1, 100 * S - 10, ProcessUse(0.6)),
        UtilizationSample(2, 100 * S - 10, ProcessUse(0.3)),
    ]
    backend.gpu_samples = [(100 * S - 20, 0.4), (100 * S - 10, 0.5)]
    reading = reader_of(backend, clock).read(0, SweepErrors())
    assert reading is not None and reading.use_by_pid is not None
    assert reading.device.utilization_window == pytest.approx(0.45)
    assert sum(use.sm for use in reading.use_by_pid.values()) == pytest.approx(0.45)
    assert reading.use_by_pid[1].sm == pytest.approx(2 * reading.use_by_pid[2].sm)


def test_a_gpu_that_cannot_tell_per_process_use_is_asked_again_only_after_ask_again_s() -> None:
    backend, clock = FakeBackend(unsupported=True), [0.0]
    reader = reader_of(backend, clock, ask_again_s=60.0)
    errors = SweepErrors()
    first = reader.read(0, errors)
    assert first is not None and first.use_by_pid is None
    assert (Stage.PROCESS_UTILIZATION, "0:NOT_SUPPORTED") in errors.seen
    clock[0] = 59.0
    errors = SweepErrors()
    assert reader.read(0, errors) is not None
    # Not asked, and not a new failure: one still in force.
    assert len(asked(backend, "processes")) == 1 and not errors.seen
    assert (Stage.PROCESS_UTILIZATION, "0:NOT_SUPPORTED") in errors.ongoing
    backend.unsupported, clock[0] = False, 61.0
    again = reader.read(0, SweepErrors())
    assert len(asked(backend, "processes")) == 2 and again is not None and again.use_by_pid == {}


def test_the_energy_counter_is_read_every_energy_every_s_and_marked_skipped_between() -> None:
    backend, clock = FakeBackend(), [0.0]
    reader = reader_of(backend, clock, energy_every_s=10.0)
    devices = []
    for at in (0.0, 4.0, 9.0, 10.0, 12.0):
        clock[0] = at
        reading = reader.read(0, SweepErrors())
        assert reading is not None
        devices.append(reading.device)
    assert len(asked(backend, "energy")) == 2
    assert [d.energy_mj is not None for d in devices] == [True, False, False, True, False]
    assert [d.energy_skipped for d in devices] == [False, True, True, False, True]


def test_a_gpu_without_an_energy_counter_is_asked_each_sweep_and_never_marked_skipped() -> None:
    backend, clock = FakeBackend(energy_mj=None), [0.0]
    reader = reader_of(backend, clock, energy_every_s=10.0)
    for at in (0.0, 1.0):
        clock[0] = at
        reading = reader.read(0, SweepErrors())
        assert reading is not None and reading.device.energy_mj is None and not reading.device.energy_skipped
    assert len(asked(backend, "energy")) == 2


def test_a_gpu_in_mig_mode_is_not_asked_for_utilization_samples() -> None:
    mig = MigDevice("MIG-a", "3g.71gb", 71 * GIB, GIB)
    backend, clock = FakeBackend(migs=(mig,)), [0.0]
    reading = reader_of(backend, clock).read(0, SweepErrors())
    assert reading is not None and reading.use_by_pid is None and reading.processes
    assert asked(backend, "processes") == [] and asked(backend, "gpu") == []


def test_a_gpu_that_went_away_starts_a_new_window_when_it_comes_back() -> None:
    backend, clock = FakeBackend(), [0.0]
    reader = reader_of(backend, clock)
    reader.read(0, SweepErrors())
    reader.keep_only([])
    backend.now += 30 * S
    reader.read(0, SweepErrors())
    assert asked(backend, "processes")[-1] == 130 * S - MIN_WINDOW_US, "not the 30 s since it was last seen"


def test_errors_of_a_sweep_keep_the_first_message_of_each_kind() -> None:
    errors = SweepErrors()
    errors.add(Stage.DEVICE, "0:GPU_IS_LOST", "first")
    errors.add(Stage.DEVICE, "0:GPU_IS_LOST", "second")
    assert errors.seen == {(Stage.DEVICE, "0:GPU_IS_LOST"): "first"}
    assert ProcessUse(0.5).plus(ProcessUse(0.75)).capped() == ProcessUse(1.0)
