"""The built-in simulated node is a node that could exist, at every moment of its cycle:
the pods' SM never adds up to more than the GPU's, allocations stay within what the
ratio allows, memory fits, and one pod (notebook-alice) uses more than its share."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from otel_vgpu.allocation.ratio import RatioSource
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario import BUILTIN, Scenario, sm_asked
from otel_vgpu.sim.scenario_file import load_scenario
from testkit.clock import Clock
from testkit.sim_sampler import sim_sampler

pytestmark = pytest.mark.unit

STEP_S = 2.5
CYCLE_S = 600  # every period of the built-in node (15 s to 300 s) divides it


def on_a_clock(scenario: Scenario, tmp_path: Path, clock: Clock) -> tuple[SimulatedNode, Sampler]:
    """The node and a sampler on `clock`, the scenario's ratio in force (no ratio file)."""
    node = SimulatedNode(scenario, tmp_path / "proc", clock=clock.monotonic, wall_clock_us=clock.wall_us)
    sampler = sim_sampler(node, RatioSource(tmp_path / "absent", fallback=scenario.ratio), clock=clock.monotonic)
    return node, sampler


def test_the_builtin_node_adds_up_at_every_moment(tmp_path: Path) -> None:
    scenario = load_scenario(BUILTIN)
    assert scenario.ratio == 2
    clock = Clock()
    node, sampler = on_a_clock(scenario, tmp_path, clock)
    over_users: set[str] = set()
    moments = windows = 0
    try:
        for _ in range(int(CYCLE_S / STEP_S)):
            clock.t += STEP_S
            snapshot = sampler.snapshot(0.0)
            assert snapshot.ok and len(snapshot.gpus) == 4
            for gpu in snapshot.gpus:
                rows = [row for row in snapshot.pods if row.gpu_index == gpu.index]
                # what vgpu_gpu_sm_utilization_ratio publishes: the GPU's figure over the interval
                published = gpu.interval_utilization
                assert published is not None and gpu.device.utilization_window is not None
                pods_sm = sum(row.sm_utilization or 0.0 for row in rows)
                assert pods_sm <= published + 1e-9, (clock.t, gpu.index, pods_sm, published)
                assert sum(row.memory_allocated for row in rows) <= gpu.device.memory_total, (clock.t, gpu.index)
                assert sum(row.shares for row in rows) <= scenario.ratio, (clock.t, gpu.index)
                used = sum(row.memory_used for row in rows) + (gpu.unattributed_memory or 0)
                assert used <= gpu.device.memory_total
                # Each engine: the pods under the GPU's figure of the same window; none lacking.
                assert "encoder" not in gpu.engine_utilization
                for engine, figure in gpu.engine_utilization.items():
                    pods_engine = sum(row.engine_utilization.get(engine, 0.0) for row in rows)
                    assert pods_engine <= figure + 1e-9, (clock.t, gpu.index, engine, pods_engine, figure)
                    windows += 1
            for row in snapshot.pods:
                if row.vgpu_utilization is not None and row.vgpu_utilization > 1.0:
                    over_users.add(row.pod)
            by_pod = {row.pod: row.engine_utilization for row in snapshot.pods}
            memory = {gpu.index: gpu.engine_utilization.get("memory_copy") for gpu in snapshot.gpus}
            if memory[1] is not None:
                # The memory-bound LLM server's GPU is the one whose memory is busiest, and
                # one pod lives on the decoders.
                assert max(memory, key=lambda index: memory[index] or 0.0) == 1, memory
                decoder = {pod: figures.get("decoder", 0.0) for pod, figures in by_pod.items()}
                assert [pod for pod, figure in decoder.items() if figure > 0] == ["video-analytics-5c8d7"]
            notebook = [row for row in snapshot.pods if row.pod == "notebook-alice"]
            assert notebook and notebook[0].vgpu_utilization is not None and notebook[0].vgpu_utilization > 1.0
            moments += 1
    finally:
        node.close()
    assert moments == CYCLE_S / STEP_S
    assert windows > 4 * 4 * 4  # engine windows closed on every GPU, four engines each
    assert over_users == {"notebook-alice"}
    # And it needs no scaling: no GPU's processes ask for more SM than it has.
    assert max(sm_asked(scenario).values()) <= 1.0


def test_a_gpu_asked_for_more_than_its_sms_shares_them(tmp_path: Path) -> None:
    """Processes asking 0.9 + 0.6 of one GPU get 0.6 and 0.4 of it, as time-slicing would give."""
    scenario_text = """
gpus: [{memory: 80GiB}]
pods:
  - {name: a, processes: [{gpu: 0, memory: 1GiB, sm: 0.9}]}
  - {name: b, processes: [{gpu: 0, memory: 1GiB, sm: 0.6}]}
"""
    path = tmp_path / "busy.yaml"
    path.write_text(scenario_text)
    scenario = load_scenario(str(path))
    assert sm_asked(scenario) == {0: 1.5}
    clock = Clock()
    node, sampler = on_a_clock(scenario, tmp_path, clock)
    try:
        clock.t += 5
        snapshot = sampler.snapshot(0.0)
    finally:
        node.close()
    sm = {row.pod: row.sm_utilization for row in snapshot.pods}
    # Each figure to NVML's whole percent.
    assert sm["a"] == pytest.approx(0.9 / 1.5, abs=0.01) and sm["b"] == pytest.approx(0.6 / 1.5, abs=0.01)
    assert snapshot.gpus[0].device.utilization == 1.0


def test_a_static_pods_uid_is_its_mirrors_as_the_api_gives_it(tmp_path: Path) -> None:
    # The static pod's cgroups carry its config hash; the API's mirror pod has a UID of its own,
    # the one kube_pod_info{uid} carries, and pod_uid is that one.
    scenario = load_scenario(BUILTIN)
    static = next(pod for pod in scenario.pods if pod.static)
    clock = Clock()
    node, sampler = on_a_clock(scenario, tmp_path, clock)
    try:
        clock.t += STEP_S
        rows = [row for row in sampler.snapshot(0.0).pods if row.pod == static.name]
    finally:
        node.close()
    assert rows and len(static.uid) == 32
    assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", r.pod_uid) for r in rows)
    assert all(r.pod_uid.replace("-", "") != static.uid for r in rows)
