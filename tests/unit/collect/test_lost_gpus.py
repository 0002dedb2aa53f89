"""Which GPUs the agent knows and which it has lost, sweep by sweep: pure, with devices in and
identities out (collect/lost_gpus.py)."""

from __future__ import annotations

import pytest

from otel_vgpu.collect.lost_gpus import GpuIdentity, after_sweep
from otel_vgpu.gpu.backend import Device

pytestmark = pytest.mark.unit

A = Device(0, "GPU-a", "H100", 80, 0, 0.0)
B = Device(1, "GPU-b", "H200", 141, 0, 0.0)


def test_a_gpu_read_once_and_then_not_is_lost_under_its_last_identity() -> None:
    known, lost = after_sweep({}, [A, B])
    assert lost == ()
    known, lost = after_sweep(known, [A])
    assert lost == (GpuIdentity(1, "GPU-b", "H200"),)
    known, lost = after_sweep(known, [A])  # still lost, sweep after sweep
    assert lost == (GpuIdentity(1, "GPU-b", "H200"),)
    known, lost = after_sweep(known, [A, B])  # read again
    assert lost == () and set(known) == {"GPU-a", "GPU-b"}


def test_a_sweep_that_read_nothing_loses_every_known_gpu_and_one_never_read_is_not_lost() -> None:
    known, _ = after_sweep({}, [B])
    _, lost = after_sweep(known, [])
    assert lost == (GpuIdentity(1, "GPU-b", "H200"),)
    assert after_sweep({}, []) == ({}, ())


def test_a_gpu_is_known_by_its_uuid_and_keeps_the_index_it_last_had() -> None:
    # After an NVML re-initialisation GPU-b is listed at index 0, then lost: its labels are the newest.
    known, _ = after_sweep({}, [A, B])
    known, lost = after_sweep(known, [Device(0, "GPU-b", "H200", 141, 0, 0.0)])
    assert lost == (GpuIdentity(0, "GPU-a", "H100"),)
    _, lost = after_sweep(known, [])
    assert lost == (GpuIdentity(0, "GPU-a", "H100"), GpuIdentity(0, "GPU-b", "H200"))
