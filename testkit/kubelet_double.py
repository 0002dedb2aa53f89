"""A kubelet pod-resources double: the real `v1.PodResourcesLister` over gRPC on a Unix socket.

It serves `List` (device-plugin devices and DRA claims per container, as
kubelets from 1.34 fill `dynamic_resources`) and `GetAllocatableResources`,
or answers UNIMPLEMENTED to it as a kubelet before 1.23 does.
"""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from otel_vgpu.kubernetes.kubelet import podresources_pb2, podresources_pb2_grpc


class _Lister(podresources_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, double: KubeletDouble) -> None:
        self.double = double

    def List(self, request: Any, context: Any) -> Any:
        self.double.calls += 1
        if self.double.unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
        return podresources_pb2.ListPodResourcesResponse(pod_resources=list(self.double.pods.values()))

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        if self.double.unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
        allocatable = self.double.allocatable
        if allocatable is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources")
            return None
        return podresources_pb2.AllocatableResourcesResponse(
            devices=[
                podresources_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                for resource, ids in allocatable.items()
            ]
        )


class KubeletDouble:
    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.pods: dict[tuple[str, str], Any] = {}
        self.allocatable: dict[str, list[str]] | None = {}
        """Resource -> the device IDs its plugin advertises; None: UNIMPLEMENTED."""
        self.unavailable = False
        self.calls = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), self._server)
        self._server.add_insecure_port(f"unix://{socket_path}")

    def start(self) -> KubeletDouble:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)

    def assign(
        self, namespace: str, name: str, containers: dict[str, list[str]], resource: str = "nvidia.com/gpu"
    ) -> None:
        """Give a pod's containers these device IDs of `resource`."""
        self.pods[(namespace, name)] = podresources_pb2.PodResources(
            name=name,
            namespace=namespace,
            containers=[
                podresources_pb2.ContainerResources(
                    name=cname,
                    devices=[podresources_pb2.ContainerDevices(resource_name=resource, device_ids=ids)],
                )
                for cname, ids in containers.items()
            ],
        )

    def list_pod(self, namespace: str, name: str, containers: tuple[str, ...] = ("main",)) -> None:
        """List a pod with no device, as the kubelet lists every pod of its node (a pod
        given devices already is left as it is)."""
        self.pods.setdefault(
            (namespace, name),
            podresources_pb2.PodResources(
                name=name,
                namespace=namespace,
                containers=[podresources_pb2.ContainerResources(name=container) for container in containers],
            ),
        )

    def claim(self, namespace: str, name: str, container: str, claim: str, driver: str, pool: str, device: str) -> None:
        """Add a DRA claim's device to a pod's container (the pod is created if needed)."""
        pod = self.pods.get((namespace, name)) or podresources_pb2.PodResources(name=name, namespace=namespace)
        target = next((c for c in pod.containers if c.name == container), None)
        if target is None:
            target = pod.containers.add(name=container)
        target.dynamic_resources.add(
            claim_name=claim,
            claim_namespace=namespace,
            claim_resources=[
                podresources_pb2.ClaimResource(
                    cdi_devices=[podresources_pb2.CDIDevice(name=f"k8s.{driver}/claim={claim}-{device}")],
                    driver_name=driver,
                    pool_name=pool,
                    device_name=device,
                )
            ],
        )
        self.pods[(namespace, name)] = pod

    def remove(self, namespace: str, name: str) -> None:
        self.pods.pop((namespace, name), None)
