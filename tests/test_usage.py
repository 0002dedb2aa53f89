"""Usage counters carried from sweep to sweep (otel_vgpu/collect/usage.py): pure, on plain rows."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from otel_vgpu.collect.aggregate import GpuRow, PodRow
from otel_vgpu.collect.usage import MAX_GAP_S, Usage, accumulate

GPU = GpuRow(0, "GPU-a", "H200", 140, 10, 0.5, 2.0, 0)


def pod(uid: str = "u1", sm: float | None = 0.25, memory: int = 100, container: str | None = None) -> PodRow:
    return PodRow("ml", "trainer", uid, container, 0, "GPU-a", 1.0, memory, 70, sm, None, 1)


def run(sweeps: list[tuple[float, list[PodRow], float | None]]) -> tuple[Usage, tuple[GpuRow, ...], tuple[PodRow, ...]]:
    """Sweeps at the given times with the given pods and GPU utilization; the last result."""
    usage = Usage()
    gpus: tuple[GpuRow, ...] = ()
    pods: tuple[PodRow, ...] = ()
    for at, rows, utilization in sweeps:
        usage, gpus, pods = accumulate(usage, [dataclasses.replace(GPU, utilization=utilization)], rows, at)
    return usage, gpus, pods


def test_busy_seconds_integrate_sm_over_uneven_intervals() -> None:
    # 0.25 of the SMs for 1 s, 0.5 for 3 s, 0 for 0.5 s, 1.0 for 2 s: 0.25 + 1.5 + 0 + 2 = 3.75
    _, gpus, pods = run(
        [
            (100.0, [pod(sm=0.9)], 0.9),  # the first sweep counts nothing: no interval before it
            (101.0, [pod(sm=0.25)], 0.3),
            (104.0, [pod(sm=0.5)], 0.6),
            (104.5, [pod(sm=0.0)], 0.1),
            (106.5, [pod(sm=1.0)], 1.0),
        ]
    )
    assert pods[0].sm_busy_seconds == pytest.approx(3.75)
    assert gpus[0].sm_busy_seconds == pytest.approx(0.3 + 1.8 + 0.05 + 2.0)
    # rate() over the run is the mean SM use: 3.75 / 6.5 s
    assert (pods[0].sm_busy_seconds or 0.0) / (106.5 - 100.0) == pytest.approx(0.5769, abs=1e-3)


def test_a_long_gap_counts_as_max_gap_only() -> None:
    _, _, pods = run([(0.0, [pod()], 0.5), (1000.0, [pod(sm=1.0)], 0.5)])
    assert pods[0].sm_busy_seconds == pytest.approx(MAX_GAP_S)


def test_unknown_sm_leaves_the_counter_out_and_it_resumes_where_it_was() -> None:
    usage, _, pods = run([(0.0, [pod()], 0.5), (2.0, [pod(sm=0.5)], 0.5), (3.0, [pod(sm=None)], None)])
    assert pods[0].sm_busy_seconds is None  # an MPS server appeared: no per-pod SM
    usage, gpus, pods = accumulate(usage, [GPU], [pod(sm=0.5)], 4.0)
    assert pods[0].sm_busy_seconds == pytest.approx(1.0 + 0.5), "never backwards, no gap filled"
    assert gpus[0].sm_busy_seconds == pytest.approx(1.0 + 0.5)


def test_an_ended_pod_is_dropped_and_starts_from_zero_if_seen_again() -> None:
    usage, _, _ = run([(0.0, [pod("u1"), pod("u2")], 0.5), (2.0, [pod("u1"), pod("u2")], 0.5)])
    usage, _, pods = accumulate(usage, [GPU], [pod("u1")], 3.0)
    assert [p.pod_uid for p in pods] == ["u1"] and len(usage.pod_busy) == 1
    usage, _, pods = accumulate(usage, [GPU], [pod("u1"), pod("u2")], 4.0)
    assert {p.pod_uid: p.sm_busy_seconds for p in pods} == pytest.approx({"u1": 1.0, "u2": 0.25})


def test_peak_memory_is_the_most_held_at_once_per_container() -> None:
    rows = [pod(memory=100, container="a"), pod(memory=5, container="b")]
    usage, _, _ = run([(0.0, rows, 0.5)])
    usage, _, _ = accumulate(usage, [GPU], [pod(memory=300, container="a"), pod(memory=5, container="b")], 1.0)
    _, _, pods = accumulate(usage, [GPU], [pod(memory=50, container="a"), pod(memory=7, container="b")], 2.0)
    assert {p.container: (p.memory_used, p.memory_peak) for p in pods} == {"a": (50, 300), "b": (7, 7)}


def test_the_agent_counts_busy_seconds_at_its_own_cadence_without_scrapes(tmp_path: Path, ratio_file: Path) -> None:
    # One pod at half the SMs of GPU 0, nothing on GPU 1; sweeps every 0.2 s, scrapes 4 s apart.
    from testkit.agent import running_agent  # noqa: PLC0415

    scenario = tmp_path / "node.yaml"
    scenario.write_text(
        "gpus: [{memory: 80GiB}, {memory: 80GiB}]\n"
        "pods:\n  - {namespace: ml, name: trainer-0, processes: [{gpu: 0, memory: 8GiB, sm: 0.5}]}\n"
    )
    args = ("--simulate", str(scenario), "--allocation-file", str(ratio_file), "--sweep-interval", "0.2")
    with running_agent(*args) as agent:
        first, started = agent.scrape(), time.monotonic()
        time.sleep(4)
        second, ended = agent.scrape(), time.monotonic()
        code, _ = agent.stop()
    assert code == 0
    assert second.types["vgpu_pod_sm_busy_seconds"] == "counter"
    busy = [e.by("vgpu_pod_sm_busy_seconds_total", "pod", "gpu_id")[("trainer-0", "0")] for e in (first, second)]
    gpu = [e.by("vgpu_gpu_sm_busy_seconds_total", "gpu_id") for e in (first, second)]
    seconds = ended - started
    assert (busy[1] - busy[0]) / seconds == pytest.approx(0.5, abs=0.1)
    assert (gpu[1][("0",)] - gpu[0][("0",)]) / seconds == pytest.approx(0.5, abs=0.1)
    assert gpu[1][("1",)] == gpu[0][("1",)] == 0
    peak = second.by("vgpu_pod_memory_peak_bytes", "pod", "gpu_id")[("trainer-0", "0")]
    assert peak == 8 * 1024**3


def test_the_gpu_counter_follows_its_own_samples_over_the_interval_not_the_last_period() -> None:
    # Bursty work sampled every 2 s: the last period read 1.0 (a burst), the window's samples 0.3.
    usage, _, _ = accumulate(Usage(), [GPU], [], 0.0)
    bursty = dataclasses.replace(GPU, utilization=1.0, utilization_window=0.3)
    _, gpus, _ = accumulate(usage, [bursty], [], 2.0)
    assert gpus[0].sm_busy_seconds == pytest.approx(0.6)
    # Without samples (an old driver), the last period's figure serves.
    _, gpus, _ = accumulate(usage, [dataclasses.replace(GPU, utilization=1.0)], [], 2.0)
    assert gpus[0].sm_busy_seconds == pytest.approx(2.0)
