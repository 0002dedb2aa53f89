"""A driver slow or hung over a call never costs the scrape's time. A GPU whose health call
hangs costs that GPU's health families alone (collect/device_health.py): read serially in the
scrape, eight GPUs whose health call took 1.5 s each made every scrape take 12 s, past
Prometheus' default 10 s scrape_timeout, and the whole scrape was lost. A sweep stuck in a
call is waited for at most 2 s (collect/sampler.py `SWEEP_WAIT_S`): the last sweep serves."""

from __future__ import annotations

import time
from pathlib import Path

from testkit.agent import running_agent, wait_until

# Prometheus' default scrape_timeout: a scrape that takes longer is lost whole.
SCRAPE_TIMEOUT_S = 10.0
# Each of the first seven GPUs' health call takes this long: far past any scrape's timeout.
SLOW_S = 60.0
GPUS = 8


def test_eight_gpus_with_a_hung_health_call_cost_their_health_alone(tmp_path: Path) -> None:
    scenario = tmp_path / "node.yaml"
    scenario.write_text(
        "gpus:\n"
        + "".join("  - {model: NVIDIA H100 80GB HBM3, memory: 80GiB}\n" for _ in range(GPUS))
        + "pods:\n"
        + "".join(
            f"  - {{name: p{n}, shares: {{{n}: 1}}, processes: [{{gpu: {n}, memory: 1GiB, sm: 0.4}}]}}\n"
            for n in range(GPUS)
        )
        + "faults:\n"
        + "".join(f"  - {{call: health, gpu: {n}, delay_s: {SLOW_S}}}\n" for n in range(GPUS - 1))
    )
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("2\n")
    with running_agent("--simulate", str(scenario), "--allocation-file", str(ratio)) as agent:
        took = []

        def deadline_said() -> bool:
            started = time.monotonic()
            served = agent.scrape()
            took.append(time.monotonic() - started)
            errors = served.by("vgpu_agent_collection_errors_total", "stage").get(("device_health",), 0.0)
            return errors >= GPUS - 1

        # Each slow GPU's read misses its 2 s deadline and is counted; the scrapes meanwhile
        # answer at once (they took 7 x 60 s before).
        wait_until(deadline_said, timeout=60, what="the slow GPUs' missed deadlines counted")
        served = agent.scrape()
        agent.stop()
    assert max(took) < SCRAPE_TIMEOUT_S, took
    # Every pod's figures are there; only the healthy GPU has health series, with their age.
    pods = served.by("vgpu_pod_memory_used_bytes", "gpu_id")
    assert sorted(pods) == [(str(n),) for n in range(GPUS)]
    assert list(served.by("vgpu_gpu_temperature_celsius", "gpu_id")) == [(str(GPUS - 1),)]
    ages = served.by("vgpu_gpu_health_age_seconds", "gpu_id")
    assert list(ages) == [(str(GPUS - 1),)] and 0 <= ages[(str(GPUS - 1),)] < 60


def test_a_sweep_stuck_in_the_driver_leaves_the_scrapes_the_last_sweep(tmp_path: Path) -> None:
    scenario = tmp_path / "node.yaml"
    # From 3 s on, every device call takes a minute: the sweep in flight then is stuck in it.
    scenario.write_text(
        "gpus: [{memory: 80GiB}]\n"
        "pods: [{name: p, shares: {0: 1}, processes: [{gpu: 0, memory: 1GiB, sm: 0.4}]}]\n"
        f"faults: [{{call: device, delay_s: {SLOW_S}, from_s: 3}}]\n"
    )
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("2\n")
    with running_agent("--simulate", str(scenario), "--allocation-file", str(ratio)) as agent:
        serving = time.monotonic()
        first = agent.scrape()
        assert first.series("vgpu_pod_memory_used_bytes")
        # Past the fault's start on the node's clock, and a sweep's interval more.
        wait_until(lambda: time.monotonic() - serving > 5.5, what="the sweeps to be stuck")
        took, served = [], []
        for _ in range(3):
            started = time.monotonic()
            served.append(agent.scrape())
            took.append(time.monotonic() - started)
        agent.stop()
    assert max(took) < SCRAPE_TIMEOUT_S, took
    assert all(each.series("vgpu_pod_memory_used_bytes") for each in served)


def test_a_gpm_read_hung_in_the_driver_costs_that_gpus_gpm_figures_not_the_sweeps(tmp_path: Path) -> None:
    scenario = tmp_path / "node.yaml"
    # GPU 0's GPM reads hang from 1 s on; GPU 1's answer. The sweeps read GPM once an engine
    # window (10 s), each GPU's on a thread of its own, waited for at most 1 s.
    scenario.write_text(
        "gpus: [{model: NVIDIA H100 80GB HBM3, memory: 80GiB}, {model: NVIDIA H100 80GB HBM3, memory: 80GiB}]\n"
        "pods:\n"
        "  - {name: a, shares: {0: 1}, processes: [{gpu: 0, memory: 1GiB, sm: 0.4}]}\n"
        "  - {name: b, shares: {1: 1}, processes: [{gpu: 1, memory: 1GiB, sm: 0.4}]}\n"
        f"faults: [{{call: gpm, gpu: 0, delay_s: {SLOW_S}, from_s: 1}}]\n"
    )
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("2\n")
    with running_agent("--simulate", str(scenario), "--allocation-file", str(ratio)) as agent:

        def both_windows_closed() -> bool:
            served = agent.scrape()
            errors = served.by("vgpu_agent_collection_errors_total", "stage").get(("gpm",), 0.0)
            return errors >= 1 and bool(served.by("vgpu_gpu_tensor_active_ratio", "gpu_id"))

        # GPU 1's first window closes and GPU 0's read misses its deadline; the sweeps go on.
        wait_until(both_windows_closed, timeout=60, what="a GPM window closed and GPU 0's read late")
        sweeps = agent.scrape().series("vgpu_agent_collection_duration_seconds_count")
        wait_until(
            lambda: agent.scrape().series("vgpu_agent_collection_duration_seconds_count") != sweeps,
            timeout=30,
            what="another sweep",
        )
        served = agent.scrape()
        agent.stop()
    assert list(served.by("vgpu_gpu_tensor_active_ratio", "gpu_id")) == [("1",)]
    assert sorted(served.by("vgpu_pod_memory_used_bytes", "gpu_id")) == [("0",), ("1",)]
