"""Shares from the kubelet: the real gRPC client against the kubelet double,
and how long a failing kubelet's last answer is trusted."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from otel_vgpu.agent_health import AgentHealth, Stage
from otel_vgpu.allocation.shares import Grant
from otel_vgpu.gpu.backend import Device
from otel_vgpu.kubernetes.podresources import KEEP_LAST_GOOD_CALLS, KubeletAllocation, PodResourcesClient
from otel_vgpu.pods.directory import PodMeta
from testkit.kubelet_double import KubeletDouble

GPU = Device(index=0, uuid="GPU-0000", model="H200", memory_total=100, memory_used=0, utilization=0.0)
UID = "6b1f6c9e-3a3c-4d7b-9b5e-0c2f6a1d8e01"


class OnePod:
    """The API's view of a node with one pod that asks for one GPU."""

    def pods(self) -> Mapping[str, PodMeta]:
        return {UID: PodMeta("web", "idle-0", containers={}, gpu_limits={"main": 1})}


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletDouble]:
    double = KubeletDouble(tmp_path / "kubelet.sock").start()
    double.assign("web", "idle-0", {"main": ["GPU-0000::3"]})
    yield double
    double.stop()


def test_a_failing_kubelet_keeps_its_last_answer_for_a_few_calls(kubelet: KubeletDouble) -> None:
    health = AgentHealth()
    allocation = KubeletAllocation(OnePod(), PodResourcesClient(kubelet.socket_path), health=health, poll_seconds=3600)
    placed_on_gpu = {(UID, "main", "GPU-0000"): Grant(1.0)}
    try:
        allocation._poll()
        assert allocation.allocation([GPU]).placed == placed_on_gpu
        # List named the pod (through the real proto): its allocation is known
        assert allocation.allocation([GPU]).answered == {UID}
        kubelet.unavailable = True
        for failed in range(1, KEEP_LAST_GOOD_CALLS + 1):
            allocation._poll()
            # still the kubelet's answer: the device, on its GPU
            assert allocation.allocation([GPU]).placed == placed_on_gpu, f"after {failed} failed calls"
        allocation._poll()
        fallback = allocation.allocation([GPU])
        # the pod's limits: one share, GPU unknown
        assert fallback.placed == {} and fallback.unplaced == {(UID, "main"): 1.0}
        assert fallback.answered == frozenset()  # limits leave other pods' allocations open
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


def test_dra_claims_and_replica_counts_come_through_the_real_protocol(kubelet: KubeletDouble) -> None:
    gpu = Device(0, "GPU-0000", "H200", 100, 0, 0.0, minor_number=0)
    kubelet.claim("web", "idle-0", "main", "gpu-claim", "gpu.nvidia.com", "node-1", "gpu-0")
    kubelet.allocatable = {"nvidia.com/gpu": [f"GPU-0000::{n}" for n in range(4)], "example.com/nic": ["eth0"]}
    client = PodResourcesClient(kubelet.socket_path)
    try:
        view = client.list()
        allocation = KubeletAllocation(OnePod(), client, poll_seconds=3600)
        allocation._poll()
        got = allocation.allocation([gpu])
    finally:
        client.close()
    assert [(c.claim, c.driver, c.pool, c.device) for c in view.claims] == [
        ("web/gpu-claim", "gpu.nvidia.com", "node-1", "gpu-0")
    ]
    # The device-plugin replica and the whole GPU through the claim, one container's.
    assert dict(got.placed) == {(UID, "main", "GPU-0000"): Grant(1.0).plus(Grant(1.0, 100, 1.0))}
    assert got.replicas == {"GPU-0000": 4}


def test_a_kubelet_without_get_allocatable_still_lists(kubelet: KubeletDouble) -> None:
    kubelet.allocatable = None  # before 1.23: UNIMPLEMENTED
    health = AgentHealth()
    client = PodResourcesClient(kubelet.socket_path)
    allocation = KubeletAllocation(OnePod(), client, health=health, poll_seconds=3600)
    try:
        allocation._poll()
        allocation._poll()
        got = allocation.allocation([GPU])
    finally:
        client.close()
    assert dict(got.placed) == {(UID, "main", "GPU-0000"): Grant(1.0)}
    assert got.replicas is None
    assert health.counts().get(Stage.POD_RESOURCES, 0) == 0


def _frame(kind: int, payload: bytes = b"") -> bytes:
    """An HTTP/2 frame on stream 0 (RFC 9113 4.1)."""
    return len(payload).to_bytes(3, "big") + bytes([kind, 0]) + (0).to_bytes(4, "big") + payload


def test_a_kubelet_that_sends_unknown_frames_fails_the_call_in_one_line_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A peer speaking HTTP/2 with a frame type grpclib does not handle (0xFA): its
    # connection drops under the call, which says why, with no traceback logged.
    import contextlib  # noqa: PLC0415
    import socket  # noqa: PLC0415
    import threading  # noqa: PLC0415

    path = tmp_path / "kubelet.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)
    server.settimeout(10)
    stop = threading.Event()

    def answer(connection: socket.socket) -> None:
        with connection:
            connection.recv(65536)  # the client's preface and request
            connection.sendall(_frame(0x4) + _frame(0xFA, b"unknown"))  # SETTINGS, then the unknown frame
            # Then an end of output, and what the client sends read until it leaves: a close
            # with its bytes unread would reset the connection before it reads the frame.
            connection.shutdown(socket.SHUT_WR)
            with contextlib.suppress(OSError):
                while connection.recv(65536):
                    pass

    def serve() -> None:
        # Each connection on a thread of its own: the next call is accepted at once.
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(connection,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    health = AgentHealth()
    allocation = KubeletAllocation(OnePod(), PodResourcesClient(path), health=health, poll_seconds=3600)
    try:
        with caplog.at_level("DEBUG"):
            for _ in range(2):
                allocation._poll()
    finally:
        allocation.stop()
        stop.set()
        server.close()
    assert health.counts()[Stage.POD_RESOURCES] == 2
    loud = [r for r in caplog.records if r.levelno >= 30]
    assert len(loud) == 1 and "UnknownFrameReceived" in loud[0].getMessage(), [r.getMessage() for r in loud]
    assert not [r for r in caplog.records if r.exc_info], "no traceback"
