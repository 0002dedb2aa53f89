"""KAI Scheduler's GPU fractions (Run:ai's scheduler), from what its scheduler and binder write.

KAI shares a GPU by reserving it (kai-scheduler/KAI-Scheduler; docs/kubernetes.md cites each rule):

- its scheduler writes one BindRequest (scheduling.run.ai/v1alpha2) per pod it places, named as
  the pod, in its namespace, owned by it (ownerReferences: the Pod's UID) and labelled
  `selected-node=<node>` (pkg/scheduler/cache/cache.go, createBindRequest): spec.selectedNode,
  spec.receivedResourceType (`Fraction` for a share of a GPU: pkg/binder/common/constants.go),
  spec.receivedGPU {count, portion} and spec.selectedGPUGroups
  (pkg/apis/scheduling/v1alpha2/bindrequest_types.go). The portion is of each GPU's memory, to
  two decimals: a `gpu-memory` request in MiB is turned into it against the node's GPU memory
  (pkg/scheduler/api/node_info/node_info.go, getResourceGpuPortion), and KAI's own memory limit
  is that portion times the GPU's memory (pkg/binder/plugins/hamicore/hami_core.go). Its binder
  sets status.phase `Succeeded` once it has bound the pod, through the status subresource
  (pkg/binder/controllers/bindrequest_controller.go, UpdateStatus);
- for each GPU group its binder runs one reservation pod in the reservation namespace, labelled
  `app=<app label>` and `runai-gpu-group=<group>`, under the reservation service account, on the
  node, asking the device plugin for `nvidia.com/gpu: 1`
  (pkg/binder/binding/resourcereservation/resource_reservation.go, createResourceReservationPod);
  its own process writes the UUID of the one GPU NVML shows it into `run.ai/reserve_for_gpu_index`
  (pkg/resourcereservation/discovery/discovery.go, patcher/pod_patcher.go), and the binder gives
  that GPU to the group's fraction pods (pkg/binder/plugins/gpusharing/gpu_sharing.go);
- the binder labels a fraction pod `runai-gpu-group=<group>` (`runai-gpu-group/<group>` for each
  group of a pod with fractions of several GPUs: updatePodGPUGroup).

Labels and annotations are the pod author's to write too. So a fraction is taken from the
BindRequest alone, owned by the pod's UID and Succeeded for this node; its GPU, from the
reservation pod of its group, which must be KAI's (namespace, labels, service account) and hold
the GPU its annotation names, as the kubelet says. KAI sets no compute limit (a GPU's sharers get
equal time slices whatever their fractions): a fraction is memory, and no compute share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from otel_vgpu.agent_health import Refusal
from otel_vgpu.allocation.devices import DeviceMap, Target
from otel_vgpu.config import KAI_RESERVATION
from otel_vgpu.gpu.backend import Device
from otel_vgpu.pods.directory import KaiMarks, PodMeta

# pkg/common/constants/constants.go
GPU_GROUP = "runai-gpu-group"
FRACTION = "gpu-fraction"
MEMORY = "gpu-memory"
FRACTION_CONTAINER = "gpu-fraction-container-name"
APP_LABEL = "app"
# pkg/binder/binding/resourcereservation/resource_reservation.go (its pods' names changed across
# versions, runai-reservation-gpu-<node>-<random> to gpu-reservation-<hash>: no rule reads them)
RESERVED_GPU = "run.ai/reserve_for_gpu_index"
# pkg/apis/scheduling/v1alpha2: the API and the phase of a bound pod; pkg/binder/common: a fraction.
API_GROUP, API_VERSION, KIND, PLURAL = "scheduling.run.ai", "v1alpha2", "BindRequest", "bindrequests"
NODE_LABEL = "selected-node"
SUCCEEDED = "Succeeded"
SHARED = "Fraction"

Refused = tuple[Refusal, str, str]
"""(reason, what was refused: the key it is counted once by, why)."""


@dataclass(frozen=True, slots=True)
class KaiSettings:
    """Where KAI's binder runs its reservation pods, and under what: its chart's
    global.resourceReservation values (--kai-reservation)."""

    namespace: str = KAI_RESERVATION
    service_account: str = KAI_RESERVATION
    app_label: str = KAI_RESERVATION


@dataclass(frozen=True, slots=True)
class BindRequest:
    """One BindRequest, as KAI's scheduler and binder wrote it."""

    namespace: str
    name: str
    owners: tuple[str, ...]
    """The UIDs of the pods among its owners."""
    node: str
    """spec.selectedNode."""
    resource_type: str = ""
    portion: float | None = None
    """spec.receivedGPU.portion of each GPU; None where it is no number."""
    groups: tuple[str, ...] = ()
    phase: str = ""


@dataclass(frozen=True, slots=True)
class KaiView:
    """What the agent knows of KAI on this node: the BindRequests listed for it."""

    node: str
    bind_requests: tuple[BindRequest, ...]
    settings: KaiSettings = KaiSettings()
    listed: bool = True
    """False until the BindRequests have been listed (or while they cannot be): KAI's reservation
    pods hold their GPUs all the same, and no fraction is known, nor refused."""


@dataclass(frozen=True, slots=True)
class KaiGrant:
    """A fraction a pod's container was given of a device."""

    uid: str
    container: str
    device: str
    portion: float
    memory: int
    """Bytes: the portion of the device's memory."""


@dataclass(frozen=True, slots=True)
class KaiAllocation:
    grants: tuple[KaiGrant, ...] = ()
    holders: frozenset[str] = frozenset()
    """The reservation pods (cgroup UIDs) that hold their fraction pods' GPUs: no share of their own."""
    bound: frozenset[str] = frozenset()
    """The pods KAI's BindRequests gave fractions: what they were given is known."""
    refused: tuple[Refused, ...] = field(default=())


def kai_marks(
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    service_account: str,
    init_containers: Sequence[str],
    containers: Sequence[str],
) -> KaiMarks | None:
    """KAI's labels and annotations on a pod; None where it carries none. The fraction goes to
    the container gpu-fraction-container-name names, an init container or another, else to the
    first (pkg/binder/common/gpu_access.go, GetFractionContainerRef)."""
    groups = frozenset(
        value for key, value in labels.items() if key == GPU_GROUP or key.startswith(f"{GPU_GROUP}/") if value
    )
    requested = FRACTION in annotations or MEMORY in annotations
    reserved = annotations.get(RESERVED_GPU)
    if not groups and not requested and reserved is None:
        return None
    named = annotations.get(FRACTION_CONTAINER, "")
    container = named if named and named in (*init_containers, *containers) else next(iter(containers), "")
    return KaiMarks(
        groups=groups,
        requested=requested,
        reserved_gpu=reserved,
        app=labels.get(APP_LABEL, ""),
        service_account=service_account,
        container=container,
    )


def parse_portion(text: object) -> float | None:
    """spec.receivedGPU.portion, a decimal number in a string; None where it is no fraction of a GPU."""
    try:
        value = float(str(text))
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 < value <= 1 else None


def from_kai(
    view: KaiView,
    pods: Mapping[str, PodMeta],
    gpus: Sequence[Device],
    assigned: Mapping[str, frozenset[str]] | None,
) -> KaiAllocation:
    """The fractions KAI gave this node's pods. `pods`: the directory, by cgroup UID; `assigned`:
    the devices (UUIDs) the kubelet gave each pod, by the same UID, or None where the kubelet was
    not asked (a reservation pod's own word then stands for its GPU)."""
    refused: list[Refused] = []
    devices = DeviceMap(gpus)
    live = {uid: meta for uid, meta in pods.items() if not meta.terminal and meta.kai is not None}
    reserved, holders = _reservations(view.settings, live, devices, assigned, refused)
    requests: dict[tuple[str, str], BindRequest] = {}
    for request in view.bind_requests:
        for owner in request.owners:
            requests[(request.namespace, owner)] = request
    grants: list[KaiGrant] = []
    bound = set()
    for uid, meta in live.items() if view.listed else ():
        marks = meta.kai
        assert marks is not None
        if uid in holders or meta.namespace == view.settings.namespace or marks.reserved_gpu is not None:
            continue  # a reservation pod, KAI's or refused as one: no fraction pod
        mine = _fractions(view, uid, meta, marks, requests.get((meta.namespace, meta.uid or uid)), reserved, refused)
        if mine:
            grants += mine
            bound.add(uid)
    return KaiAllocation(tuple(_at_most_whole(grants, refused)), frozenset(holders), frozenset(bound), tuple(refused))


def _reservations(
    settings: KaiSettings,
    pods: Mapping[str, PodMeta],
    devices: DeviceMap,
    assigned: Mapping[str, frozenset[str]] | None,
    refused: list[Refused],
) -> tuple[dict[str, Target], set[str]]:
    """Each GPU group's device, from the reservation pods that are KAI's; and those pods."""
    claims: dict[str, list[tuple[str, Target]]] = {}
    holders: set[str] = set()
    for uid, meta in pods.items():
        marks = meta.kai
        assert marks is not None
        inside = meta.namespace == settings.namespace
        if not inside and marks.reserved_gpu is None:
            continue  # a fraction pod, or one that claims to be
        problem, target = _reservation_problem(settings, uid, meta, marks, devices, assigned)
        if problem is not None:
            why = f"pod {meta.namespace}/{meta.name} is taken for no reservation pod of KAI's: {problem}"
            refused.append((Refusal.KAI_RESERVATION, uid, why))
        elif target is None:
            holders.add(uid)  # KAI's, its GPU not named yet: it holds one, for fractions to come
        else:
            (group,) = marks.groups
            claims.setdefault(group, []).append((uid, target))
    reserved: dict[str, Target] = {}
    for group, found in claims.items():
        if len({target.uuid for _, target in found}) > 1:
            names = ", ".join(sorted(f"{pods[uid].namespace}/{pods[uid].name}" for uid, _ in found))
            for uid, _ in found:
                why = f"pods {names} reserve GPU group {group} on other GPUs: which its fractions run on is unknown"
                refused.append((Refusal.KAI_RESERVATION, f"{uid}:{group}", why))
            continue
        reserved[group] = found[0][1]
        holders |= {uid for uid, _ in found}
    return reserved, holders


def _reservation_problem(
    settings: KaiSettings,
    uid: str,
    meta: PodMeta,
    marks: KaiMarks,
    devices: DeviceMap,
    assigned: Mapping[str, frozenset[str]] | None,
) -> tuple[str | None, Target | None]:
    """Why a pod is not a reservation pod of KAI's, or the device it holds (None: not yet named)."""
    if meta.namespace != settings.namespace:
        return f"it carries {RESERVED_GPU} outside KAI's reservation namespace {settings.namespace}", None
    if marks.app != settings.app_label or marks.service_account != settings.service_account:
        return (
            f"KAI's reservation pods carry the label {APP_LABEL}={settings.app_label} and run as service account "
            f"{settings.service_account}; it has {APP_LABEL}={marks.app!r} and {marks.service_account!r}"
        ), None
    if len(marks.groups) != 1:
        return f"KAI's are labelled with one {GPU_GROUP}; it has {len(marks.groups)}", None
    if marks.reserved_gpu is None:
        return None, None  # its process has not written its GPU yet; no fraction runs on it before
    target = devices.device(marks.reserved_gpu)
    if target is None:
        return f"{RESERVED_GPU} names {marks.reserved_gpu}, which is no GPU of this node", None
    if assigned is not None and target.uuid not in assigned.get(uid, frozenset()):
        given = ", ".join(sorted(assigned.get(uid, frozenset()))) or "none"
        return f"{RESERVED_GPU} names {marks.reserved_gpu}, where the kubelet gave it {given}", None
    return None, target


def _fractions(
    view: KaiView,
    uid: str,
    meta: PodMeta,
    marks: KaiMarks,
    request: BindRequest | None,
    reserved: Mapping[str, Target],
    refused: list[Refused],
) -> list[KaiGrant]:
    """What a pod's BindRequest gives it; what its own marks claim beyond that is refused."""
    where = f"pod {meta.namespace}/{meta.name}"
    if request is not None and request.phase != SUCCEEDED:
        return []  # not bound yet: nothing is known of it, nor refused
    claimed = marks.requested or marks.groups
    if request is None or request.resource_type != SHARED:
        if claimed:
            what = "no BindRequest of KAI's" if request is None else "its BindRequest (no Fraction)"
            why = f"{where} carries KAI's {FRACTION}, {MEMORY} or {GPU_GROUP}, and {what} gives it a fraction"
            refused.append((Refusal.KAI_FRACTION, uid, f"{why}: no share from them"))
        return []
    if request.node != view.node:
        why = f"{where}: its BindRequest binds it to node {request.node!r}, not {view.node!r}: no share"
        refused.append((Refusal.KAI_FRACTION, uid, why))
        return []
    if request.portion is None or not request.groups:
        why = f"{where}: its BindRequest {request.name} has no portion of a GPU (0-1) or no GPU group: no share"
        refused.append((Refusal.KAI_FRACTION, uid, why))
        return []
    foreign = marks.groups - set(request.groups)
    if foreign:
        why = f"{where}: label {GPU_GROUP} names group {min(foreign)}, which its BindRequest does not select; ignored"
        refused.append((Refusal.KAI_FRACTION, f"{uid}:{min(foreign)}", why))
    grants = []
    for group in request.groups:
        target = reserved.get(group)
        if target is None:
            why = (
                f"{where}: GPU group {group} of its BindRequest has no reservation pod of KAI's on this node: no share"
            )
            refused.append((Refusal.KAI_FRACTION, f"{uid}:{group}", why))
            continue
        memory = int(request.portion * target.memory_total)
        grants.append(KaiGrant(uid, marks.container, target.uuid, request.portion, memory))
    return grants


def _at_most_whole(grants: list[KaiGrant], refused: list[Refused]) -> list[KaiGrant]:
    """The grants with each device's fractions scaled down where they add up to more than 1 (KAI's
    scheduler places no more: only what it did not write could)."""
    totals: dict[str, float] = {}
    for grant in grants:
        totals[grant.device] = totals.get(grant.device, 0.0) + grant.portion
    kept = []
    for grant in grants:
        total = totals[grant.device]
        if total <= 1.0 + 1e-9:
            kept.append(grant)
            continue
        uids = ",".join(sorted({g.uid for g in grants if g.device == grant.device}))
        why = f"KAI fractions on {grant.device} add up to {total:.2f}: each scaled down by {total:.2f}"
        refusal = (Refusal.KAI_OVERCOMMIT, f"{grant.device}:{uids}", why)
        if refusal not in refused:
            refused.append(refusal)
        scaled = grant.portion / total
        kept.append(KaiGrant(grant.uid, grant.container, grant.device, scaled, int(grant.memory / total)))
    return kept
