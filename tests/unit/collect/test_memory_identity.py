"""A GPU's used memory adds up, as a scrape shows it: vgpu_gpu_memory_used_bytes (NVML's v1
used, the "Sum of Reserved and Allocated device memory" of nvml.h) is the pods'
vgpu_pod_memory_used_bytes on that GPU, plus vgpu_gpu_memory_unattributed_bytes, plus
vgpu_gpu_memory_reserved_bytes, plus vgpu_gpu_memory_unlisted_bytes, on the simulated node,
rendered by the agent's telemetry; and the unlisted is the simulated driver's contexts' memory,
which no process listing holds. bench/gpu_validate_memory.py checks the same on a real GPU
against nvidia-smi."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.collect.reading import GpuReader
from otel_vgpu.export.exposition import TEXT
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario import BUILTIN, CONTEXT_BYTES, RESERVED_BYTES, Scenario
from otel_vgpu.sim.scenario_file import load_scenario, parse_scenario
from testkit.clock import Clock
from testkit.promtext import Exposition, parse

from ...conftest import make_sampler

pytestmark = pytest.mark.unit

GIB = 1024**3
MIB = 1024**2
STEP_S = 7.5
# Pods on two GPUs, a process of no pod beside them (the host's), a GPU whose driver keeps
# another amount for itself, and one with nothing on it.
WITH_UNATTRIBUTED = """
gpus:
  - {memory: 80GiB}
  - {memory: 141GiB, reserved: 700MiB}
  - {memory: 24GiB, reserved: 300MiB}
pods:
  - name: trainer
    shares: {0: 1, 1: 1}
    processes:
      - {gpu: 0, memory: {mean: 20GiB, amplitude: 4GiB, period_s: 30}, sm: 0.5}
      - {gpu: 1, memory: 30GiB, sm: 0.4}
  - name: notebook
    shares: {0: 1}
    processes: [{gpu: 0, memory: 3GiB, sm: 0.1}]
host_processes:
  - {gpu: 0, memory: 512MiB, sm: 0.05, cgroup: '0::/system.slice/exporter.service'}
  - {gpu: 1, memory: {mean: 2GiB, amplitude: 1GiB, period_s: 20}, sm: 0.1, cgroup: '0::/user.slice'}
"""


def scrapes(scenario: Scenario, tmp_path: Path, count: int) -> list[Exposition]:
    """`count` renders of /metrics' text, STEP_S apart on the node's clock, each after a sweep."""
    clock = Clock(0.0)
    node = SimulatedNode(scenario, tmp_path / "proc", clock.monotonic, clock.wall_us)
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text(f"{scenario.ratio}\n")
    health = AgentHealth()
    sampler = make_sampler(node, ratio, health=health, clock=clock.monotonic, reader=GpuReader(node, clock.monotonic))
    telemetry = Telemetry(sampler, health, 1.0, "gpu-node-1", False)
    out = []
    try:
        for _ in range(count):
            clock.t += STEP_S
            sampler.snapshot(0.0)
            out.append(parse(telemetry.render(TEXT).decode()))
    finally:
        telemetry.shutdown()
        node.close()
    return out


def per_gpu(exposition: Exposition, family: str) -> dict[str, float]:
    """A family's values by gpu_id, its pods' (or containers') series added up."""
    out: dict[str, float] = {}
    for labels, value in exposition.series(family).items():
        gpu = dict(labels)["gpu_id"]
        out[gpu] = out.get(gpu, 0.0) + value
    return out


@dataclass(frozen=True)
class Parts:
    """One GPU's used, and the four it is made of, in bytes; and how many processes it has."""

    used: float
    pods: float
    unattributed: float
    reserved: float
    unlisted: float
    processes: int
    """The pods' (vgpu_pod_processes) and, from the scenario, those of no pod."""

    def adds_up(self) -> bool:
        return self.used == self.pods + self.unattributed + self.reserved + self.unlisted


def parts(exposition: Exposition, scenario: Scenario) -> dict[str, Parts]:
    """Each GPU's figures in a scrape. A family without a series on a GPU reads NaN there, which
    no sum equals: what is left out fails the checks, never reads as 0."""
    used = per_gpu(exposition, "vgpu_gpu_memory_used_bytes")
    pods = per_gpu(exposition, "vgpu_pod_memory_used_bytes")
    unattributed = per_gpu(exposition, "vgpu_gpu_memory_unattributed_bytes")
    reserved = per_gpu(exposition, "vgpu_gpu_memory_reserved_bytes")
    unlisted = per_gpu(exposition, "vgpu_gpu_memory_unlisted_bytes")
    in_pods = per_gpu(exposition, "vgpu_pod_processes")
    nan = math.nan
    return {
        gpu: Parts(
            used[gpu],
            pods.get(gpu, 0.0),
            unattributed.get(gpu, nan),
            reserved.get(gpu, nan),
            unlisted.get(gpu, nan),
            int(in_pods.get(gpu, 0)) + sum(1 for host in scenario.host_processes if str(host.gpu) == gpu),
        )
        for gpu in used
    }


def test_on_every_gpu_of_the_builtin_node_used_is_pods_plus_unattributed_plus_reserved_plus_unlisted(
    tmp_path: Path,
) -> None:
    scenario = load_scenario(BUILTIN)
    assert scenario.driver.context_memory == CONTEXT_BYTES
    seen = scrapes(scenario, tmp_path, 24)
    for n, exposition in enumerate(seen):
        figures = parts(exposition, scenario)
        assert sorted(figures) == ["0", "1", "2", "3"], n
        for gpu, got in figures.items():
            assert got.reserved == RESERVED_BYTES, (n, gpu)
            assert got.adds_up(), (n, gpu, got)
            # What no listing holds is the contexts' memory, the reservation apart.
            assert got.processes > 0 and got.unlisted == CONTEXT_BYTES * got.processes, (n, gpu, got)
    # Over the cycle, the pods' memory and processes moved (the notebook's, the batch job's): the
    # check saw more than one node.
    assert len({tuple(sorted(parts(e, scenario).items())) for e in seen}) > 1
    assert len({parts(e, scenario)["3"].unlisted for e in seen}) > 1, "a process came and went, and its context"


def test_a_process_of_no_pod_is_the_unattributed_part_of_used_on_each_gpu(tmp_path: Path) -> None:
    scenario = parse_scenario(WITH_UNATTRIBUTED, "unattributed.yaml")
    seen = scrapes(scenario, tmp_path, 8)
    for n, exposition in enumerate(seen):
        figures = parts(exposition, scenario)
        for gpu, got in figures.items():
            assert got.adds_up(), (n, gpu, got)
            assert got.unlisted == CONTEXT_BYTES * got.processes, (n, gpu, got)
        assert [figures[g].reserved for g in ("0", "1", "2")] == [RESERVED_BYTES, 700 * MIB, 300 * MIB]
        assert [figures[g].processes for g in ("0", "1", "2")] == [3, 2, 0]
        assert figures["0"].unattributed == 512 * MIB and figures["1"].unattributed > 0, "the host's are unattributed"
        idle = figures["2"]
        assert (idle.used, idle.pods, idle.unattributed, idle.unlisted) == (300 * MIB, 0, 0, 0), "its reservation"
    assert len({parts(e, scenario)["1"].unattributed for e in seen}) > 1, "GPU 1's host process moved: several sums"


def test_a_driver_whose_contexts_hold_nothing_unlisted_has_0_unlisted(tmp_path: Path) -> None:
    scenario = parse_scenario(WITH_UNATTRIBUTED + "driver: {context_memory: 0}\n", "no-contexts.yaml")
    (exposition,) = scrapes(scenario, tmp_path, 1)
    figures = parts(exposition, scenario)
    assert all(got.unlisted == 0 and got.adds_up() for got in figures.values()), figures


def test_a_driver_without_v2_has_no_reserved_or_unlisted_series_and_its_used_still_holds_the_reservation(
    tmp_path: Path,
) -> None:
    scenario = parse_scenario(WITH_UNATTRIBUTED + "driver: {memory_info_v2: false}\n", "r470.yaml")
    (exposition,) = scrapes(scenario, tmp_path, 1)
    assert "vgpu_gpu_memory_reserved_bytes" not in exposition.values, "no series where v2 is lacking, not 0"
    assert "vgpu_gpu_memory_unlisted_bytes" not in exposition.values, "nor of what it would take off"
    used = per_gpu(exposition, "vgpu_gpu_memory_used_bytes")
    assert used["2"] == 300 * MIB, "v1's used is the same figure, the reservation in it"
