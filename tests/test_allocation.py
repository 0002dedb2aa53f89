"""Device IDs to GPUs, and shares from the kubelet or from pod limits."""

from __future__ import annotations

import pytest

from otel_vgpu.allocation.shares import DeviceAssignment, from_limits, from_pod_resources, gpu_of_device
from otel_vgpu.gpu.backend import Device
from otel_vgpu.pods.directory import PodMeta

U0 = "GPU-5f1c7a3e-2b9d-4e61-9c0a-7d3e8f21b604"
U1 = "GPU-a83d02c4-6e17-4b5f-8d92-1c4f6b7e9a30"
GPUS = [Device(0, U0, "A100", 80, 0, 0.0), Device(1, U1, "A100", 80, 0, 0.0)]
MIG = "MIG-0b2c3a4d-1111-2222-3333-444455556666"


@pytest.mark.parametrize(
    ("device_id", "gpu"),
    [
        (U1, U1),  # a whole GPU
        (f"{U0}::3", U0),  # a time-slicing or MPS replica
        (MIG, U1),  # a MIG device, through its parent
        ("nvidia1/vgpu3", U1),  # GKE's names, by NVML index
        ("nvidia0", U0),
        ("1", U1),  # a bare index
        ("GPU-00000000-0000-0000-0000-000000000000", None),  # not on this node
        ("nvidia7/vgpu0", None),
        ("MIG-ffffffff-0000-0000-0000-000000000000", None),
        ("something-else", None),
    ],
)
def test_device_ids(device_id: str, gpu: str | None) -> None:
    assert gpu_of_device(device_id, GPUS, {MIG: U1}) == gpu


def test_shares_count_device_ids_per_pod_container_and_gpu() -> None:
    assignments = [
        DeviceAssignment("ml", "trainer", "main", "nvidia.com/gpu", (f"{U0}::0", f"{U0}::1", f"{U1}::0")),
        DeviceAssignment("ml", "trainer", "aux", "nvidia.com/gpu", (f"{U0}::2",)),
        DeviceAssignment("ml", "trainer", "main", "example.com/nic", ("eth1",)),
        DeviceAssignment("web", "api", "main", "nvidia.com/gpu", (U1,)),
        DeviceAssignment("ml", "unknown-pod", "main", "nvidia.com/gpu", (U1,)),
        DeviceAssignment("ml", "frac", "main", "example.com/vgpu", (f"{U1}::7",)),
    ]
    uid_of = {("ml", "trainer"): "uid-t", ("web", "api"): "uid-a", ("ml", "frac"): "uid-f"}
    allocation = from_pod_resources(assignments, uid_of, GPUS)
    assert dict(allocation.placed) == {
        ("uid-t", "main", U0): 2.0,
        ("uid-t", "main", U1): 1.0,
        ("uid-t", "aux", U0): 1.0,
        ("uid-a", "main", U1): 1.0,
    }
    custom = from_pod_resources(assignments, uid_of, GPUS, resources=["example.com/vgpu"])
    assert dict(custom.placed) == {("uid-f", "main", U1): 1.0}


def test_limits_are_unplaced_shares() -> None:
    pods = {
        "uid-t": PodMeta("ml", "trainer", gpu_limits={"main": 2, "aux": 0}),
        "uid-c": PodMeta("ml", "cpu-only"),
    }
    allocation = from_limits(pods)
    assert dict(allocation.unplaced) == {("uid-t", "main"): 2}
    assert not allocation.placed
