"""A kubelet pod-resources double: the real `v1.PodResourcesLister` over gRPC on a Unix socket."""

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


class KubeletDouble:
    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.pods: dict[tuple[str, str], Any] = {}
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

    def remove(self, namespace: str, name: str) -> None:
        self.pods.pop((namespace, name), None)
