"""Each GPU's health, GPM efficiency and XID errors, on the simulated node, as a scrape shows
them (in process, on a clock the test moves): every family, the cases it is left out, and
what the scenario injects (XID errors and storms, ECC errors, throttling)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from otel_vgpu.agent_health import AgentHealth, Stage
from otel_vgpu.collect.aggregate import GpuRow, PodRow, Snapshot, pod_key
from otel_vgpu.collect.device_health import DeviceHealth
from otel_vgpu.collect.gpm import Gpm, step
from otel_vgpu.collect.reading import GpuReader, Read
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.collect.xids import MAX_XID_EVENTS_PER_S, OTHER, XidCounts, XidWatch, take_round
from otel_vgpu.export.exposition import TEXT
from otel_vgpu.export.families import FAMILIES, selected
from otel_vgpu.export.figure_families import HEALTH_FAMILIES
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.gpu.backend import Device, ErrorCode, FailedRead, GpuError, HealthReading, XidEvent
from otel_vgpu.gpu.device_figures import GPM_TABLE, HEALTH_FIGURES, HEALTH_TABLE, MAX_XID_CODES
from otel_vgpu.sim.device_figure_values import SIMULATED
from otel_vgpu.sim.node import SimulatedNode
from testkit.agent import wait_until
from testkit.clock import Clock
from testkit.promtext import Exposition, parse
from testkit.rows import pod_row

from ...conftest import hand_clocked, make_sampler

pytestmark = pytest.mark.unit
T = TypeVar("T")

H100 = "NVIDIA H100 80GB HBM3"
WINDOW_S = 10.0


@dataclass
class Node:
    node: SimulatedNode
    clock: Clock
    sampler: Sampler
    telemetry: Telemetry
    xids: XidCounts

    def scrape(self) -> Exposition:
        return parse(self.telemetry.render(TEXT).decode())

    def after(self, seconds: float) -> Exposition:
        """A scrape `seconds` later, with a sweep every 2 s between."""
        end = self.clock.t + seconds
        while self.clock.t + 2.0 <= end:
            self.clock.t += 2.0
            self.sampler.snapshot(0.0)
        self.clock.t = end
        return self.scrape()


@contextmanager
def simulated(tmp_path: Path, text: str, families: tuple[str, ...] = ()) -> Iterator[Node]:
    """The scenario `text` on a clock the test moves, scraped in process; `families`: a denylist."""
    clock, node, ratio = hand_clocked(tmp_path, text)
    kept, _ = selected(deny=list(families))
    reads = frozenset(read for family in kept for read in family.reads)
    health = AgentHealth()
    sampler = make_sampler(
        node, ratio, health=health, clock=clock.monotonic, reader=GpuReader(node, clock.monotonic, reads=reads)
    )
    xids = XidCounts()
    devices = DeviceHealth(sampler, health, clock.monotonic) if Read.HEALTH in reads else None
    telemetry = Telemetry(sampler, health, 1.0, "n", False, families=kept, devices=devices, xids=xids)
    try:
        yield Node(node, clock, sampler, telemetry, xids)
    finally:
        telemetry.shutdown()
        node.close()


def gpus(*specs: str) -> str:
    return "gpus:\n" + "".join(f"  - {{{spec}}}\n" for spec in specs)


def pods(*pods: tuple[str, str]) -> str:
    """Pods, each (name, its processes' specs)."""
    return "pods:\n" + "".join(f"  - {{name: {name}, processes: [{processes}]}}\n" for name, processes in pods)


def two_h100s(events: Sequence[str], faults: Sequence[str] = ()) -> str:
    """Two H100s with these health events and faults, each a YAML flow mapping."""
    text = gpus(f"model: {H100}", f"model: {H100}") + "health_events:\n" + "".join(f"  - {e}\n" for e in events)
    return text + ("faults:\n" + "".join(f"  - {f}\n" for f in faults) if faults else "")


def one(exposition: Exposition, family: str, gpu: str = "0") -> float:
    return exposition.by(family, "gpu_id")[(gpu,)]


# --- health ---------------------------------------------------------------------------------


def test_an_idle_and_a_busy_gpus_health_as_nvml_would_give_it(tmp_path: Path) -> None:
    text = gpus(f"model: {H100}", f"model: {H100}") + pods(("busy", "{gpu: 1, memory: 1GiB, sm: 1.0}"))
    with simulated(tmp_path, text) as node:
        seen = node.after(2.0)
    # Idle: 345 MHz, 30 °C, 75 W, the idle bit; busy at full SM: 1,980 MHz, 75 °C, 700 W (sim/device_figure_values.py).
    assert one(seen, "vgpu_gpu_sm_clock_hertz") == 345e6 and one(seen, "vgpu_gpu_sm_clock_hertz", "1") == 1980e6
    assert one(seen, "vgpu_gpu_memory_clock_hertz") == 3201e6
    assert one(seen, "vgpu_gpu_temperature_celsius") == 30 and one(seen, "vgpu_gpu_temperature_celsius", "1") == 75
    assert one(seen, "vgpu_gpu_memory_temperature_celsius", "1") == 79
    assert one(seen, "vgpu_gpu_power_watts") == 75 and one(seen, "vgpu_gpu_power_watts", "1") == 700
    assert one(seen, "vgpu_gpu_power_limit_watts") == 700
    assert one(seen, "vgpu_gpu_clock_event_reasons") == 0x1 and one(seen, "vgpu_gpu_clock_event_reasons", "1") == 0
    for counter in ("pcie_replays", "ecc_corrected", "ecc_uncorrected", "remapped_rows_correctable"):
        assert seen.types[f"vgpu_gpu_{counter}"] == "counter"
        assert one(seen, f"vgpu_gpu_{counter}_total") == 0
    assert one(seen, "vgpu_gpu_remapped_rows_failure") == 0 and one(seen, "vgpu_gpu_remapped_rows_pending") == 0


def test_a_figure_the_gpu_does_not_report_is_left_out_never_zero(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = gpus(f"model: {H100}, unsupported: [memory.temperature, pcie.replays], ecc: false")
    with simulated(tmp_path, text) as node:
        seen = node.after(2.0)
    assert "vgpu_gpu_memory_temperature_celsius" not in seen.values
    assert "vgpu_gpu_pcie_replays_total" not in seen.values
    # ECC off: NVML gives no counts (nvmlDeviceGetTotalEccErrors requires ECC mode).
    assert "vgpu_gpu_ecc_corrected_total" not in seen.values and "vgpu_gpu_ecc_uncorrected_total" not in seen.values
    assert one(seen, "vgpu_gpu_temperature_celsius") == 30


def test_throttling_ecc_errors_replays_and_remaps_as_the_scenario_injects_them(tmp_path: Path) -> None:
    text = (
        gpus(f"model: {H100}") + pods(("busy", "{gpu: 0, memory: 1GiB, sm: 1.0}")) + "health_events:\n"
        "  - {gpu: 0, from_s: 3, to_s: 9, throttle: [sw_thermal, hw_slowdown]}\n"
        "  - {gpu: 0, at_s: 5, ecc: corrected, count: 7}\n"
        "  - {gpu: 0, at_s: 5, ecc: uncorrected, count: 2}\n"
        "  - {gpu: 0, at_s: 5, pcie_replays: 3}\n"
        "  - {gpu: 0, at_s: 5, remap: uncorrectable}\n"
        "  - {gpu: 0, at_s: 5, remap: pending}\n"
    )
    with simulated(tmp_path, text) as node:
        before = node.after(2.0)
        during = node.after(4.0)  # t = 6
        after = node.after(6.0)  # t = 12
    assert one(before, "vgpu_gpu_clock_event_reasons") == 0
    assert int(one(during, "vgpu_gpu_clock_event_reasons")) == 0x20 | 0x8
    assert one(during, "vgpu_gpu_sm_clock_hertz") == pytest.approx(1980e6 * 0.6)
    assert one(during, "vgpu_gpu_temperature_celsius") == 90
    # Held down for heat from 3 s: 3 s at 6, the whole 6 s once over.
    assert one(during, "vgpu_gpu_thermal_violation_seconds_total") == pytest.approx(3.0)
    assert one(after, "vgpu_gpu_thermal_violation_seconds_total") == pytest.approx(6.0)
    assert one(after, "vgpu_gpu_power_violation_seconds_total") == 0
    assert one(after, "vgpu_gpu_clock_event_reasons") == 0
    assert (one(after, "vgpu_gpu_ecc_corrected_total"), one(after, "vgpu_gpu_ecc_uncorrected_total")) == (7, 2)
    assert one(after, "vgpu_gpu_pcie_replays_total") == 3
    assert one(after, "vgpu_gpu_remapped_rows_uncorrectable_total") == 1
    assert one(after, "vgpu_gpu_remapped_rows_pending") == 1 and one(after, "vgpu_gpu_remapped_rows_failure") == 0


def test_the_simulated_driver_gives_each_figure_of_the_table_and_no_other(tmp_path: Path) -> None:
    # A figure the scenario does not move reads 0 there, as on a quiet GPU: an entry of the table
    # alone puts it on the simulated node.
    assert set(SIMULATED) <= set(HEALTH_FIGURES)
    videoless = "lacks: [encoder, decoder, jpeg, optical_flow]"
    text = gpus("model: NVIDIA L4", f"model: {H100}, {videoless}", f"model: {H100}")
    with simulated(tmp_path, text) as node:
        node.after(2.0)
        reading, lacking, hopper = (node.node.health(index) for index in range(3))
    assert sorted(reading.figures) == sorted(HEALTH_FIGURES) and reading.failed == ()
    # A GPU without an engine has no figure of it, as the NVML backend leaves them out: where
    # the scenario says it lacks the engine, and where its model has none (an H100, no encoder).
    assert sorted(lacking.figures) == sorted(figure.name for figure in HEALTH_TABLE if not figure.engine)
    assert sorted(hopper.figures) == sorted(figure.name for figure in HEALTH_TABLE if figure.engine != "encoder")


def test_a_read_that_fails_costs_its_figures_alone_counted_once_a_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An H100's: no family of a figure of a video engine (its model has no encoder).
    of_engines = {HEALTH_FAMILIES[figure.name].prometheus_name for figure in HEALTH_TABLE if figure.engine}
    health_families = [
        f.prometheus_name for f in FAMILIES if Read.HEALTH in f.reads and f.prometheus_name not in of_engines
    ]
    with simulated(tmp_path, gpus(f"model: {H100}", f"model: {H100}")) as node:
        read = node.node.health
        failing: list[int] = []  # GPU 0's readings whose power read failed

        def power_failing(index: int) -> HealthReading:
            reading = read(index)
            if index != 0 or len(failing) == 2:
                return reading
            failing.append(index)
            error = GpuError(ErrorCode.UNKNOWN, "simulated: the power read failed")
            kept = {name: value for name, value in reading.figures.items() if name != "power"}
            return HealthReading(kept, (FailedRead(("power",), error),))

        node.node.health = power_failing  # type: ignore[method-assign]
        with caplog.at_level(logging.INFO):
            served = [node.after(2.0) for _ in range(3)]
    assert len(failing) == 2
    for seen in served[:2]:
        # GPU 0 has every health family but its power's; GPU 1 has all of them.
        assert [f for f in health_families if ("0",) not in seen.by(f, "gpu_id")] == ["vgpu_gpu_power_watts"]
        assert all(("1",) in seen.by(f, "gpu_id") for f in health_families)
    assert ("0",) in served[2].by("vgpu_gpu_power_watts", "gpu_id"), "read again, and back"
    errors = [seen.by("vgpu_agent_collection_errors_total", "stage")[("device_health",)] for seen in served]
    assert errors == [1, 2, 2], "once a read that failed"
    # The health reader's pass failed while a figure was missing, and succeeded once none was.
    success = [seen.by("vgpu_agent_reader_success", "reader").get(("health",)) for seen in served]
    assert success == [0, 0, 1]
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if m.startswith("GPU 0: health figures power: simulated")]) == 1
    assert "device_health recovered (0:power:UNKNOWN)" in messages


def test_health_is_read_once_per_collection_not_every_sweep(tmp_path: Path) -> None:
    text = gpus(f"model: {H100}")
    with simulated(tmp_path, text) as node:
        calls: list[int] = []
        node.node.health = counting(calls, node.node.health)  # type: ignore[method-assign]
        for _ in range(10):  # ten sweeps, 2 s apart
            node.clock.t += 2.0
            node.sampler.snapshot(0.0)
        assert calls == []
        node.scrape()
        assert calls == [0]


def test_a_cadence_started_before_the_first_sweep_reads_the_gpus_once_it_has_swept(tmp_path: Path) -> None:
    # As the agent starts them: the health thread beside the first sweep, which runs on its own
    # thread; a round that finds no sweep yet must not leave the health families out for a
    # whole cadence (an hour here, so that only a round asked again soon can pass).
    clock, node, ratio = hand_clocked(tmp_path, gpus(f"model: {H100}"))
    health = AgentHealth()
    sampler = make_sampler(node, ratio, health=health, clock=clock.monotonic)
    devices = DeviceHealth(sampler, health, clock.monotonic, every_s=3600.0)
    calls: list[int] = []
    node.health = counting(calls, node.health)  # type: ignore[method-assign]
    looked: list[bool] = []  # each round's look for the last sweep: whether it found one
    latest = sampler.latest

    def looking() -> Snapshot | None:
        found = latest()
        looked.append(found is not None)
        return found

    sampler.latest = looking  # type: ignore[method-assign]
    try:
        devices.start()
        wait_until(lambda: looked, what="a round before the first sweep")
        assert looked[0] is False and calls == []
        clock.t += 2.0
        sampler.snapshot(0.0)
        rows = wait_until(lambda: devices.rows(max_age=3600.0), what="the GPU's health after the first sweep")
        assert [row.gpu.index for row in rows] == [0] and "temperature" in rows[0].figures
        assert calls == [0], "read once, then at the cadence"
    finally:
        devices.stop()
        node.close()


def test_while_the_driver_is_paused_no_health_is_read_and_its_counters_restart_after(tmp_path: Path) -> None:
    text = gpus(f"model: {H100}") + "health_events:\n  - {gpu: 0, at_s: 1, ecc: corrected, count: 4}\n"
    with simulated(tmp_path, text) as node:
        assert one(node.after(2.0), "vgpu_gpu_ecc_corrected_total") == 4
        node.sampler.pause("nvidia.com/gpu.deploy.driver=paused-for-driver-upgrade")
        paused = node.after(2.0)
        assert "vgpu_gpu_ecc_corrected_total" not in paused.values
        node.sampler.resume()
        # The driver reloaded: its volatile counters start from 0, as NVML's do.
        assert one(node.after(2.0), "vgpu_gpu_ecc_corrected_total") == 0


def test_a_health_family_turned_off_costs_no_call(tmp_path: Path) -> None:
    health_families = "|".join(f.prometheus_name for f in FAMILIES if Read.HEALTH in f.reads)
    with simulated(tmp_path, gpus(f"model: {H100}"), families=(health_families,)) as node:
        calls: list[int] = []
        node.node.health = counting(calls, node.node.health)  # type: ignore[method-assign]
        seen = node.after(4.0)
    assert calls == [] and "vgpu_gpu_temperature_celsius" not in seen.values


def test_each_gpu_read_has_an_info_series_with_the_driver_version_and_its_pci_bus_id(tmp_path: Path) -> None:
    text = gpus(f"model: {H100}", f"model: {H100}") + "driver: {version: 550.90.07}\n"
    with simulated(tmp_path, text) as node:
        seen = node.after(2.0)
        uuids = [gpu.uuid for gpu in node.node.scenario.gpus]
    assert seen.by("vgpu_gpu_info", "gpu_id", "gpu_uuid", "gpu_model", "driver_version", "pci_bus_id") == {
        ("0", uuids[0], H100, "550.90.07", "00000000:18:00.0"): 1,
        ("1", uuids[1], H100, "550.90.07", "00000000:30:00.0"): 1,
    }
    assert seen.types["vgpu_gpu_info"] == "gauge"


# --- XID errors -------------------------------------------------------------------------


def test_xid_errors_are_counted_per_gpu_and_code(tmp_path: Path) -> None:
    counts = XidCounts()
    counts.add([XidEvent(0, "GPU-a", 79), XidEvent(0, "GPU-a", 13), XidEvent(0, "GPU-a", 13), XidEvent(1, "GPU-b", 79)])
    assert {(c.gpu_uuid, c.xid): c.count for c in counts.rows()} == {
        ("GPU-a", "79"): 1,
        ("GPU-a", "13"): 2,
        ("GPU-b", "79"): 1,
    }


def test_each_gpu_keeps_the_code_of_its_latest_xid_whatever_the_code_bound(tmp_path: Path) -> None:
    counts = XidCounts()
    counts.add([XidEvent(0, "GPU-a", 79), XidEvent(0, "GPU-a", 13), XidEvent(1, "GPU-b", 48)])
    counts.add([XidEvent(0, "GPU-a", code) for code in range(100, 100 + MAX_XID_CODES)])
    # GPU-a's last code is counted as `other`, past the bound; the last is the code all the same.
    assert {(c.gpu_uuid, c.last) for c in counts.rows()} == {("GPU-a", 99 + MAX_XID_CODES), ("GPU-b", 48)}


def test_a_gpu_naming_many_codes_has_at_most_the_bound_of_series(tmp_path: Path) -> None:
    counts = XidCounts()
    counts.add([XidEvent(0, "GPU-a", code) for code in range(1, 101)])
    codes = {c.xid: c.count for c in counts.rows()}
    assert len(codes) == MAX_XID_CODES + 1 and codes[OTHER] == 100 - MAX_XID_CODES
    assert sum(codes.values()) == 100


def test_an_xid_error_reaches_the_scrape_through_the_watch(tmp_path: Path) -> None:
    text = gpus(f"model: {H100}", f"model: {H100}") + "health_events:\n  - {gpu: 1, at_s: 1, xid: 79}\n"
    with simulated(tmp_path, text) as node:
        node.after(2.0)  # the driver is opened by a sweep
        watch = XidWatch(node.node, node.xids, AgentHealth(), node.sampler.gpu_indices)
        watch.start()
        try:
            deadline = time.monotonic() + 30
            while not node.xids.rows() and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            watch.stop()
        seen = node.after(2.0)  # the next sweep's collection
    assert seen.by("vgpu_gpu_xid_errors_total", "gpu_id", "xid") == {("1", "79"): 1}
    assert seen.types["vgpu_gpu_xid_errors"] == "counter"
    # The latest code as a value, 0 on the GPU that has had none.
    assert seen.by("vgpu_gpu_xid_last", "gpu_id") == {("0",): 0, ("1",): 79}
    assert seen.types["vgpu_gpu_xid_last"] == "gauge"


def test_an_xid_storm_is_counted_at_a_bounded_rate_and_all_of_it_in_the_end(tmp_path: Path) -> None:
    storm = 3000
    text = gpus(f"model: {H100}") + f"health_events:\n  - {{gpu: 0, at_s: 0, xid: 13, count: {storm}}}\n"
    with simulated(tmp_path, text) as node:
        node.after(0.0)
        most = 1000
        counts = XidCounts()
        watch = XidWatch(node.node, counts, AgentHealth(), node.sampler.gpu_indices, most_per_s=most)
        started = time.monotonic()
        watch.start()
        try:
            counted, deadline = 0, started + 60
            while counted < storm and time.monotonic() < deadline:
                counted = sum(c.count for c in counts.rows())
                # Never more than the rate allows, however fast this machine is: a round's
                # worth for every second begun.
                seconds_begun = int(time.monotonic() - started) + 1
                assert counted <= seconds_begun * most, (counted, seconds_begun)
                time.sleep(0.01)
        finally:
            watch.stop()
    assert counted == storm
    # and it took the throttle's time: at least storm / most - 1 seconds
    assert time.monotonic() - started >= storm / most - 1


def test_a_storm_on_one_gpu_holds_back_no_other_gpus_xid(tmp_path: Path) -> None:
    # 3x10^6 events on GPU 0, happening (and listed) before GPU 1's XID 79: in one queue for
    # every GPU, the 79 waited for the whole storm, 25 minutes at 2,000 events a second.
    bound = 10 * MAX_XID_EVENTS_PER_S
    storm = ["{gpu: 0, at_s: 1, xid: 13, count: 1000000}"] * 3  # a scenario's event holds at most 10^6
    text = two_h100s([*storm, "{gpu: 1, at_s: 1, xid: 79}"])
    with simulated(tmp_path, text) as node:
        node.after(2.0)
        first, second = (gpu.uuid for gpu in node.node.scenario.gpus)
        watch = XidWatch(node.node, node.xids, AgentHealth(), node.sampler.gpu_indices)
        watch.start()
        try:
            # Until the 79 is counted, or the storm has had ten rounds' worth (a safety deadline
            # only: nothing is asserted of the time).
            counts, deadline = counts_of(node.xids), time.monotonic() + 120
            while (second, "79") not in counts and counts.get((first, "13"), 0) <= bound:
                assert time.monotonic() < deadline, counts
                time.sleep(0.01)
                counts = counts_of(node.xids)
        finally:
            watch.stop()
    assert counts.get((second, "79")) == 1, counts
    assert counts.get((first, "13"), 0) <= bound  # under 1 % of the storm was taken before it


def test_a_round_takes_each_gpus_few_events_at_its_first_turn_and_the_storm_at_the_rate(tmp_path: Path) -> None:
    text = two_h100s(
        ["{gpu: 0, at_s: 1, xid: 13, count: 10000}", "{gpu: 1, at_s: 1.5, xid: 48}", "{gpu: 1, at_s: 1, xid: 79}"]
    )
    with simulated(tmp_path, text) as node:
        node.after(2.0)
        first, second = (gpu.uuid for gpu in node.node.scenario.gpus)
        watch = XidWatch(node.node, node.xids, AgentHealth(), node.sampler.gpu_indices, most_per_s=1000)
        one_round = watch.take()
        after_one = counts_of(node.xids)
        watch.take()
        after_two = counts_of(node.xids)
    assert one_round.taken == {0: 998, 1: 2} and one_round.cut == (0,) and one_round.failed == {}
    assert after_one == {(first, "13"): 998, (second, "79"): 1, (second, "48"): 1}
    assert after_two[(first, "13")] == 1998  # the storm goes on at the rate, round by round


def test_the_simulated_driver_delivers_each_gpus_events_in_the_order_they_happen(tmp_path: Path) -> None:
    # Listed out of order, and GPU 0's first: GPU 1's set has only its own, the earlier first.
    text = two_h100s(["{gpu: 0, at_s: 1, xid: 13}", "{gpu: 1, at_s: 1.5, xid: 48}", "{gpu: 1, at_s: 1, xid: 79}"])
    with simulated(tmp_path, text) as node:
        node.after(2.0)
        uuid = node.node.scenario.gpus[1].uuid
        taken = [node.node.xid_events(1, 1), node.node.xid_events(1, 1), node.node.xid_events(1, 1)]
    assert taken == [[XidEvent(1, uuid, 79)], [XidEvent(1, uuid, 48)], []]


def test_a_lost_gpus_event_set_failing_leaves_the_other_gpus_events_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = two_h100s(["{gpu: 0, at_s: 3, xid: 31}"], ["{call: all, gpu: 1, code: GPU_IS_LOST, from_s: 3}"])
    with simulated(tmp_path, text) as node:
        node.after(4.0)  # GPU 1 is lost from the sweep at 4 s; its event set still looked at
        health = AgentHealth()
        watch = XidWatch(node.node, node.xids, health, node.sampler.gpu_indices)
        with caplog.at_level(logging.WARNING):
            first_round, _ = watch.take(), watch.take()
        assert node.sampler.gpu_indices() == (0, 1)
    assert first_round.failed[1].code is ErrorCode.GPU_IS_LOST and first_round.taken == {0: 1, 1: 0}
    assert counts_of(node.xids) == {(node.node.scenario.gpus[0].uuid, "31"): 1}
    assert health.counts()[Stage.XID_EVENTS] == 2  # each round's failure counted...
    assert len([r for r in caplog.records if "XID events of GPU 1" in r.getMessage()]) == 1  # ...said once


def test_rounds_take_turns_a_slice_at_a_time_until_each_gpu_is_drained_or_the_budget_spent() -> None:
    queued = {0: 10_000, 1: 1, 2: 70}
    asked: list[tuple[int, int]] = []

    def take(index: int, most: int) -> list[XidEvent]:
        asked.append((index, most))
        if index == 3:
            raise GpuError(ErrorCode.GPU_IS_LOST, "fallen off the bus")
        got = min(most, queued[index])
        queued[index] -= got
        return [XidEvent(index, f"GPU-{index}", 13)] * got

    counted = XidCounts()
    done = take_round(take, [0, 3, 1, 2], counted.add, most=200, slice_of=64)
    assert asked == [(0, 64), (3, 64), (1, 64), (2, 64), (0, 64), (2, 7), (0, 1)]
    assert done.taken == {0: 129, 3: 0, 1: 1, 2: 70} and done.cut == (0,) and set(done.failed) == {3}
    assert sum(row.count for row in counted.rows()) == 200


def test_a_gpu_lost_after_its_xid_79_keeps_the_series_and_says_it_is_lost_until_the_end(tmp_path: Path) -> None:
    # GPU 1 falls off the bus at 10 s (XID 79) and answers GPU_IS_LOST from 12 s on; scraped every 15 s.
    text = two_h100s(["{gpu: 1, at_s: 10, xid: 79}"], ["{call: all, gpu: 1, code: GPU_IS_LOST, from_s: 12}"])
    with simulated(tmp_path, text) as node:
        uuid = node.node.scenario.gpus[1].uuid
        before = node.after(10.0)
        assert before.by("vgpu_gpu_lost", "gpu_id") == {("0",): 0, ("1",): 0}
        count_xids(node, lambda counts: counts.get((uuid, "79")) == 1)
        scrapes = [node.after(15.0 - node.clock.t)]
        while node.clock.t < 120.0:
            scrapes.append(node.after(15.0))
    assert len(scrapes) == 8  # 15 s to 120 s
    for seen in scrapes:
        assert gpus_read(seen) == {"0"}  # GPU 1's other series are gone...
        assert seen.by("vgpu_gpu_lost", "gpu_id", "gpu_uuid", "gpu_model") == {
            ("0", node.node.scenario.gpus[0].uuid, H100): 0,
            ("1", uuid, H100): 1,
        }
        # ...its XID series stays, under the labels it had when it was read.
        assert seen.by("vgpu_gpu_xid_errors_total", "gpu_id", "gpu_uuid", "gpu_model", "xid") == {
            ("1", uuid, H100, "79"): 1
        }
        assert seen.by("vgpu_gpu_xid_last", "gpu_id", "gpu_uuid") == {
            ("0", node.node.scenario.gpus[0].uuid): 0,
            ("1", uuid): 79,
        }
        # ...and so does its info, which dcgm-exporter's names put on the XID series.
        assert (
            seen.by("vgpu_gpu_info", "gpu_id", "pci_bus_id", "driver_version")[("1", "00000000:30:00.0", "580.159.04")]
            == 1
        )


def test_a_lost_gpu_that_returns_goes_on_counting_its_xids(tmp_path: Path) -> None:
    text = two_h100s(
        ["{gpu: 1, at_s: 4, xid: 79}", "{gpu: 1, at_s: 40, xid: 79}"],
        ["{call: all, gpu: 1, code: GPU_IS_LOST, from_s: 6, to_s: 30}"],
    )
    with simulated(tmp_path, text) as node:
        uuid = node.node.scenario.gpus[1].uuid
        node.after(4.0)
        count_xids(node, lambda counts: counts.get((uuid, "79")) == 1)
        lost = node.after(16.0)  # t = 20
        back = node.after(20.0)  # t = 40
        count_xids(node, lambda counts: counts.get((uuid, "79")) == 2)
        later = node.after(2.0)
    assert one(lost, "vgpu_gpu_lost", "1") == 1 and one(lost, "vgpu_gpu_xid_errors_total", "1") == 1
    assert one(back, "vgpu_gpu_lost", "1") == 0 and one(back, "vgpu_gpu_xid_errors_total", "1") == 1
    assert gpus_read(back) == {"0", "1"}
    assert one(later, "vgpu_gpu_xid_errors_total", "1") == 2  # never reset by the loss


def test_while_no_gpu_can_be_listed_every_known_gpu_is_lost_and_keeps_its_xids(tmp_path: Path) -> None:
    text = two_h100s(
        ["{gpu: 0, at_s: 1, xid: 48}"], ["{call: device_count, code: DRIVER_NOT_LOADED, from_s: 5, to_s: 9}"]
    )
    with simulated(tmp_path, text) as node:
        node.after(2.0)
        count_xids(node, lambda counts: counts.get((node.node.scenario.gpus[0].uuid, "48")) == 1)
        away = node.after(4.0)  # t = 6
        back = node.after(4.0)  # t = 10
    assert gpus_read(away) == set()
    assert away.by("vgpu_gpu_lost", "gpu_id") == {("0",): 1, ("1",): 1}
    assert away.by("vgpu_gpu_xid_errors_total", "gpu_id", "xid") == {("0", "48"): 1}
    assert back.by("vgpu_gpu_lost", "gpu_id") == {("0",): 0, ("1",): 0}


def test_while_the_driver_is_paused_no_gpu_is_lost_nor_has_xid_series(tmp_path: Path) -> None:
    text = gpus(f"model: {H100}") + "health_events:\n  - {gpu: 0, at_s: 1, xid: 48}\n"
    with simulated(tmp_path, text) as node:
        node.after(2.0)
        count_xids(node, bool)
        node.sampler.pause("nvidia.com/gpu.deploy.driver=paused-for-driver-upgrade")
        paused = node.after(2.0)
        node.sampler.resume()
        resumed = node.after(2.0)
    assert "vgpu_gpu_lost" not in paused.values and "vgpu_gpu_xid_errors_total" not in paused.values
    assert one(resumed, "vgpu_gpu_lost") == 0 and one(resumed, "vgpu_gpu_xid_errors_total") == 1


# --- GPM ----------------------------------------------------------------------------------


def test_a_pod_alone_on_its_gpu_gets_the_gpus_gpm_figures(tmp_path: Path) -> None:
    text = gpus(f"model: {H100}") + pods(("trainer", "{gpu: 0, memory: 1GiB, sm: 0.9, tensor: 0.8, dram: 0.2}"))
    with simulated(tmp_path, text) as node:
        node.after(2.0)  # opens the window
        seen = node.after(WINDOW_S)
        later = node.after(WINDOW_S)
    assert one(seen, "vgpu_gpu_tensor_active_ratio") == pytest.approx(0.8)
    assert one(seen, "vgpu_gpu_dram_active_ratio") == pytest.approx(0.2)
    assert one(seen, "vgpu_gpu_sm_active_ratio") == pytest.approx(0.9)
    assert one(seen, "vgpu_gpu_graphics_active_ratio") == pytest.approx(0.9)
    mine = seen.by("vgpu_pod_tensor_active_ratio", "pod")
    assert mine == {("trainer",): pytest.approx(0.8)}
    assert seen.by("vgpu_pod_dram_active_ratio", "pod") == {("trainer",): pytest.approx(0.2)}
    # Busy seconds: the figure times the window's seconds, window by window.
    busy = [one(e, "vgpu_gpu_tensor_busy_seconds_total") for e in (seen, later)]
    assert busy[1] - busy[0] == pytest.approx(0.8 * WINDOW_S)
    assert one(later, "vgpu_gpu_gpm_shared_windows_total") == 0
    assert one(seen, "vgpu_gpu_pcie_transmit_bytes_per_second") > 0
    assert "vgpu_gpu_nvlink_transmit_bytes_per_second" not in seen.values  # this GPU has no NVLink


# A HELP that reads as a sentence: a capital (or a figure: "1 while ...") first, a full stop
# last, and none of the seams that text assembled from fragments leaves ("The pod's the share
# of", "a the", doubled spaces).
SEAMS = re.compile(r"\b(?:the|a|an|its)\s+(?:the|a|an|its)\b|'s\s+(?:the|a|an)\b|\s{2,}|\s[,.;:]|\.\.")


def test_every_help_the_agent_serves_is_a_sentence(tmp_path: Path) -> None:
    # A pod alone on a Hopper GPU, and a process of no pod on another: the pods', the GPUs'
    # (health and GPM included) and the agent's own families are all served.
    text = gpus(f"model: {H100}", f"model: {H100}") + pods(
        ("trainer", "{gpu: 0, memory: 1GiB, sm: 0.9, tensor: 0.8, dram: 0.2}")
    )
    with simulated(tmp_path, text) as node:
        node.after(2.0)
        served = node.after(WINDOW_S)
    helps = {name: text for name, text in served.help.items() if name.startswith("vgpu_")}
    for prefix in ("vgpu_pod_", "vgpu_gpu_", "vgpu_agent_"):
        assert any(name.startswith(prefix) for name in helps), prefix
    assert "vgpu_pod_tensor_active_ratio" in helps and "vgpu_gpu_temperature_celsius" in helps
    for name, help_text in helps.items():
        assert help_text[:1].isupper() or help_text[:1].isdigit(), (name, help_text)  # "1 while ..."
        assert help_text.endswith((".", ".)")), (name, help_text)
        assert not SEAMS.search(help_text), (name, SEAMS.search(help_text), help_text)


def test_pods_sharing_a_gpu_get_no_gpm_figure_and_the_windows_are_counted(tmp_path: Path) -> None:
    text = gpus(f"model: {H100}") + pods(
        ("trainer", "{gpu: 0, memory: 1GiB, sm: 0.5, tensor: 0.4}"),
        ("loader", "{gpu: 0, memory: 1GiB, sm: 0.0, dram: 0.6}"),  # copies only: no SM, yet DRAM
    )
    with simulated(tmp_path, text) as node:
        node.after(2.0)
        seen = node.after(WINDOW_S)
        later = node.after(WINDOW_S)
    assert one(seen, "vgpu_gpu_tensor_active_ratio") == pytest.approx(0.4)
    assert one(seen, "vgpu_gpu_dram_active_ratio") == pytest.approx(0.6)
    assert "vgpu_pod_tensor_active_ratio" not in seen.values and "vgpu_pod_dram_active_ratio" not in later.values
    assert one(seen, "vgpu_gpu_gpm_shared_windows_total") == 1
    assert one(later, "vgpu_gpu_gpm_shared_windows_total") == 2


def test_a_process_of_no_pod_beside_a_pod_leaves_the_pod_without_gpm(tmp_path: Path) -> None:
    text = (
        gpus(f"model: {H100}")
        + pods(("trainer", "{gpu: 0, memory: 1GiB, sm: 0.5, tensor: 0.4}"))
        + "host_processes:\n  - {gpu: 0, memory: 1GiB, dram: 0.5}\n"
    )
    with simulated(tmp_path, text) as node:
        node.after(2.0)
        seen = node.after(WINDOW_S)
    assert "vgpu_pod_tensor_active_ratio" not in seen.values
    assert one(seen, "vgpu_gpu_gpm_shared_windows_total") == 1


def test_a_pod_that_came_in_the_middle_of_a_window_shares_it() -> None:
    # a alone at the window's first sweep, b beside it at the second: the window is shared,
    # whoever is left at its close; the next window, a alone throughout, is a's.
    gpm = window_step(Gpm(), None, rows_of("a"))
    gpm = window_step(gpm, None, rows_of("a", "b"))
    gpm = window_step(gpm, {"tensor.active": 0.5}, rows_of("a"))
    assert gpm.pod_now == {} and gpm.shared_windows["GPU-a"] == 1
    gpm = window_step(gpm, None, rows_of("a"))
    gpm = window_step(gpm, {"tensor.active": 0.5}, rows_of("a"))
    assert {key[0]: figures for key, figures in gpm.pod_now.items()} == {"uid-a": {"tensor.active": 0.5}}
    assert gpm.shared_windows["GPU-a"] == 1


def test_a_pod_alone_at_every_sweep_shares_a_window_another_pod_lived_in_between_them() -> None:
    # b's processes lived between the sweeps: the ledger saw b, no sweep did.
    gpm = window_step(Gpm(), None, rows_of("a"), users=frozenset({"uid-a", "uid-b"}))
    gpm = window_step(gpm, {"tensor.active": 0.5}, rows_of("a"), users=frozenset({"uid-a"}))
    assert gpm.pod_now == {} and gpm.shared_windows["GPU-a"] == 1
    # A process of no pod seen between the sweeps, likewise.
    gpm = window_step(gpm, None, rows_of("a"), users=frozenset({"uid-a", ""}))
    gpm = window_step(gpm, {"tensor.active": 0.5}, rows_of("a"))
    assert gpm.pod_now == {} and gpm.shared_windows["GPU-a"] == 2


def test_a_pod_alone_whose_processes_do_not_explain_the_gpu_shares_its_window() -> None:
    # 8 of the GPU's 10 busy seconds went to no process: someone the watch missed ran.
    gpm = window_step(Gpm(), None, rows_of("a"), busy_seconds=5.0, unexplained_seconds=4.0)
    gpm = window_step(gpm, {"tensor.active": 0.5}, rows_of("a"), busy_seconds=5.0, unexplained_seconds=4.0)
    assert gpm.pod_now == {} and gpm.shared_windows["GPU-a"] == 1
    # Within the slack, the window is a's.
    gpm = window_step(gpm, None, rows_of("a"), busy_seconds=5.0, unexplained_seconds=0.1)
    gpm = window_step(gpm, {"tensor.active": 0.5}, rows_of("a"), busy_seconds=5.0, unexplained_seconds=0.1)
    assert {key[0] for key in gpm.pod_now} == {"uid-a"}


def test_a_gpu_before_hopper_has_no_gpm_family(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    text = gpus("model: NVIDIA A100-SXM4-80GB") + pods(("trainer", "{gpu: 0, memory: 1GiB, sm: 0.9, tensor: 0.8}"))
    with simulated(tmp_path, text) as node:
        node.after(2.0)
        seen = node.after(WINDOW_S)
    assert not [name for name in seen.values if any(f.name in name.replace("_", ".") for f in GPM_TABLE)]
    assert "vgpu_gpu_gpm_shared_windows_total" not in seen.values
    assert one(seen, "vgpu_gpu_temperature_celsius") > 0  # its health is there


def test_each_mig_instance_gives_its_figures_to_the_pod_that_holds_it(tmp_path: Path) -> None:
    text = gpus(
        f"model: {H100}, mig: [{{profile: 3g.40gb, memory: 40GiB, gpu_instance: 1}}, "
        "{profile: 3g.40gb, memory: 40GiB, gpu_instance: 2}]"
    ) + pods(
        ("left", "{gpu: 0, mig: 0, memory: 1GiB, sm: 0.9, tensor: 0.7}"),
        ("right", "{gpu: 0, mig: 1, memory: 1GiB, sm: 0.5, dram: 0.3}"),
    )
    with simulated(tmp_path, text) as node:
        node.after(2.0)
        seen = node.after(WINDOW_S)
    tensor = seen.by("vgpu_pod_tensor_active_ratio", "pod", "mig_profile")
    dram = seen.by("vgpu_pod_dram_active_ratio", "pod")
    assert tensor == {("left", "3g.40gb"): pytest.approx(0.7), ("right", "3g.40gb"): pytest.approx(0.0)}
    assert dram == {("left",): pytest.approx(0.0), ("right",): pytest.approx(0.3)}
    # The GPU as a whole: both instances' work.
    assert one(seen, "vgpu_gpu_tensor_active_ratio") == pytest.approx(0.7)
    # No per-process SM on MIG: GPM is the only per-pod activity figure there.
    assert "vgpu_pod_sm_utilization_ratio" not in seen.values
    assert seen.by("vgpu_pod_sm_active_ratio", "pod") == {("left",): pytest.approx(0.9), ("right",): pytest.approx(0.5)}


def test_gpm_turned_off_costs_no_gpm_call(tmp_path: Path) -> None:
    text = gpus(f"model: {H100}") + pods(("trainer", "{gpu: 0, memory: 1GiB, sm: 0.9}"))
    gpm_families = "|".join(f.prometheus_name for f in FAMILIES if Read.GPM in f.reads)
    with simulated(tmp_path, text, families=(gpm_families,)) as node:
        calls: list[int] = []
        node.node.gpm = counting(calls, node.node.gpm)  # type: ignore[method-assign]
        node.after(2 * WINDOW_S)
    assert calls == []


# helpers


def count_xids(node: Node, done: Callable[[dict[tuple[str, str], int]], bool]) -> None:
    """The XID watch run on the node until its counts, by (GPU UUID, code), are `done`: polled,
    at most 30 s; the simulated clock stands still meanwhile."""
    watch = XidWatch(node.node, node.xids, AgentHealth(), node.sampler.gpu_indices)
    watch.start()
    try:
        deadline = time.monotonic() + 30
        while not done(counts_of(node.xids)) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watch.stop()
    assert done(counts_of(node.xids)), counts_of(node.xids)


def counts_of(xids: XidCounts) -> dict[tuple[str, str], int]:
    return {(row.gpu_uuid, row.xid): row.count for row in xids.rows()}


def gpus_read(exposition: Exposition) -> set[str]:
    """The GPUs a sweep read, as their per-GPU series show them."""
    return {gpu for (gpu,) in exposition.by("vgpu_gpu_memory_total_bytes", "gpu_id")}


def counting(calls: list[int], function: Callable[..., T]) -> Callable[..., T]:
    """`function`, noting the GPU index of each call in `calls`."""

    def counted(index: int, *args: object) -> T:
        calls.append(index)
        return function(index, *args)

    return counted


def rows_of(*names: str) -> list[PodRow]:
    """A pod row with one process on GPU-a for each name."""
    return [pod_row(name) for name in names]


def window_step(gpm: Gpm, window: dict[str, float] | None, rows: list[PodRow], **gpu: Any) -> Gpm:
    """A sweep of GPU-a with these rows, closing a 10 s GPM window with `window`'s figures if
    given; `gpu`: the GPU row's other fields (what the ledger saw over the sweep's window)."""
    device = Device(0, "GPU-a", "H100", 80, 0, 0.5, gpm_window=window, gpm_seconds=10.0)
    row = GpuRow(device=device, vgpus=2.0, unattributed_memory=0, **gpu)
    return step(gpm, [row], rows, [pod_key(r) for r in rows])
