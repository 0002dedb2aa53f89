"""How each GPU is read in a sweep (otel_vgpu/collect/reading.py), against a fake backend that counts its calls."""

from __future__ import annotations

from typing import Any

import pytest

from otel_vgpu.agent_health import Stage
from otel_vgpu.collect.aggregate import GpuReading
from otel_vgpu.collect.estimator import SETTLE_US, WAIT_US
from otel_vgpu.collect.reading import GpuReader, Read, SweepErrors
from otel_vgpu.gpu.backend import AccountingRecord, MigDevice, ProcessUse, UtilizationSample
from otel_vgpu.gpu.sampling import MIN_WINDOW_US
from testkit.fake_gpu import FakeBackend, asked

pytestmark = pytest.mark.unit

S = 1_000_000
GIB = 1024**3


def reader_of(backend: FakeBackend, clock: list[float], **policy: Any) -> GpuReader:
    return GpuReader(backend, clock=lambda: clock[0], **policy)


def swept(reader: GpuReader, errors: SweepErrors | None = None) -> GpuReading | None:
    """GPU 0 read as a sweep reads it: its processes, of no pod here, then what they ran."""
    reading = reader.read(0, errors or SweepErrors())
    return None if reading is None else reader.settle(reading, {}, {})


def test_each_sweep_reads_the_window_since_the_last_and_never_less_than_a_second() -> None:
    backend, clock = FakeBackend(), [0.0]
    reader = reader_of(backend, clock)
    reader.read(0, SweepErrors())
    backend.now += 5 * S  # five seconds later: the window is those five
    reader.read(0, SweepErrors())
    backend.now += S // 10  # a tenth of a second later: still the last second
    reader.read(0, SweepErrors())
    # Each asks a settling lag further back (collect/estimator.py): a sample NVML shows late.
    # The first asks as far back as a period may wait for a process's next sample (`WAIT_US`).
    back = SETTLE_US
    assert asked(backend, "processes") == [
        100 * S - WAIT_US,
        100 * S - back,
        105 * S + S // 10 - MIN_WINDOW_US - back,
    ]


def test_the_processes_are_fitted_under_the_gpus_own_samples_of_the_window() -> None:
    backend, clock = FakeBackend(), [0.0]
    backend.samples = [
        UtilizationSample(1, 100 * S - 10, ProcessUse(0.6)),
        UtilizationSample(2, 100 * S - 10, ProcessUse(0.3)),
    ]
    backend.gpu_samples = [(100 * S - 20, 0.4), (100 * S - 10, 0.5)]
    backend.now = 100 * S + SETTLE_US  # the periods have settled (collect/ledger.py)
    reading = swept(reader_of(backend, clock))
    assert reading is not None and reading.use_by_pid is not None
    assert reading.device.utilization_window == pytest.approx(0.45)
    assert sum(use.sm for use in reading.use_by_pid.values()) == pytest.approx(0.45)
    # In proportion to their figures, each read to NVML's whole percent.
    assert reading.use_by_pid[1].sm == pytest.approx(2 * reading.use_by_pid[2].sm, rel=0.02)


def test_a_gpu_that_cannot_tell_per_process_use_is_asked_again_only_after_ask_again_s() -> None:
    backend, clock = FakeBackend(unsupported=True), [0.0]
    reader = reader_of(backend, clock, ask_again_s=60.0)
    errors = SweepErrors()
    first = swept(reader, errors)
    assert first is not None and first.use_by_pid is None
    assert (Stage.PROCESS_UTILIZATION, "0:NOT_SUPPORTED") in errors.seen
    clock[0] = 59.0
    errors = SweepErrors()
    assert reader.read(0, errors) is not None
    # Not asked, and not a new failure: one still in force.
    assert len(asked(backend, "processes")) == 1 and not errors.seen
    assert (Stage.PROCESS_UTILIZATION, "0:NOT_SUPPORTED") in errors.ongoing
    backend.unsupported, clock[0] = False, 61.0
    again = swept(reader)
    assert len(asked(backend, "processes")) == 2 and again is not None
    # Asked again, with no samples: its processes were idle, each a figure of 0.
    assert again.use_by_pid is not None and set(again.use_by_pid.values()) <= {ProcessUse()}


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
    assert asked(backend, "processes")[-1] == 130 * S - WAIT_US, "not the 30 s since it was last seen"


def test_errors_of_a_sweep_keep_the_first_message_of_each_kind() -> None:
    errors = SweepErrors()
    errors.add(Stage.DEVICE, "0:GPU_IS_LOST", "first")
    errors.add(Stage.DEVICE, "0:GPU_IS_LOST", "second")
    assert errors.seen == {(Stage.DEVICE, "0:GPU_IS_LOST"): "first"}
    assert ProcessUse(0.5).plus(ProcessUse(0.75)).capped() == ProcessUse(1.0)


def engine_reader(clock: list[float]) -> tuple[FakeBackend, GpuReader]:
    backend = FakeBackend(engines=frozenset({"memory_copy", "decoder", "jpeg"}))
    backend.engine_samples = {
        "memory_copy": [(100 * S + k * S // 5, 0.5) for k in range(1, 100)],
        "decoder": [(100 * S + k * S // 5, 0.25) for k in range(1, 100)],
    }
    return backend, reader_of(backend, clock, engine_every_s=10.0)


def sweep_at(backend: FakeBackend, reader: GpuReader, clock: list[float], at: float) -> Any:
    clock[0] = at
    backend.now = 100 * S + int(at * S)
    reading = swept(reader)
    assert reading is not None
    return reading.device


def test_an_engine_window_closes_every_engine_every_s_with_the_gpus_mean_since_it_opened() -> None:
    clock = [0.0]
    backend, reader = engine_reader(clock)
    backend.samples = [UtilizationSample(1, 100 * S + 1, ProcessUse(0.5, memory_copy=0.4, decoder=0.2))]
    opened = sweep_at(backend, reader, clock, 0.0)
    assert opened.engine_window is None  # the first sweep opens the window
    backend.samples = [UtilizationSample(1, 100 * S + 5 * S, ProcessUse(0.5, memory_copy=0.4, decoder=0.2))]
    assert sweep_at(backend, reader, clock, 5.0).engine_window is None
    closed = sweep_at(backend, reader, clock, 10.0)
    # Each engine the processes used is read from its own buffer since the window opened;
    # JPEG, which nobody used, is 0 without a read; the GPU's encoder it lacks is not asked.
    assert closed.engine_window == {"memory_copy": 0.5, "decoder": 0.25, "jpeg": 0.0}
    assert asked(backend, "gpu:memory_copy") == asked(backend, "gpu:decoder") == [100 * S]
    assert asked(backend, "gpu:jpeg") == asked(backend, "gpu:encoder") == []
    # The next window starts where this one ended, and reads nothing until it closes.
    assert sweep_at(backend, reader, clock, 12.0).engine_window is None
    assert len(asked(backend, "gpu:memory_copy")) == 1


def test_an_engine_no_process_used_in_a_window_costs_no_read() -> None:
    clock = [0.0]
    backend, reader = engine_reader(clock)
    backend.samples = [UtilizationSample(1, 100 * S + 1, ProcessUse(0.5))]  # SM only
    for at in (0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0):
        device = sweep_at(backend, reader, clock, at)
    assert device.engine_window == {"memory_copy": 0.0, "decoder": 0.0, "jpeg": 0.0}
    assert [name for name, _ in backend.calls if name.startswith("gpu:")] == []


def test_engine_windows_are_not_kept_where_their_families_are_off_or_under_mig() -> None:
    clock = [0.0]
    backend = FakeBackend(engines=frozenset({"memory_copy"}))
    backend.samples = [UtilizationSample(1, 100 * S + 1, ProcessUse(0.5, memory_copy=0.5))]
    reader = reader_of(backend, clock, engine_every_s=0.0, reads=frozenset(Read) - {Read.ENGINE_SAMPLES})
    assert all(sweep_at(backend, reader, clock, at).engine_window is None for at in (0.0, 1.0, 2.0))
    mig = MigDevice("MIG-a", "3g.71gb", 71 * GIB, GIB)
    backend = FakeBackend(engines=frozenset({"memory_copy"}), migs=(mig,))
    reader = reader_of(backend, clock, engine_every_s=0.0)
    assert all(sweep_at(backend, reader, clock, at).engine_window is None for at in (0.0, 1.0, 2.0))
    assert [name for name, _ in backend.calls if name.startswith("gpu:")] == []


def test_the_watch_lists_a_gpus_processes_only_when_its_memory_in_use_changed() -> None:
    backend, clock = FakeBackend(), [0.0]
    reader = reader_of(backend, clock)
    swept(reader)  # the sweep opens the GPU's ledger; its memory then is the probe's now

    def asked_for(call: str) -> int:
        return sum(1 for name, _ in backend.calls if name == call)

    listed, sampled = asked_for("listing"), asked_for("processes")
    for _ in range(4):
        backend.now += S // 4
        reader.watch(0, lambda pids: {})
    assert asked_for("memory") == 4 and asked_for("listing") == listed, backend.calls
    # Its two processes, listed since before the sweep's read and with no sample, are idle:
    # the watch reads no samples for them.
    assert asked_for("processes") == sampled
    backend.memory += GIB  # a context came
    reader.watch(0, lambda pids: {})
    assert asked_for("listing") == listed + 1


def accounted(pid: int, start_s: int, running: bool = False) -> AccountingRecord:
    return AccountingRecord(pid, start_s * S, 0.0 if running else 1.0, running, 0.5, 0.0)


def test_accounting_is_asked_only_of_processes_that_ended_since_the_last_read() -> None:
    # The FakeBackend lists PIDs 1 and 2; NVML's buffer holds what ran before the agent too.
    backend, clock = FakeBackend(), [0.0]
    reader = reader_of(backend, clock)
    off = swept(reader)
    assert off is not None and off.device.accounting_mode is False
    backend.accounting = {pid: accounted(pid, 10) for pid in range(100, 140)} | {1: accounted(1, 90, running=True)}
    first = swept(reader)
    # The buffer as first found is history: not asked about at all (4,000 PIDs on an H200).
    assert first is not None and first.device.accounting_mode is True and asked(backend, "accounting") == []
    backend.accounting |= {7: accounted(7, 98), 8: accounted(8, 99, running=True)}
    backend.now += 2 * S
    swept(reader)
    # The new ones, not the listed ones (running: their samples serve), nor the history.
    assert asked(backend, "accounting") == [7, 8]
    backend.now += 2 * S
    swept(reader)
    # 7's record was taken; 8 still runs, and is asked again until it ends.
    assert asked(backend, "accounting") == [7, 8, 8]
