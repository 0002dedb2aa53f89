"""Usage counters end to end: the agent in process on the simulated node, sweeping at its own
cadence and scraped (the counters' rules alone, on plain rows: tests/unit/collect/test_usage.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from testkit.agent import agent_in_process


def test_the_agent_counts_busy_seconds_at_its_own_cadence_without_scrapes(tmp_path: Path, ratio_file: Path) -> None:
    # One pod at half the SMs of GPU 0, nothing on GPU 1; sweeps every 0.1 s, and two scrapes
    # forty of them apart. Each scrape sweeps (--min-interval 0): its figures are as of its time.
    # The SM counters advance by the GPU's 200 ms periods as they settle (collect/ledger.py), so
    # that over four seconds they are within a period of the time at either end.
    scenario = tmp_path / "node.yaml"
    scenario.write_text(
        "gpus: [{memory: 80GiB}, {memory: 80GiB}]\n"
        "pods:\n  - {namespace: ml, name: trainer-0, processes: [{gpu: 0, memory: 8GiB, sm: 0.5}]}\n"
    )
    args = ("--simulate", str(scenario), "--allocation-file", str(ratio_file))
    timing = ("--sweep-interval", "0.1", "--min-interval", "0")
    # the energy counter read every sweep here (every 10 s on a node)
    with agent_in_process(*args, *timing, env={}, energy_every_s=0.0) as agent:
        sent_first = time.monotonic()
        first, got_first = agent.scrape(), time.monotonic()
        agent.wait_sweeps(40)
        sent_second = time.monotonic()
        second, got_second = agent.scrape(), time.monotonic()
        code, _ = agent.stop()
    assert code == 0
    assert second.types["vgpu_pod_sm_busy_seconds"] == "counter"
    # Each scrape's sweep ran while it was in flight: the counters' interval lies between these,
    # however long a loaded machine kept either scrape.
    shortest, longest = sent_second - got_first, got_second - sent_first

    def rate_is(delta: float, expected: float, slack: float) -> bool:
        return delta / longest - slack <= expected <= delta / shortest + slack

    busy = [e.by("vgpu_pod_sm_busy_seconds_total", "pod", "gpu_id")[("trainer-0", "0")] for e in (first, second)]
    gpu = [e.by("vgpu_gpu_sm_busy_seconds_total", "gpu_id") for e in (first, second)]
    assert rate_is(busy[1] - busy[0], 0.5, 0.1), (busy, shortest, longest)
    assert rate_is(gpu[1][("0",)] - gpu[0][("0",)], 0.5, 0.1), (gpu, shortest, longest)
    assert gpu[1][("1",)] == gpu[0][("1",)] == 0
    peak = second.by("vgpu_pod_memory_peak_bytes", "pod", "gpu_id")[("trainer-0", "0")]
    assert peak == 8 * 1024**3
    # The simulated GPUs draw 75 W idle and 700 W at full SM use: 387.5 W at half, 75 W idle.
    energy = [e.by("vgpu_gpu_energy_joules_total", "gpu_id") for e in (first, second)]
    assert rate_is(energy[1][("0",)] - energy[0][("0",)], 387.5, 0.15 * 387.5), (energy, shortest, longest)
    assert rate_is(energy[1][("1",)] - energy[0][("1",)], 75.0, 0.15 * 75.0), (energy, shortest, longest)
    # The pods' part and the unattributed add up to the GPU's.
    pods_j = second.by("vgpu_pod_energy_joules_total", "pod", "gpu_id")[("trainer-0", "0")]
    unattributed = second.by("vgpu_gpu_energy_unattributed_joules_total", "gpu_id")
    assert pods_j + unattributed[("0",)] == pytest.approx(energy[1][("0",)], abs=1e-6)
    assert unattributed[("1",)] == pytest.approx(energy[1][("1",)]), "nobody holds GPU 1"


def test_a_configured_idle_power_reaches_the_holder_of_a_share_on_a_busy_gpu(tmp_path: Path, ratio_file: Path) -> None:
    # GPU 0 is busy from the agent's first sweep, so no idle power can be learned: a pod
    # holding a share and running nothing gets energy only with --gpu-idle-watts.
    scenario = tmp_path / "node.yaml"
    scenario.write_text(
        "gpus: [{memory: 80GiB}]\n"
        "pods:\n"
        "  - {namespace: ml, name: trainer-0, shares: {0: 1}, processes: [{gpu: 0, memory: 8GiB, sm: 1.0}]}\n"
        "  - {namespace: ml, name: standby-0, shares: {0: 1}}\n"
    )
    args = ("--simulate", str(scenario), "--allocation-file", str(ratio_file), "--sweep-interval", "0.1")

    def standby_part(*extra: str) -> float:
        """The standby pod's part of the GPU's energy between two scrapes (the same sweeps')."""
        with agent_in_process(*args, *extra, env={}, energy_every_s=0.0) as agent:
            first = agent.scrape()
            agent.wait_sweeps(40)
            second = agent.scrape()
        standby = [e.by("vgpu_pod_energy_joules_total", "pod").get(("standby-0",), 0.0) for e in (first, second)]
        gpu = [e.by("vgpu_gpu_energy_joules_total", "gpu_id")[("0",)] for e in (first, second)]
        assert gpu[1] > gpu[0]
        return (standby[1] - standby[0]) / (gpu[1] - gpu[0])

    assert standby_part() == 0.0
    # The simulated GPU draws 700 W at full SM; 75 W of it idle, ratio 2: the share's part is 37.5 W.
    assert standby_part("--gpu-idle-watts", "75") == pytest.approx(37.5 / 700, rel=0.01)
