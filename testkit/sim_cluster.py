"""A simulated node's pods served the way a cluster serves them: the Kubernetes API double
(HTTPS, the API's JSON) and the kubelet double (pod-resources gRPC on a Unix socket).

The agent then runs `--simulate` with its production Kubernetes and
pod-resources clients loaded and in use, as in a cluster.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.proc_tree import container_id
from otel_vgpu.sim.scenario import PodSpec, Scenario, pod_containers
from testkit.certs import Certs, make_certs
from testkit.kube_api_double import KubeApiDouble, bind_request_object, pod_object
from testkit.kubelet_double import KubeletDouble


@dataclass(frozen=True)
class SimCluster:
    api: KubeApiDouble
    kubelet: KubeletDouble
    env: dict[str, str]
    """What a pod's environment adds: where the API server is."""
    args: list[str]
    """The agent's flags: the service account and the kubelet socket."""


def populate(scenario: Scenario, node_name: str, api: KubeApiDouble, kubelet: KubeletDouble, directory: Path) -> None:
    """Every pod of the scenario in the API, with its containers' IDs, labels, annotations and
    service account, and the BindRequest KAI Scheduler wrote for it; every device share in the kubelet."""
    for pod in scenario.pods:
        if not pod.in_directory:
            continue
        api.put(api_pod(pod, node_name))
        if pod.bind_request is not None:
            spec = pod.bind_request
            request = bind_request_object(
                pod.namespace,
                pod.name,
                pod.uid,
                spec.node or node_name,
                resource_type=spec.type,
                portion=spec.portion,
                groups=spec.groups,
                count=max(1, len(spec.groups)),
                phase=spec.phase,
            )
            api.put_bind_request(request)
    view = SimulatedNode(scenario, directory).kubelet_view(0.0)
    grouped: dict[tuple[str, str, str], dict[str, list[str]]] = defaultdict(dict)
    for device in view.devices:
        ids = grouped[(device.namespace, device.pod, device.resource)].setdefault(device.container, [])
        ids += device.device_ids
    for (namespace, name, resource), assigned in grouped.items():
        kubelet.assign(namespace, name, assigned, resource=resource)
    for namespace, name in view.pods or ():
        kubelet.list_pod(namespace, name)


def api_pod(pod: PodSpec, node_name: str) -> dict[str, Any]:
    """A simulated pod as the API serves it."""
    containers = {name: container_id(pod, name) for name in pod_containers(pod.processes)}
    return pod_object(
        pod.namespace,
        pod.name,
        pod.uid,
        node_name,
        containers=containers,
        annotations=dict(pod.annotations),
        labels=dict(pod.labels),
        service_account=pod.service_account,
    )


def service_account(directory: Path, certs: Certs, token: str = "test-token") -> Path:
    """A pod's service-account directory (token, namespace, the API's CA), as the kubelet mounts it."""
    account = directory / "serviceaccount"
    account.mkdir(parents=True, exist_ok=True)
    (account / "token").write_text(token)
    (account / "namespace").write_text("otel-vgpu")
    (account / "ca.crt").write_bytes(certs.ca.read_bytes())
    return account


@contextmanager
def sim_cluster(scenario: Scenario, directory: Path) -> Iterator[SimCluster]:
    node_name = scenario.node_name or "sim-node"
    certs = make_certs(directory / "pki")
    account = service_account(directory, certs)
    api = KubeApiDouble(certs, node_name).start()
    socket_path = directory / "kubelet.sock"
    kubelet = KubeletDouble(socket_path).start()
    try:
        populate(scenario, node_name, api, kubelet, directory / "proc-for-view")
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port)}
        args = [
            "--node-name",
            node_name,
            "--service-account-dir",
            str(account),
            "--pod-resources-socket",
            str(socket_path),
        ]
        yield SimCluster(api, kubelet, env, args)
    finally:
        kubelet.stop()
        api.stop()
