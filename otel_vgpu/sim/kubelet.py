"""What the kubelet, its device plugin and the Kubernetes API say of a scenario's pods: the
pod-resources view (devices and DRA claims assigned, devices advertised), the allocation the
agent's own rules count from it, and the pod directory.

The device IDs are each plugin's: NVIDIA's device plugin (replicas, renamed or not, and MIG
devices under either strategy), GKE's and HAMi's; the claims are the NVIDIA DRA driver's; the
BindRequests, KAI Scheduler's.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Sequence

from otel_vgpu.allocation.hami import ANNOTATION as HAMI_ANNOTATION
from otel_vgpu.allocation.hami import parse_hami
from otel_vgpu.allocation.kai import SHARED, BindRequest, KaiView, kai_marks, parse_portion
from otel_vgpu.allocation.shares import Allocation, ClaimAssignment, DeviceAssignment, KubeletView, from_kubelet
from otel_vgpu.config import DEFAULT_RESOURCES, DRA_DRIVERS
from otel_vgpu.gpu.backend import Device
from otel_vgpu.pods.directory import PodMeta, StaticDirectory
from otel_vgpu.sim.proc_tree import container_id
from otel_vgpu.sim.processes import churn_pod, churn_pods
from otel_vgpu.sim.scenario import GpuSpec, MigSpec, PodSpec, Scenario, pod_containers


def allocation(scenario: Scenario, t: float, gpus: Sequence[Device]) -> Allocation:
    """What a kubelet with the NVIDIA device plugin (and DRA driver) would answer for the
    scenario at time `t`, with KAI Scheduler's BindRequests, counted by the agent's own rules."""
    view = kubelet_view(scenario, t)
    return from_kubelet(view, pods_at(scenario, t), gpus, DEFAULT_RESOURCES, DRA_DRIVERS, kai_view(scenario))


def node_name(scenario: Scenario) -> str:
    return scenario.node_name or "sim-node"


def kai_view(scenario: Scenario) -> KaiView:
    """The BindRequests KAI's scheduler wrote for the scenario's pods (those that have one)."""
    return KaiView(node_name(scenario), tuple(bind_request(scenario, pod) for pod in scenario.pods if pod.bind_request))


def bind_request(scenario: Scenario, pod: PodSpec) -> BindRequest:
    spec = pod.bind_request
    assert spec is not None
    return BindRequest(
        namespace=pod.namespace,
        name=pod.name,
        owners=(pod.uid,),
        node=spec.node or node_name(scenario),
        resource_type=spec.type,
        portion=parse_portion(spec.portion),
        groups=spec.groups if spec.type == SHARED else (),
        phase=spec.phase,
    )


def directory(scenario: Scenario) -> StaticDirectory:
    """The pods the Kubernetes API would know of: the scenario's, and every churning pod."""
    pods = {pod.uid: pod_meta(pod) for pod in scenario.pods if pod.in_directory}
    if scenario.churn is not None:
        for index in range(scenario.churn.pods):
            pod = churn_pod(index)
            pods[pod.uid] = PodMeta(pod.namespace, pod.name, containers={container_id(pod, "main"): "main"})
    return StaticDirectory(pods)


def kubelet_view(scenario: Scenario, t: float) -> KubeletView:
    """pod-resources' List and GetAllocatableResources for the scenario at time `t`."""
    devices: list[DeviceAssignment] = []
    claims: list[ClaimAssignment] = []
    listed: list[tuple[str, str]] = []
    node = node_name(scenario)
    for pod in scenario.pods:
        if not pod.active(t):
            continue
        listed.append((pod.namespace, pod.name))
        container = pod_containers(pod.processes)[0]
        for index, count in pod.shares.items():
            gpu = scenario.gpus[index]
            # A scenario without replicas still gives each share its own replica ID.
            resource, ids = _advertised(scenario, gpu, None, max(gpu.replicas or 1, count))
            devices.append(DeviceAssignment(pod.namespace, pod.name, container, resource, ids[:count]))
        for (index, position), count in pod.mig_shares.items():
            gpu = scenario.gpus[index]
            mig = gpu.migs[position]
            resource, ids = _advertised(scenario, gpu, mig, max(mig.replicas, count))
            devices.append(DeviceAssignment(pod.namespace, pod.name, container, resource, ids[:count]))
        for claim in pod.claims:
            claims.append(
                ClaimAssignment(
                    pod.namespace,
                    pod.name,
                    claim.container,
                    f"{pod.namespace}/{claim.claim}",
                    DRA_DRIVERS[0],
                    node,
                    claim.device,
                )
            )
    for index in churn_pods(scenario, t):
        pod = churn_pod(index)
        gpu = scenario.gpus[index % len(scenario.gpus)]
        devices.append(DeviceAssignment(pod.namespace, pod.name, "main", "nvidia.com/gpu", (f"{gpu.uuid}::0",)))
        listed.append((pod.namespace, pod.name))
    return KubeletView(tuple(devices), tuple(claims), _allocatable(scenario), tuple(listed))


def _allocatable(scenario: Scenario) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    gpus = scenario.gpus
    if all(gpu.replicas is None and not gpu.migs for gpu in gpus):
        return None
    found: dict[str, list[str]] = {}
    for gpu in gpus:
        advertised: list[tuple[str, tuple[str, ...]]] = []
        if gpu.migs:
            advertised += [_advertised(scenario, gpu, mig, mig.replicas) for mig in gpu.migs]
        elif gpu.replicas is not None:
            advertised.append(_advertised(scenario, gpu, None, gpu.replicas))
        for resource, ids in advertised:
            found.setdefault(resource, []).extend(ids)
    return tuple((resource, tuple(ids)) for resource, ids in found.items())


def _advertised(scenario: Scenario, gpu: GpuSpec, mig: MigSpec | None, replicas: int) -> tuple[str, tuple[str, ...]]:
    """The resource and device IDs the scenario's device plugin advertises
    for a GPU or one of its MIG devices: NVIDIA's (internal/rm/device_map.go,
    devices.go), GKE's (pkg/gpu/nvidia/manager.go, mig/mig.go) or HAMi's."""
    plugin = scenario.device_plugin
    if plugin.kind == "gke":
        base = f"nvidia{gpu.minor}" if mig is None else f"nvidia{gpu.minor}/gi{mig.gpu_instance_id}"
        ids = (base,) if replicas <= 1 else tuple(f"{base}/vgpu{k}" for k in range(replicas))
        return "nvidia.com/gpu", ids
    if plugin.kind == "hami":
        # pkg/device-plugin/nvidiadevice: every GPU as its UUID, a dash and a replica number.
        return "nvidia.com/gpu", tuple(f"{gpu.uuid}-{k}" for k in range(max(1, replicas)))
    if mig is None:
        return _replica_ids(gpu.uuid, replicas, "nvidia.com/gpu", plugin.rename_by_default)
    resource = _mig_resource(mig, plugin.mig_strategy)
    return _replica_ids(mig.uuid, replicas, resource, plugin.rename_by_default)


def pods_at(scenario: Scenario, t: float) -> dict[str, PodMeta]:
    """The pods the API knows at `t`, by UID: the active ones of the scenario's, and the live churning pods."""
    pods = {pod.uid: pod_meta(pod) for pod in scenario.pods if pod.in_directory and pod.active(t)}
    for index in churn_pods(scenario, t):
        pod = churn_pod(index)
        pods[pod.uid] = PodMeta(pod.namespace, pod.name)
    return pods


def mirror_uid(config_hash: str) -> str:
    """The UID the API gives a static pod's mirror: the kubelet creates the mirror as a copy
    of the static pod (pkg/kubelet/pod/mirror_client.go, CreateMirrorPod, annotations and
    kubernetes.io/config.hash kept), and the API server gives every pod it creates a UID of
    its own. Derived from the hash here, so that a simulated node is the same every run."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_OID, f"mirror/{config_hash}"))


def pod_meta(pod: PodSpec) -> PodMeta:
    """What the Kubernetes API would say of a simulated pod."""
    containers = pod_containers(pod.processes)
    hami = pod.annotations.get(HAMI_ANNOTATION)
    return PodMeta(
        pod.namespace,
        pod.name,
        containers={container_id(pod, name): name for name in containers},
        phase=pod.phase,
        uid=mirror_uid(pod.uid) if pod.static else pod.uid,
        # Checked when the scenario was loaded.
        stated=parse_hami(hami, (), containers) if hami else {},
        kai=kai_marks(pod.labels, pod.annotations, pod.service_account, (), containers),
    )


def _replica_ids(uuid: str, replicas: int, resource: str, rename: bool) -> tuple[str, tuple[str, ...]]:
    """The resource and IDs the device plugin advertises for one device (internal/rm/device_map.go)."""
    if replicas <= 1:
        return resource, (uuid,)
    return (f"{resource}.shared" if rename else resource), tuple(f"{uuid}::{k}" for k in range(replicas))


def _mig_resource(mig: MigSpec, strategy: str) -> str:
    return "nvidia.com/gpu" if strategy == "single" else f"nvidia.com/mig-{mig.profile}"
