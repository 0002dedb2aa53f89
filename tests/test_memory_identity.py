"""A GPU's used memory adds up, as a scrape shows it: vgpu_gpu_memory_used_bytes (NVML's v1
used, the "Sum of Reserved and Allocated device memory" of nvml.h) is the pods'
vgpu_pod_memory_used_bytes on that GPU, plus vgpu_gpu_memory_unattributed_bytes, plus
vgpu_gpu_memory_reserved_bytes, on the simulated node, rendered by the agent's telemetry.
bench/gpu_validate_memory.py checks the same on a real GPU against nvidia-smi."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_vgpu.collect.reading import GpuReader
from otel_vgpu.export.exposition import TEXT
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.health import Health
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario import BUILTIN, RESERVED_BYTES, Scenario
from otel_vgpu.sim.scenario_file import load_scenario, parse_scenario
from testkit.clock import Clock
from testkit.promtext import Exposition, parse

from .conftest import make_sampler

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
    health = Health()
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


def parts(exposition: Exposition) -> dict[str, tuple[float, float, float, float]]:
    """Each GPU's used, and the three it is made of: pods, unattributed, reserved."""
    used = per_gpu(exposition, "vgpu_gpu_memory_used_bytes")
    pods = per_gpu(exposition, "vgpu_pod_memory_used_bytes")
    unattributed = per_gpu(exposition, "vgpu_gpu_memory_unattributed_bytes")
    reserved = per_gpu(exposition, "vgpu_gpu_memory_reserved_bytes")
    return {gpu: (used[gpu], pods.get(gpu, 0.0), unattributed[gpu], reserved[gpu]) for gpu in used}


def test_on_every_gpu_of_the_builtin_node_used_is_pods_plus_unattributed_plus_reserved(tmp_path: Path) -> None:
    scenario = load_scenario(BUILTIN)
    seen = scrapes(scenario, tmp_path, 24)
    for n, exposition in enumerate(seen):
        figures = parts(exposition)
        assert sorted(figures) == ["0", "1", "2", "3"], n
        for gpu, (used, pods, unattributed, reserved) in figures.items():
            assert reserved == RESERVED_BYTES, (n, gpu)
            assert used == pods + unattributed + reserved, (n, gpu, used, pods, unattributed, reserved)
    # Over the cycle, the pods' memory moved (the notebook's, the batch job's): the check saw more than one node.
    totals = {tuple(sorted(parts(e).items())) for e in seen}
    assert len(totals) > 1


def test_a_process_of_no_pod_is_the_unattributed_part_of_used_on_each_gpu(tmp_path: Path) -> None:
    scenario = parse_scenario(WITH_UNATTRIBUTED, "unattributed.yaml")
    seen = scrapes(scenario, tmp_path, 8)
    for n, exposition in enumerate(seen):
        figures = parts(exposition)
        for gpu, (used, pods, unattributed, reserved) in figures.items():
            assert used == pods + unattributed + reserved, (n, gpu, used, pods, unattributed, reserved)
        assert [figures[g][3] for g in ("0", "1", "2")] == [RESERVED_BYTES, 700 * MIB, 300 * MIB]
        assert figures["0"][2] == 512 * MIB and figures["1"][2] > 0, "the host's processes are unattributed"
        assert figures["2"][:3] == (300 * MIB, 0, 0), "an idle GPU's used is its reservation"
    assert len({parts(e)["1"][2] for e in seen}) > 1, "the host process on GPU 1 moved: several sums were checked"


def test_a_driver_without_v2_has_no_reserved_series_and_its_used_still_holds_the_reservation(
    tmp_path: Path,
) -> None:
    scenario = parse_scenario(WITH_UNATTRIBUTED + "driver: {memory_info_v2: false}\n", "r470.yaml")
    (exposition,) = scrapes(scenario, tmp_path, 1)
    assert "vgpu_gpu_memory_reserved_bytes" not in exposition.values, "no series where v2 is lacking, not 0"
    used = per_gpu(exposition, "vgpu_gpu_memory_used_bytes")
    assert used["2"] == 300 * MIB, "v1's used is the same figure, the reservation in it"
