"""Shares from the kubelet: the real gRPC client against the kubelet double,
and how long a failing kubelet's last answer is trusted."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from otel_vgpu.gpu.backend import Device
from otel_vgpu.health import Health, Stage
from otel_vgpu.kubernetes.podresources import KEEP_LAST_GOOD_CALLS, KubeletAllocation, PodResourcesClient
from otel_vgpu.pods.directory import PodMeta
from testkit.kubelet_double import KubeletDouble

GPU = Device(index=0, uuid="GPU-0000", model="H200", memory_total=100, memory_used=0, utilization=0.0)
UID = "6b1f6c9e-3a3c-4d7b-9b5e-0c2f6a1d8e01"


class OnePod:
    """The API's view of a node with one pod that asks for one GPU."""

    def pods(self) -> Mapping[str, PodMeta]:
        return {UID: PodMeta("web", "idle-0", containers={}, gpu_limits={"main": 1})}

    def uid_of(self) -> dict[tuple[str, str], str]:
        return {("web", "idle-0"): UID}


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletDouble]:
    double = KubeletDouble(tmp_path / "kubelet.sock").start()
    double.assign("web", "idle-0", {"main": ["GPU-0000::3"]})
    yield double
    double.stop()


def test_a_failing_kubelet_keeps_its_last_answer_for_a_few_calls(kubelet: KubeletDouble) -> None:
    health = Health()
    allocation = KubeletAllocation(OnePod(), PodResourcesClient(kubelet.socket_path), health=health, poll_seconds=3600)
    placed_on_gpu = {(UID, "main", "GPU-0000"): 1.0}
    try:
        allocation._poll()
        assert allocation.allocation([GPU]).placed == placed_on_gpu
        kubelet.unavailable = True
        for failed in range(1, KEEP_LAST_GOOD_CALLS + 1):
            allocation._poll()
            # still the kubelet's answer: the device, on its GPU
            assert allocation.allocation([GPU]).placed == placed_on_gpu, f"after {failed} failed calls"
        allocation._poll()
        fallback = allocation.allocation([GPU])
        # the pod's limits: one share, GPU unknown
        assert fallback.placed == {} and fallback.unplaced == {(UID, "main"): 1.0}
        assert health.counts()[Stage.POD_RESOURCES] == KEEP_LAST_GOOD_CALLS + 1
        kubelet.unavailable = False
        allocation._poll()
        assert allocation.allocation([GPU]).placed == placed_on_gpu
        # a new failure after recovery gets the whole allowance again
        kubelet.unavailable = True
        allocation._poll()
        assert allocation.allocation([GPU]).placed == placed_on_gpu
    finally:
        allocation.stop()
