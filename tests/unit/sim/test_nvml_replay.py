"""The replay backend (testkit/nvml_replay.py) serves what the simulated node answered, so that
bench/agent_cost.py measures the agent against the node it stands for."""

from __future__ import annotations

from pathlib import Path

from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit import nvml_replay
from testkit.clock import Clock

NODE = """
gpus:
  - {model: NVIDIA H100 80GB HBM3, memory: 80GiB}
  - {model: NVIDIA H100 80GB HBM3, memory: 80GiB}
pods:
  - namespace: team-a
    name: trainer
    shares: {0: 1}
    processes:
      - {gpu: 0, memory: 4GiB, sm: {mean: 0.4, amplitude: 0.2, period_s: 7}, dram: 0.2}
      - {gpu: 0, memory: 1GiB, sm: 0.1}
  - namespace: team-b
    name: server
    shares: {1: 1}
    processes:
      - {gpu: 1, memory: 2GiB, sm: 0.3}
"""
START_S = 1_000.0
SECONDS = 12.0


def test_replay_serves_what_the_node_answered(tmp_path: Path) -> None:
    scenario = parse_scenario(NODE, "replay.yaml")
    recording = nvml_replay.record(scenario, tmp_path / "recorded", SECONDS, start_s=START_S)
    recording.save(tmp_path)
    clock = Clock(START_S)
    replay = nvml_replay.Replay(nvml_replay.load(tmp_path), clock.monotonic)
    # A fresh node of the same scenario, asked at a few of the recorded instants.
    node = SimulatedNode(scenario, tmp_path / "fresh", clock.monotonic, clock.wall_us, host_pid_namespace=True)
    try:
        assert replay.device_count() == node.device_count() == 2
        for at in (0.0, 5.0, SECONDS):
            clock.t = START_S + at
            for index in range(2):
                assert replay.processes(index) == node.processes(index)
                assert replay.device(index) == node.device(index)
                assert replay.memory_used(index) == node.memory_used(index)
                since = clock.wall_us() - 3_000_000
                assert replay.utilization_samples(index, since) == node.utilization_samples(index, since)
                for figure in ("sm", "memory_copy"):
                    assert replay.gpu_utilization_samples(index, since, figure) == node.gpu_utilization_samples(
                        index, since, figure
                    )
                assert replay.health(index).figures.keys() == node.health(index).figures.keys()
            assert replay.now_us() == node.now_us()
    finally:
        node.close()
    # Between ticks, the last tick's answers; the pods as the node's kubelet and API name them.
    clock.t = START_S + 5.5
    assert replay.device(0) == recording.ticks[5].devices[0]
    assert set(replay.directory().pods()) == set(node.directory().pods())
    assert (replay.proc_root / str(replay.processes(0)[0].pid) / "cgroup").is_file()
