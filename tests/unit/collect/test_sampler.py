"""Sweeps: sharing, faults per GPU, the ratio file, logging once."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest

from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.collect.aggregate import Snapshot
from otel_vgpu.collect.reading import GpuReader
from otel_vgpu.gpu.backend import Device, ErrorCode, GpuError
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario import Scenario

from ...conftest import make_sampler

pytestmark = pytest.mark.unit


def counted(health: AgentHealth) -> dict[str, int]:
    """The failures counted so far, by stage."""
    return {stage.value: n for stage, n in health.counts().items() if n}


class SlowNode(SimulatedNode):
    """The simulated node with a slow device listing, to hold a sweep open."""

    delay = 0.3

    def device_count(self) -> int:
        time.sleep(self.delay)
        return super().device_count()


def test_concurrent_callers_share_one_sweep(steady: Scenario, tmp_path: Path, ratio_file: Path) -> None:
    node = SlowNode(steady, tmp_path / "proc")
    sampler = make_sampler(node, ratio_file)
    results: list[Snapshot] = []
    threads = [threading.Thread(target=lambda: results.append(sampler.snapshot(1.0))) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sampler.sweeps == 1
    assert len(results) == 16 and all(r is results[0] for r in results)


def test_a_slow_sweep_does_not_pile_up(steady: Scenario, tmp_path: Path, ratio_file: Path) -> None:
    # Sweeps slower than max_age: callers that waited take the sweep they
    # waited for instead of starting one each.
    node = SlowNode(steady, tmp_path / "proc")
    sampler = make_sampler(node, ratio_file)
    threads = [threading.Thread(target=sampler.snapshot, args=(0.0,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sampler.sweeps <= 2


def test_fresh_snapshot_is_reused_and_stale_one_replaced(node: SimulatedNode, ratio_file: Path) -> None:
    sampler = make_sampler(node, ratio_file)
    first = sampler.snapshot(10.0)
    assert sampler.snapshot(10.0) is first
    assert sampler.snapshot(0.0) is not first
    assert sampler.sweeps == 2


def test_one_failing_gpu_leaves_the_other_reported(
    node: SimulatedNode, ratio_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    health = AgentHealth()
    sampler = make_sampler(node, ratio_file, health=health)
    node.fail("device", 1, "GPU_IS_LOST")
    with caplog.at_level(logging.WARNING, logger="otel_vgpu"):
        first = sampler.snapshot(0.0)
        second = sampler.snapshot(0.0)
    for snapshot in (first, second):
        assert snapshot.ok
        assert [g.index for g in snapshot.gpus] == [0]
        assert {p.gpu_index for p in snapshot.pods} == {0}
        assert snapshot.errors and snapshot.errors[0][0] == "device"
    assert counted(health) == {"device": 2}
    assert sum("GPU_IS_LOST" in r.getMessage() for r in caplog.records) == 1

    node.fail("device", 1, None)
    with caplog.at_level(logging.INFO, logger="otel_vgpu"):
        healed = sampler.snapshot(0.0)
    assert [g.index for g in healed.gpus] == [0, 1] and healed.errors == ()
    assert any("recovered" in r.getMessage() for r in caplog.records)


def test_failed_process_listing_drops_that_gpus_pods(node: SimulatedNode, ratio_file: Path) -> None:
    sampler = make_sampler(node, ratio_file)
    node.fail("processes", 0, "UNKNOWN")
    snapshot = sampler.snapshot(0.0)
    assert [g.index for g in snapshot.gpus] == [0, 1]
    assert snapshot.gpus[0].unattributed_memory is None
    assert {p.gpu_index for p in snapshot.pods} == {1}


def test_failed_process_utilization_keeps_memory(node: SimulatedNode, ratio_file: Path) -> None:
    sampler = make_sampler(node, ratio_file)
    node.fail("utilization_samples", 0, "NOT_SUPPORTED")
    snapshot = sampler.snapshot(0.0)
    gpu0 = [p for p in snapshot.pods if p.gpu_index == 0]
    assert gpu0 and all(p.sm_utilization is None for p in gpu0)
    assert any(p.memory_used > 0 for p in gpu0)
    assert all(p.sm_utilization is not None for p in snapshot.pods if p.gpu_index == 1)
    assert [stage for stage, _ in snapshot.errors] == ["process_utilization"]


class NoGpus(SimulatedNode):
    def device_count(self) -> int:
        raise GpuError(ErrorCode.DRIVER_NOT_LOADED, "Driver Not Loaded")


def test_failed_sweep_serves_nothing_as_fresh(steady: Scenario, tmp_path: Path, ratio_file: Path) -> None:
    good = make_sampler(SimulatedNode(steady, tmp_path / "a"), ratio_file)
    assert good.snapshot(0.0).ok and good.fresh(60.0) is not None
    broken = make_sampler(NoGpus(steady, tmp_path / "b"), ratio_file)
    snapshot = broken.snapshot(0.0)
    assert not snapshot.ok and snapshot.pods == () and snapshot.gpus == ()
    assert snapshot.errors[0][0] == "device_count"
    kept = broken.fresh(60.0)
    assert kept is not None and not kept.ok and kept.pods == () and kept.gpus == (), "the failure, with no figure"


class Exploding(SimulatedNode):
    def device(self, index: int) -> Device:
        raise RuntimeError("bug")


def test_unexpected_exception_is_a_failed_sweep_not_a_crash(steady: Scenario, tmp_path: Path, ratio_file: Path) -> None:
    health = AgentHealth()
    sampler = make_sampler(Exploding(steady, tmp_path / "p"), ratio_file, health=health)
    snapshot = sampler.snapshot(0.0)
    assert not snapshot.ok
    assert counted(health) == {"sweep": 1}


def test_bad_ratio_reload_keeps_last_good_and_counts(
    node: SimulatedNode, ratio_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    health = AgentHealth()
    sampler = make_sampler(node, ratio_file, health=health)
    assert sampler.snapshot(0.0).gpus[0].vgpus == 2.0
    ratio_file.write_text("4\n")
    assert sampler.snapshot(0.0).gpus[0].vgpus == 4.0
    ratio_file.write_text("-1\n")
    past = time.time() - 10  # a change older than the settling time a write in place gets
    os.utime(ratio_file, (past, past))
    with caplog.at_level(logging.WARNING, logger="otel_vgpu"):
        for _ in range(3):
            snapshot = sampler.snapshot(0.0)
            assert snapshot.ok and snapshot.gpus[0].vgpus == 4.0
    assert counted(health) == {"allocation_file": 3}
    assert sum("'-1' is not a number" in r.getMessage() for r in caplog.records) == 1


def test_sampling_window_is_at_least_one_second(node: SimulatedNode, ratio_file: Path) -> None:
    asked: list[tuple[int, int]] = []
    original = node.utilization_samples

    def spy(index: int, since_us: int):  # type: ignore[no-untyped-def]
        asked.append((since_us, node.now_us()))
        return original(index, since_us)

    node.utilization_samples = spy  # type: ignore[method-assign]
    sampler = make_sampler(node, ratio_file)
    sampler.snapshot(0.0)
    sampler.snapshot(0.0)
    for since, now in asked:
        assert now - since >= 1_000_000 - 50_000


def test_process_utilization_not_supported_is_reported_once(node: SimulatedNode, ratio_file: Path) -> None:
    health = AgentHealth()
    sampler = make_sampler(node, ratio_file, health=health)
    node.fail("utilization_samples", 1, "NOT_SUPPORTED")
    snapshots = [sampler.snapshot(0.0) for _ in range(3)]
    assert counted(health) == {"process_utilization": 1}
    for snapshot in snapshots:
        assert all(p.sm_utilization is None for p in snapshot.pods if p.gpu_index == 1)
        assert all(p.sm_utilization is not None for p in snapshot.pods if p.gpu_index == 0)
        assert any(p.memory_used for p in snapshot.pods if p.gpu_index == 1)


class CountedEnergy(SimulatedNode):
    """The simulated node, counting its energy counter's reads."""

    reads = 0

    def energy(self, index: int) -> int:
        self.reads += 1
        return super().energy(index)


def test_the_energy_counter_is_read_on_its_own_cadence_and_the_counters_hold_between(
    steady: Scenario, tmp_path: Path, ratio_file: Path
) -> None:
    clock = [100.0]
    node = CountedEnergy(steady, tmp_path / "proc", clock=lambda: clock[0])
    reader = GpuReader(node, clock=lambda: clock[0], energy_every_s=10.0)
    sampler = make_sampler(node, ratio_file, clock=lambda: clock[0], reader=reader)
    gpus = len(steady.gpus)
    joules = []
    for _ in range(11):  # sweeps 2 s apart over 20 s: reads at 0, 10 and 20 s
        snapshot = sampler.snapshot(0.0)
        joules.append(snapshot.gpus[0].energy_joules)
        clock[0] += 2.0
    node.close()
    assert node.reads == 3 * gpus
    assert all(j is not None for j in joules)
    assert joules[1] == joules[4] and joules[5] is not None and joules[4] is not None and joules[5] > joules[4]
