"""vGPU shares: how many of a GPU's vGPUs each pod (container) was given.

The kubelet's pod-resources API names the devices each container holds; the
NVIDIA device plugin names a time-sliced or MPS replica `GPU-<uuid>::<n>`, a
whole GPU `GPU-<uuid>`, a MIG device `MIG-<uuid>`, and GKE names them
`nvidia<index>/vgpu<n>`. Each device ID that names a GPU is one share of it.
Without pod-resources, the GPU counts in the pods' resource limits are known
but not which GPU they are on: those shares are "unplaced" and spread over
the GPUs the pod runs processes on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from otel_vgpu.config import DEFAULT_RESOURCES
from otel_vgpu.gpu.backend import Device
from otel_vgpu.pods.directory import PodMeta

_GKE = re.compile(r"^nvidia(?P<index>\d+)(?:/.*)?$")


@dataclass(frozen=True, slots=True)
class Allocation:
    placed: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    """(pod UID, container name or "", GPU UUID) -> shares on that GPU."""
    unplaced: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(pod UID, container name or "") -> shares on GPUs not known."""


class AllocationSource(Protocol):
    def allocation(self, gpus: Sequence[Device]) -> Allocation:
        """Known allocations on these GPUs. A pod missing here counts one
        share on each GPU it runs processes on."""
        ...


class UnknownAllocation:
    """No allocation source: every pod counts one share where it runs."""

    def allocation(self, gpus: Sequence[Device]) -> Allocation:
        return Allocation()


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    """One container's devices of one resource, as the kubelet reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def gpu_of_device(device_id: str, gpus: Sequence[Device], mig_parents: Mapping[str, str]) -> str | None:
    """The UUID of the physical GPU a device plugin's device ID names, if any."""
    base = device_id.split("::", 1)[0].strip()
    if base.startswith("GPU-"):
        return base if any(gpu.uuid == base for gpu in gpus) else None
    if base.startswith("MIG-"):
        return mig_parents.get(base)
    match = _GKE.match(base)
    index = int(match.group("index")) if match else (int(base) if base.isdigit() else None)
    for gpu in gpus:
        if gpu.index == index:
            return gpu.uuid
    return None


def from_pod_resources(
    assignments: Iterable[DeviceAssignment],
    uid_of: Mapping[tuple[str, str], str],
    gpus: Sequence[Device],
    mig_parents: Mapping[str, str] | None = None,
    resources: Iterable[str] = DEFAULT_RESOURCES,
) -> Allocation:
    """Shares per (pod, container, GPU) from the kubelet's device assignments.

    `uid_of` maps (namespace, name) to the pod's cgroup UID: pod-resources
    names pods, cgroups carry UIDs. A pod the directory does not know yet is
    left out until it does.
    """
    wanted = set(resources)
    placed: dict[tuple[str, str, str], float] = {}
    for assignment in assignments:
        if assignment.resource not in wanted:
            continue
        uid = uid_of.get((assignment.namespace, assignment.pod))
        if uid is None:
            continue
        for device_id in assignment.device_ids:
            gpu = gpu_of_device(device_id, gpus, mig_parents or {})
            if gpu is not None:
                key = (uid, assignment.container, gpu)
                placed[key] = placed.get(key, 0.0) + 1.0
    return Allocation(placed=placed)


def from_limits(pods: Mapping[str, PodMeta]) -> Allocation:
    """Shares from the GPU counts in the pods' resource limits; GPUs unknown."""
    unplaced = {
        (uid, container): count
        for uid, meta in pods.items()
        for container, count in meta.gpu_limits.items()
        if count > 0
    }
    return Allocation(unplaced=unplaced)
