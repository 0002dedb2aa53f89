"""The sampling window of process SM utilization."""

from __future__ import annotations

import pytest

from otel_vgpu.gpu.backend import USE_FIGURES, ProcessUse
from otel_vgpu.gpu.sampling import MIN_WINDOW_US, SamplingWindows, window_start

pytestmark = pytest.mark.unit

S = 1_000_000


def test_first_collection_looks_back_one_second() -> None:
    assert window_start(None, 100 * S) == 99 * S


def test_window_runs_since_the_previous_collection() -> None:
    assert window_start(70 * S, 100 * S) == 70 * S


def test_close_collections_still_look_back_one_second() -> None:
    assert window_start(int(99.8 * S), 100 * S) == 100 * S - MIN_WINDOW_US


def test_windows_are_per_gpu_and_forget_removed_gpus() -> None:
    windows = SamplingWindows()
    windows.advance("GPU-a", 50 * S)
    assert windows.start("GPU-a", 60 * S) == 50 * S
    assert windows.start("GPU-b", 60 * S) == 59 * S
    windows.keep_only(["GPU-b"])
    assert windows.start("GPU-a", 60 * S) == 59 * S


def test_process_use_sums_and_caps_every_figure() -> None:
    # `plus` and `capped` name each figure (gpu/backend.py): a figure added must be added there.
    one = ProcessUse(**{f: 0.25 * (k + 1) for k, f in enumerate(USE_FIGURES)})
    summed = one.plus(one)
    assert [getattr(summed, f) for f in USE_FIGURES] == [0.5 * (k + 1) for k in range(len(USE_FIGURES))]
    assert [getattr(summed.capped(), f) for f in USE_FIGURES] == [
        min(1.0, 0.5 * (k + 1)) for k in range(len(USE_FIGURES))
    ]
