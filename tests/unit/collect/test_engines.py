"""Memory copy and the video engines per pod over engine windows (otel_vgpu/collect/engines.py)."""

from __future__ import annotations

import dataclasses

import pytest

from otel_vgpu.collect.aggregate import GpuRow, PodRow, pod_key
from otel_vgpu.collect.engines import Engines, fitted, step
from otel_vgpu.collect.usage import Usage, accumulate
from otel_vgpu.gpu.backend import Device, ProcessUse
from testkit.rows import pod_row

pytestmark = pytest.mark.unit

GIB = 1024**3
ENGINES_HERE = frozenset({"memory_copy", "decoder"})


def gpu(window: dict[str, float] | None = None, engines: frozenset[str] = ENGINES_HERE) -> GpuRow:
    device = Device(0, "GPU-a", "H200", 141 * GIB, 0, 0.5, engines=engines, engine_window=window)
    return GpuRow(device=device, vgpus=2.0, unattributed_memory=0)


def pod(name: str, use: ProcessUse | None) -> PodRow:
    return pod_row(name, use)


def run(engines: Engines, window: dict[str, float] | None, pods: list[PodRow], seconds: float) -> Engines:
    return step(engines, [gpu(window)], pods, [pod_key(p) for p in pods], seconds)


def test_a_window_gives_each_pod_its_mean_over_the_window_and_counts_it_when_it_closes() -> None:
    llm, video = pod("llm", ProcessUse(0.9, memory_copy=0.8)), pod("video", ProcessUse(0.1, decoder=0.5))
    state = run(Engines(), None, [llm, video], 2.0)
    assert state.pod_now == {} and state.pod_busy == {}  # nothing until the window closes
    # The video pod stops decoding for the window's second half: its mean is half its figure.
    video_idle = pod("video", ProcessUse(0.1))
    state = run(state, {"memory_copy": 0.9, "decoder": 0.6}, [llm, video_idle], 2.0)
    assert state.pod_now[pod_key(llm)] == pytest.approx({"memory_copy": 0.8, "decoder": 0.0})
    assert state.pod_now[pod_key(video)] == pytest.approx({"memory_copy": 0.0, "decoder": 0.25})
    assert state.pod_busy[pod_key(llm)] == pytest.approx({"memory_copy": 3.2, "decoder": 0.0})
    assert state.gpu_now["GPU-a"] == {"memory_copy": 0.9, "decoder": 0.6}
    assert state.gpu_busy["GPU-a"] == pytest.approx({"memory_copy": 3.6, "decoder": 2.4})
    # While the next window is open, the gauges and counters hold.
    held = run(state, None, [llm, video], 3.0)
    assert held.pod_now == state.pod_now and held.pod_busy == state.pod_busy and held.gpu_now == state.gpu_now
    closed = run(held, {"memory_copy": 1.0, "decoder": 1.0}, [llm, video], 1.0)
    assert closed.pod_busy[pod_key(llm)]["memory_copy"] == pytest.approx(3.2 + 0.8 * 4)


def test_the_pods_are_fitted_under_the_gpus_figure_of_the_same_window() -> None:
    a, b = pod("a", ProcessUse(memory_copy=0.6)), pod("b", ProcessUse(memory_copy=0.3))
    state = run(Engines(), {"memory_copy": 0.45, "decoder": 0.0}, [a, b], 10.0)
    now = state.pod_now
    assert now[pod_key(a)]["memory_copy"] + now[pod_key(b)]["memory_copy"] == pytest.approx(0.45)
    assert now[pod_key(a)]["memory_copy"] == pytest.approx(2 * now[pod_key(b)]["memory_copy"])
    # Under the GPU's figure they are left as they are.
    assert fitted({pod_key(a): {"memory_copy": 0.2}}, {"memory_copy": 0.5}) == {pod_key(a): {"memory_copy": 0.2}}


def test_pods_without_per_process_figures_get_none_and_keep_their_counters_unexported() -> None:
    a = pod("a", ProcessUse(memory_copy=0.5))
    state = run(Engines(), {"memory_copy": 0.5, "decoder": 0.0}, [a], 4.0)
    under_mps = pod("a", None)
    after = run(state, {"memory_copy": 0.7, "decoder": 0.0}, [under_mps], 4.0)
    assert pod_key(a) not in after.pod_now
    assert after.pod_busy[pod_key(a)] == state.pod_busy[pod_key(a)]
    assert after.gpu_now["GPU-a"]["memory_copy"] == 0.7  # the GPU's own figure stays
    # A pod that ended is forgotten: one seen anew starts from 0.
    assert run(after, {"memory_copy": 0.0, "decoder": 0.0}, [], 4.0).pod_busy == {}


def test_a_gpu_without_engines_or_a_mig_device_has_no_engine_figures() -> None:
    a = pod("a", ProcessUse(0.5, memory_copy=0.5))
    none = step(Engines(), [gpu({"memory_copy": 0.5}, engines=frozenset())], [a], [pod_key(a)], 4.0)
    assert none == Engines()
    on_mig = dataclasses.replace(a, mig_uuid="MIG-x")
    state = step(Engines(), [gpu({"memory_copy": 0.5, "decoder": 0.0})], [on_mig], [pod_key(on_mig)], 4.0)
    assert state.pod_now == {} and state.pod_busy == {}


def test_the_rows_carry_the_figures_of_the_last_closed_window() -> None:
    a = pod("a", ProcessUse(memory_copy=0.5, decoder=0.1))
    usage, gpus, pods = accumulate(Usage(), [gpu()], [a], now=0.0)
    assert pods[0].engine_utilization == {} and gpus[0].engine_utilization == {}
    usage, gpus, pods = accumulate(usage, [gpu({"memory_copy": 0.5, "decoder": 0.2})], [a], now=10.0)
    assert pods[0].engine_utilization == pytest.approx({"memory_copy": 0.5, "decoder": 0.1})
    assert pods[0].engine_busy_seconds == pytest.approx({"memory_copy": 5.0, "decoder": 1.0})
    assert gpus[0].engine_utilization == {"memory_copy": 0.5, "decoder": 0.2}
    assert gpus[0].engine_busy_seconds == pytest.approx({"memory_copy": 5.0, "decoder": 2.0})
    _, _, pods = accumulate(usage, [gpu()], [pod("a", None)], now=12.0)
    assert pods[0].engine_utilization == {} and pods[0].engine_busy_seconds == {}


def test_the_pods_of_a_gpu_get_an_engine_only_once_it_has_been_used_there() -> None:
    llm = pod("llm", ProcessUse(0.9, memory_copy=0.8))
    state = run(Engines(), {"memory_copy": 0.9, "decoder": 0.0}, [llm], 10.0)
    # Nobody decoded: no decoder figure for the pods, the GPU's own reads 0.
    assert state.pod_now[pod_key(llm)] == pytest.approx({"memory_copy": 0.8})
    assert "decoder" not in state.pod_busy[pod_key(llm)] and state.gpu_now["GPU-a"]["decoder"] == 0.0
    video = pod("video", ProcessUse(0.1, decoder=0.5))
    state = run(state, {"memory_copy": 0.9, "decoder": 0.5}, [llm, video], 10.0)
    assert state.pod_now[pod_key(llm)]["decoder"] == 0.0 and state.pod_now[pod_key(video)]["decoder"] == 0.5
    # Used once, kept: the decoder going idle again leaves every pod its figure, at 0.
    state = run(state, {"memory_copy": 0.9, "decoder": 0.0}, [llm], 10.0)
    assert state.pod_now[pod_key(llm)]["decoder"] == 0.0
    assert state.pod_busy[pod_key(llm)]["decoder"] == 0.0
