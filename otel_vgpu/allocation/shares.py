"""What each container was given on each GPU or MIG device.

Three sources, each read as its allocator writes it (docs/kubernetes.md has
the table of setups and the upstream source of each rule):

- the kubelet's pod-resources API: device-plugin IDs per container (one
  share per ID: a time-slicing or MPS replica, a whole GPU, a MIG device)
  and DRA claims (the devices of a claim shared by the containers that use
  it);
- allocator annotations on the pod (HAMi): memory and compute per GPU, only where
  they agree with what the kubelet's device plugin gave each container (a pod's author
  can write the annotation too: docs/trust.md);
- KAI Scheduler's BindRequests (allocation/kai.py): a fraction of the GPU its group's
  reservation pod holds, which then holds no share of its own;
- without the kubelet, the GPU counts in the pods' resource limits: the
  count is known, not the GPU ("unplaced").

Pods in a terminal phase hold nothing: kubelets before 1.34 still list them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Protocol

from otel_vgpu.agent_health import Refusal
from otel_vgpu.allocation.devices import DeviceMap
from otel_vgpu.allocation.hami import ANNOTATION as HAMI_ANNOTATION
from otel_vgpu.allocation.hami import hami_device_id
from otel_vgpu.allocation.kai import KaiView, Refused, from_kai
from otel_vgpu.config import DEFAULT_RESOURCES, DRA_DRIVERS
from otel_vgpu.gpu.backend import Device
from otel_vgpu.pods.directory import PodMeta


@dataclass(frozen=True, slots=True)
class Grant:
    """What one container was given on one device."""

    shares: float = 0.0
    """Replicas (device IDs) of the device; a fraction for a shared DRA claim or a KAI fraction."""
    memory: int | None = None
    """Bytes, where the allocator says (HAMi, DRA, KAI); None: shares x memory / ratio."""
    compute: float | None = None
    """Fraction of the device's SMs, where the allocator says (0: none, as KAI gives); None: shares / ratio."""

    def plus(self, other: Grant) -> Grant:
        def add(a: float | None, b: float | None) -> float | None:
            return None if a is None and b is None else (a or 0) + (b or 0)

        memory = add(self.memory, other.memory)
        return Grant(
            self.shares + other.shares,
            None if memory is None else int(memory),
            add(self.compute, other.compute),
        )


Key = tuple[str, str, str]
"""(pod UID, container name, device UUID: a GPU's or a MIG device's)."""


@dataclass(frozen=True, slots=True)
class Allocation:
    placed: Mapping[Key, Grant] = field(default_factory=dict)
    unplaced: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(pod UID, container name) -> shares on GPUs not known."""
    replicas: Mapping[str, int] | None = None
    """Device UUID -> replicas the device plugins advertise (GetAllocatableResources);
    None when the kubelet has not said."""
    answered: frozenset[str] = frozenset()
    """UIDs of the pods whose every grant is known: what is not in `placed`
    for them, they were not given. A pod the kubelet lists without a GPU
    device holds no share; a pod missing here counts one where it runs."""
    refused: tuple[Refused, ...] = ()
    """(reason, key, why) of what allocators' marks on pods claim and is refused (`from_annotations`, KAI)."""


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


@dataclass(frozen=True, slots=True)
class ClaimAssignment:
    """One DRA device of a claim a container uses, as the kubelet reports it."""

    namespace: str
    pod: str
    container: str
    claim: str
    """`<namespace>/<name>` of the ResourceClaim."""
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class KubeletView:
    """One answer of the kubelet's pod-resources API."""

    devices: tuple[DeviceAssignment, ...] = ()
    claims: tuple[ClaimAssignment, ...] = ()
    allocatable: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    """(resource, device IDs) the device plugins advertise; None where the
    kubelet does not serve GetAllocatableResources."""
    pods: tuple[tuple[str, str], ...] | None = None
    """(namespace, name) of every pod listed, devices or not (List answers for
    every pod on the node); None where not known."""


def counted(resource: str, patterns: Iterable[str] = DEFAULT_RESOURCES) -> bool:
    """Whether a resource's devices count as GPUs: an exact name, or a
    pattern ending in `*` (`nvidia.com/mig-*`)."""
    return any(fnmatchcase(resource, pattern) for pattern in patterns)


def _add(placed: dict[Key, Grant], key: Key, grant: Grant) -> None:
    previous = placed.get(key)
    placed[key] = grant if previous is None else previous.plus(grant)


def from_annotations(
    pods: Mapping[str, PodMeta],
    gpus: Sequence[Device],
    placed: dict[Key, Grant],
    served: Mapping[tuple[str, str], float],
) -> tuple[set[str], list[Refused]]:
    """Add the grants allocator annotations state (HAMi) where they hold; the UIDs of the pods
    counted from them, and (UID, why) of those refused. `served`: the devices the kubelet's
    device plugin gave each (pod UID, container), or what its limits ask where the kubelet
    is not asked."""
    known = {gpu.uuid: gpu for gpu in gpus}
    stated = set()
    refused: list[Refused] = []
    for uid, meta in pods.items():
        if meta.terminal or not meta.stated:
            continue
        problem = _stated_problem(uid, meta, known, served)
        if problem is not None:
            why = f"pod {meta.namespace}/{meta.name}: annotation {HAMI_ANNOTATION} {problem}"
            refused.append((Refusal.HAMI_ANNOTATION, uid, f"{why}; ignored, the pod's shares are the kubelet's"))
            continue
        stated.add(uid)
        for container, grants in meta.stated.items():
            for grant in grants:
                _add(placed, (uid, container, grant.gpu_uuid), Grant(1.0, grant.memory, grant.compute))
    return stated, refused


def _stated_problem(
    uid: str, meta: PodMeta, known: Mapping[str, Device], served: Mapping[tuple[str, str], float]
) -> str | None:
    """Why a pod's stated grants cannot be what its allocator gave it, or None. HAMi's device
    plugin checks that a container's entry lists as many GPUs as the kubelet allocated it
    (pkg/device-plugin/nvidiadevice, Allocate); its scheduler names GPUs of the pod's node,
    each once a container outside MIG, with no more memory than the GPU has."""
    for container, grants in meta.stated.items():
        named = [grant.gpu_uuid for grant in grants]
        for uuid in named:
            if uuid not in known:
                return f"names {uuid}, which is no GPU of this node"
        repeated = {uuid for uuid in named if named.count(uuid) > 1 and not known[uuid].mig_mode}
        if repeated:
            return f"gives container {container!r} GPU {min(repeated)} twice"
        given = served.get((uid, container), 0)
        if given != len(named):
            return (
                f"gives container {container!r} {len(named)} GPU(s) where HAMi's device plugin gave it {given:g} "
                "(the kubelet's device IDs GPU-<uuid>-<n>)"
            )
        for grant in grants:
            if grant.memory > known[grant.gpu_uuid].memory_total:
                return f"gives container {container!r} more memory on {grant.gpu_uuid} than the GPU has"
    return None


def from_kubelet(
    view: KubeletView,
    pods: Mapping[str, PodMeta],
    gpus: Sequence[Device],
    resources: Iterable[str] = DEFAULT_RESOURCES,
    dra_drivers: Iterable[str] = DRA_DRIVERS,
    kai: KaiView | None = None,
) -> Allocation:
    """Grants per (pod, container, device) from one kubelet answer.

    Pod-resources names pods, cgroups carry UIDs: `pods` (the directory,
    keyed by cgroup UID) maps one to the other. A pod the directory does not
    know yet is left out until it does; a pod in a terminal phase is left
    out for good. A pod with allocator annotations is counted from them
    alone: HAMi decides its GPU there, not in the kubelet's IDs. With `kai`,
    KAI's fractions are added, and its reservation pods hold no share.
    """
    patterns = tuple(resources)
    drivers = frozenset(dra_drivers)
    devices = DeviceMap(gpus)
    live = {(meta.namespace, meta.name): uid for uid, meta in pods.items() if not meta.terminal}
    # The devices HAMi's device plugin gave each container: its annotation must agree with them.
    served: dict[tuple[str, str], float] = {}
    for assignment in view.devices:
        uid = live.get((assignment.namespace, assignment.pod))
        if uid is not None and counted(assignment.resource, patterns):
            key = (uid, assignment.container)
            served[key] = served.get(key, 0) + sum(1 for d in assignment.device_ids if hami_device_id(d))
    placed: dict[Key, Grant] = {}
    stated, refused = from_annotations(pods, gpus, placed, served)
    assigned: dict[str, set[str]] = {}
    for assignment in view.devices:
        uid = live.get((assignment.namespace, assignment.pod))
        if uid is None or uid in stated or not counted(assignment.resource, patterns):
            continue
        for device_id in assignment.device_ids:
            target = devices.device(device_id)
            if target is not None:
                _add(placed, (uid, assignment.container, target.uuid), Grant(shares=1.0))
                assigned.setdefault(uid, set()).add(target.uuid)

    # A DRA device goes to one claim; the containers that use the claim share it evenly.
    users: dict[tuple[str, str, str], set[tuple[str, str]]] = {}
    for claim in view.claims:
        uid = live.get((claim.namespace, claim.pod))
        if uid is not None and claim.driver in drivers:
            users.setdefault((claim.driver, claim.pool, claim.device), set()).add((uid, claim.container))
    for (_driver, _pool, name), sharing in users.items():
        target = devices.dra(name)
        if target is None:
            continue
        fraction = 1.0 / len(sharing)
        for uid, container in sharing:
            grant = Grant(fraction, int(target.memory_total * fraction), fraction)
            _add(placed, (uid, container, target.uuid), grant)

    replicas: dict[str, int] | None = None
    if view.allocatable is not None:
        replicas = {}
        for resource, ids in view.allocatable:
            if counted(resource, patterns):
                for uuid, count in devices.replicas(ids).items():
                    replicas[uuid] = replicas.get(uuid, 0) + count
    # The kubelet lists every pod of the node: one it lists without a device
    # here was given none. A pod the directory cannot name stays unknown.
    # An unreadable annotation leaves the pod's allocation unknown, listed or not.
    listed = {uid for key in view.pods or () if (uid := live.get(key)) is not None and not pods[uid].unreadable}
    given = {uid: frozenset(uuids) for uid, uuids in assigned.items()}
    kai_decided = _with_kai(kai, pods, gpus, given, placed, refused)
    answered = frozenset(listed | stated | kai_decided)
    return Allocation(placed=placed, replicas=replicas, answered=answered, refused=tuple(refused))


def _with_kai(
    kai: KaiView | None,
    pods: Mapping[str, PodMeta],
    gpus: Sequence[Device],
    assigned: Mapping[str, frozenset[str]] | None,
    placed: dict[Key, Grant],
    refused: list[Refused],
) -> frozenset[str]:
    """KAI's fractions added to `placed`, and its reservation pods' own grants taken out of it:
    each is the holder of its fraction pods' GPU, not an allocation of its own. The UIDs of the
    pods whose allocation KAI decided."""
    if kai is None:
        return frozenset()
    found = from_kai(kai, pods, gpus, assigned)
    for key in [key for key in placed if key[0] in found.holders]:
        del placed[key]
    for grant in found.grants:
        # A fraction of the memory; no compute share: KAI sets no compute limit.
        _add(placed, (grant.uid, grant.container, grant.device), Grant(grant.portion, grant.memory, 0.0))
    refused.extend(found.refused)
    return found.bound | found.holders


def from_limits(pods: Mapping[str, PodMeta], gpus: Sequence[Device] = (), kai: KaiView | None = None) -> Allocation:
    """Without the kubelet: annotation grants where a pod has them, KAI's fractions (a reservation
    pod's own word for its GPU, which the kubelet cannot confirm), else the GPU counts in the pods'
    resource limits, GPUs unknown."""
    placed: dict[Key, Grant] = {}
    limits = {(uid, container): count for uid, meta in pods.items() for container, count in meta.gpu_limits.items()}
    stated, refused = from_annotations(pods, gpus, placed, limits)
    kai_decided = _with_kai(kai, pods, gpus, None, placed, refused)
    unplaced = {
        (uid, container): count
        for uid, meta in pods.items()
        if not meta.terminal and uid not in stated and uid not in kai_decided
        for container, count in meta.gpu_limits.items()
        if count > 0
    }
    answered = frozenset(stated | kai_decided)
    return Allocation(placed=placed, unplaced=unplaced, answered=answered, refused=tuple(refused))
