"""The sampling window of process SM utilization."""

from __future__ import annotations

import pytest

from otel_vgpu.gpu.backend import ProcessUse, UtilizationSample
from otel_vgpu.gpu.sampling import MIN_WINDOW_US, SamplingWindows, fit_under, mean_use_by_pid, window_start

pytestmark = pytest.mark.unit

S = 1_000_000


def test_first_collection_looks_back_one_second() -> None:
    assert window_start(None, 100 * S) == 99 * S


def test_window_runs_since_the_previous_collection() -> None:
    assert window_start(70 * S, 100 * S) == 70 * S


def test_close_collections_still_look_back_one_second() -> None:
    assert window_start(int(99.8 * S), 100 * S) == 100 * S - MIN_WINDOW_US


def test_mean_per_pid_inside_the_window_only() -> None:
    samples = [
        UtilizationSample(1, 10 * S, ProcessUse(0.9)),  # at the window's start: excluded
        UtilizationSample(1, 11 * S, ProcessUse(0.4)),
        UtilizationSample(1, 12 * S, ProcessUse(0.6)),
        UtilizationSample(2, 12 * S, ProcessUse(0.1)),
        UtilizationSample(3, 9 * S, ProcessUse(1.0)),  # before the window
    ]
    assert mean_use_by_pid(samples, since_us=10 * S) == {1: ProcessUse(0.5), 2: ProcessUse(0.1)}


def test_out_of_range_values_are_clamped() -> None:
    assert mean_use_by_pid(
        [UtilizationSample(1, 2, ProcessUse(1.7)), UtilizationSample(2, 2, ProcessUse(-0.1))], 1
    ) == {
        1: ProcessUse(1.0),
        2: ProcessUse(0.0),
    }


def test_windows_are_per_gpu_and_forget_removed_gpus() -> None:
    windows = SamplingWindows()
    windows.advance("GPU-a", 50 * S)
    assert windows.start("GPU-a", 60 * S) == 50 * S
    assert windows.start("GPU-b", 60 * S) == 59 * S
    windows.keep_only(["GPU-b"])
    assert windows.start("GPU-a", 60 * S) == 59 * S


def test_processes_that_read_above_the_gpu_are_fitted_under_it_in_proportion() -> None:
    # A burst that just ended: the bursty process's last figure is high, the GPU's
    # mean over the window is not. The GPU's figure is the total, split as they read.
    [fitted] = fit_under([{1: ProcessUse(0.6), 2: ProcessUse(0.3)}], 0.45)
    assert sum(use.sm for use in fitted.values()) == pytest.approx(0.45)
    assert fitted[1].sm == pytest.approx(2 * fitted[2].sm)
    # A PID's earlier holder and its holder now fit together, by one factor.
    now, before = fit_under([{1: ProcessUse(0.6)}, {1: ProcessUse(0.3)}], 0.45)
    assert now[1].sm + before[1].sm == pytest.approx(0.45) and now[1].sm == pytest.approx(2 * before[1].sm)


def test_processes_under_the_gpu_or_without_its_figure_are_left_as_read() -> None:
    read = {1: ProcessUse(0.2), 2: ProcessUse(0.1)}
    assert fit_under([read], 0.5) == [read]
    assert fit_under([{1: ProcessUse(0.7)}], None) == [{1: ProcessUse(0.7)}]
    assert fit_under([{1: ProcessUse(0.0)}], 0.0) == [{1: ProcessUse(0.0)}]
