"""vGPU shares from the kubelet's pod-resources API, with pod limits as fallback.

The kubelet serves `v1.PodResourcesLister` over gRPC on a Unix socket. The
client is grpclib (gRPC over h2, in pure Python) rather than grpcio, whose
core costs an agent about 16 MiB of resident memory for two calls every few
seconds (bench/scrape_bench.py, part 5). A background thread calls `List` (device-plugin devices and DRA claims per
container) and `GetAllocatableResources` (every device the device plugins
advertise: the replica counts behind `auto`) every few seconds; sweeps use
the latest answer and never wait for the kubelet. One failed call (a kubelet restart, a
slow answer) does not change the shares: the last good answer stays in force
through `KEEP_LAST_GOOD_CALLS` failed calls in a row. Only then, and until
the kubelet answers again, shares come from the GPU limits in the pod specs
(count known, GPU not). Every failed call is counted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from otel_vgpu.agent_health import AgentHealth, Reader, Stage
from otel_vgpu.allocation.kai import KaiView
from otel_vgpu.allocation.shares import (
    Allocation,
    ClaimAssignment,
    DeviceAssignment,
    KubeletView,
    from_kubelet,
    from_limits,
)
from otel_vgpu.config import DEFAULT_RESOURCES, DRA_DRIVERS
from otel_vgpu.gpu.backend import Device
from otel_vgpu.pods.directory import PodMeta
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)

POLL_SECONDS = 5.0
CALL_TIMEOUT_S = 2.0
# Failed calls in a row through which the last good answer is kept: 15 s at
# the default interval, longer than a kubelet restart takes to reopen the socket.
KEEP_LAST_GOOD_CALLS = 3


class PodResourcesError(Exception):
    pass


class PodResourcesClient:
    """`List` and `GetAllocatableResources` on the kubelet's pod-resources socket.

    Calls run on an event loop of the client's own, one at a time, from
    whichever thread asks (the agent's start, then the polling thread).
    """

    def __init__(self, socket_path: Path, timeout: float = CALL_TIMEOUT_S) -> None:
        from grpclib.client import Channel, UnaryUnaryMethod  # noqa: PLC0415

        from otel_vgpu.kubernetes.kubelet import podresources_pb2 as pb  # noqa: PLC0415

        self._pb = pb
        self._socket_path = socket_path
        self._timeout = timeout
        self._loop = asyncio.new_event_loop()
        # What broke the connection under a call, for that call's one line: grpclib raises
        # out of data_received on what it does not handle (an HTTP/2 frame of an unknown
        # type, which RFC 9113 4.1 says to ignore), and asyncio would log that with two
        # tracebacks before dropping the connection.
        self._broken: str | None = None
        self._loop.set_exception_handler(self._connection_broke)
        self._lock = threading.Lock()

        async def channel() -> Channel:
            # Made on the loop it will run on; it connects on the first call.
            return Channel(path=str(socket_path))

        self._channel = self._loop.run_until_complete(channel())
        self._list = UnaryUnaryMethod(
            self._channel, f"{SERVICE}/List", pb.ListPodResourcesRequest, pb.ListPodResourcesResponse
        )
        self._get_allocatable = UnaryUnaryMethod(
            self._channel,
            f"{SERVICE}/GetAllocatableResources",
            pb.AllocatableResourcesRequest,
            pb.AllocatableResourcesResponse,
        )
        self._allocatable = True

    def list(self) -> KubeletView:
        """Both calls. A kubelet without GetAllocatableResources (before
        1.23, or with its gate off) answers UNIMPLEMENTED: the view then
        has no replica counts, and that is not a failure."""
        if not os.path.lexists(self._socket_path) and os.access(self._socket_path.parent, os.X_OK):
            # Certainly absent (a directory the agent may not enter says nothing): the call would say less.
            raise PodResourcesError(missing_socket(self._socket_path))
        with self._lock:
            return self._loop.run_until_complete(self._both())

    async def _both(self) -> KubeletView:
        from grpclib.const import Status  # noqa: PLC0415
        from grpclib.exceptions import GRPCError  # noqa: PLC0415

        response = await self._call(self._list, self._pb.ListPodResourcesRequest(), "List")
        allocatable = None
        if self._allocatable:
            try:
                answer = await self._call(
                    self._get_allocatable, self._pb.AllocatableResourcesRequest(), "GetAllocatableResources", raw=True
                )
            except GRPCError as error:
                if error.status is not Status.UNIMPLEMENTED:
                    raise PodResourcesError(f"GetAllocatableResources {_status(error)}") from None
                log.info("the kubelet has no GetAllocatableResources; replica counts (ratio auto) are unknown")
                self._allocatable = False
            else:
                allocatable = tuple((d.resource_name, tuple(d.device_ids)) for d in answer.devices)
        return view_of(response, allocatable)

    async def _call(self, method: Any, request: Any, name: str, raw: bool = False) -> Any:
        """One unary call; any failure but a gRPC status (with `raw`) as PodResourcesError."""
        from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError  # noqa: PLC0415
        from h2.exceptions import H2Error  # noqa: PLC0415

        try:
            answer = await method(request, timeout=self._timeout)
        except GRPCError as error:
            if raw:
                raise
            raise PodResourcesError(f"{name} {_status(error)}") from None
        except TimeoutError:
            raise PodResourcesError(f"{name} DEADLINE_EXCEEDED: no answer within {self._timeout:g} s") from None
        except (OSError, StreamTerminatedError, ProtocolError, H2Error) as error:
            # A socket that is not there (yet), refused, or a connection dropped mid-call:
            # the next call connects again.
            self._channel.close()
            # What broke a connection stays the reason until a call succeeds: a call that
            # finds the connection already gone says the same, and is logged as one kind.
            why = self._broken or f"{type(error).__name__}: {error}"
            raise PodResourcesError(f"{name} UNAVAILABLE: {why}") from None
        self._broken = None
        return answer

    def _connection_broke(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if error is None:
            loop.default_exception_handler(context)
            return
        detail = str(error)[:200]
        self._broken = f"the kubelet's connection broke on what it sent ({type(error).__name__}: {detail})"
        log.debug("pod-resources connection: %s: %r", context.get("message"), error)

    def close(self) -> None:
        with self._lock:
            self._channel.close()
            # Let the closed connection's callbacks run, then release the loop.
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()


SERVICE = "/v1.PodResourcesLister"
# Kubelet root directories other than /var/lib/kubelet, where the socket is <root>/pod-resources/kubelet.sock.
OTHER_KUBELET_ROOTS = {"k0s": "/var/lib/k0s/kubelet", "microk8s": "/var/snap/microk8s/common/var/lib/kubelet"}


def missing_socket(path: Path) -> str:
    """Why there is no socket, and what to do: most often the kubelet's root
    directory is not /var/lib/kubelet on this node."""
    others = ", ".join(f"{name}: {root}" for name, root in OTHER_KUBELET_ROOTS.items())
    return (
        f"no kubelet pod-resources socket at {path}: the kubelet keeps it in <root dir>/pod-resources, and its "
        f"root dir on this node may not be the one mounted there ({others}, or the kubelet's --root-dir); mount "
        "the right one (kustomize/components/kubelet-root-*)"
    )


def _status(error: Any) -> str:
    return f"{error.status.name}: {error.message}" if error.message else str(error.status.name)


def view_of(response: Any, allocatable: tuple[tuple[str, tuple[str, ...]], ...] | None) -> KubeletView:
    """A `ListPodResourcesResponse` as plain data."""
    devices = []
    claims = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for group in container.devices:
                devices.append(
                    DeviceAssignment(
                        pod.namespace, pod.name, container.name, group.resource_name, tuple(group.device_ids)
                    )
                )
            for dynamic in container.dynamic_resources:
                for resource in dynamic.claim_resources:
                    claims.append(
                        ClaimAssignment(
                            pod.namespace,
                            pod.name,
                            container.name,
                            f"{dynamic.claim_namespace}/{dynamic.claim_name}",
                            resource.driver_name,
                            resource.pool_name,
                            resource.device_name,
                        )
                    )
    pods = tuple((pod.namespace, pod.name) for pod in response.pod_resources)
    return KubeletView(tuple(devices), tuple(claims), allocatable, pods)


class NodePods(Protocol):
    """What the allocation needs of the pod directory (the Kubernetes API's view of this node)."""

    def pods(self) -> Mapping[str, PodMeta]: ...


class KaiSource(Protocol):
    """What the allocation needs of KAI Scheduler's BindRequests (kubernetes/bind_requests.py)."""

    def view(self, pods: Mapping[str, PodMeta]) -> KaiView | None: ...


class KubeletAllocation:
    """Shares from pod-resources when the kubelet answers, else from pod limits."""

    def __init__(
        self,
        directory: NodePods,
        client: PodResourcesClient | None,
        resources: Iterable[str] = DEFAULT_RESOURCES,
        health: AgentHealth | None = None,
        poll_seconds: float = POLL_SECONDS,
        kai: KaiSource | None = None,
    ) -> None:
        self._directory = directory
        self._kai = kai
        self._client = client
        self._resources = tuple(resources)
        self._health = health or AgentHealth()
        self._poll_seconds = poll_seconds
        self._latest: KubeletView | None = None
        self._failed_calls = 0
        self._stop = threading.Event()
        self._thread = NamedThread(target=self._run, name="pod-resources", daemon=True)

    def start(self) -> None:
        if self._client is not None:
            self._poll()
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._client is not None:
            if self._thread.ident is not None:
                self._thread.join(timeout=5)
            self._client.close()

    def allocation(self, gpus: Sequence[Device]) -> Allocation:
        latest = self._latest
        pods = self._directory.pods()
        kai = self._kai.view(pods) if self._kai is not None else None
        if latest is None:
            return from_limits(pods, gpus, kai)
        return from_kubelet(latest, pods, gpus, self._resources, DRA_DRIVERS, kai)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_seconds):
            self._poll()

    def _poll(self) -> None:
        assert self._client is not None
        started = time.monotonic()
        try:
            self._latest = self._client.list()
        except PodResourcesError as error:
            self._health.passed(Reader.POD_RESOURCES, time.monotonic() - started, False)
            self._failed_calls += 1
            kept = self._latest is not None and self._failed_calls <= KEEP_LAST_GOOD_CALLS
            then = (
                f"keeping its last answer for up to {KEEP_LAST_GOOD_CALLS} failed calls"
                if kept
                else "shares come from pod GPU limits until it answers"
            )
            self._health.failed(Stage.POD_RESOURCES, str(error), f"kubelet pod-resources API failed ({error}); {then}")
            if self._latest is not None and not kept:
                self._latest = None
                log.warning(
                    "kubelet pod-resources API failed %d times in a row; shares come from pod GPU limits "
                    "until it answers",
                    self._failed_calls,
                )
            return
        self._failed_calls = 0
        self._health.passed(Reader.POD_RESOURCES, time.monotonic() - started, True)
        self._health.recovered(Stage.POD_RESOURCES, "kubelet pod-resources API answers again")
