"""The pod directory: pod UID to name, namespace and containers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class StatedGrant:
    """A GPU that an allocator wrote into a pod's annotations (HAMi), with
    the memory and compute it gave the container there."""

    gpu_uuid: str
    memory: int
    """Bytes."""
    compute: float
    """Fraction of the GPU's SMs, 0-1; 1 where the allocator set no limit."""


@dataclass(frozen=True, slots=True)
class KaiMarks:
    """What KAI Scheduler's binder and its reservation pods write on a pod (allocation/kai.py reads
    them), as the pod carries them: labels and annotations its author can write as well, so that
    none of them gives a GPU alone."""

    groups: frozenset[str] = frozenset()
    """The GPU groups its labels name: runai-gpu-group's value, and each runai-gpu-group/<group>'s."""
    requested: bool = False
    """It carries a gpu-fraction or gpu-memory annotation: what its author asked KAI for."""
    reserved_gpu: str | None = None
    """run.ai/reserve_for_gpu_index: the UUID a reservation pod's own process writes there."""
    app: str = ""
    """Its `app` label."""
    service_account: str = ""
    container: str = ""
    """The container KAI gives a fraction to: gpu-fraction-container-name's, else the first."""


@dataclass(frozen=True, slots=True)
class PodMeta:
    namespace: str
    name: str
    containers: Mapping[str, str] = field(default_factory=dict)
    """Container ID (without the runtime's `containerd://` scheme) to container name."""
    gpu_limits: Mapping[str, float] = field(default_factory=dict)
    """Container name to the GPUs its resource limits ask for (counted resources only)."""
    phase: str = "Running"
    """The pod's status.phase."""
    stated: Mapping[str, tuple[StatedGrant, ...]] = field(default_factory=dict)
    """Container name to the GPUs an allocator's annotations give it (HAMi)."""
    uid: str = ""
    """The pod's UID in the API (for a static pod, its mirror pod's); empty when not known."""
    unreadable: bool = False
    """An allocator annotation of the pod could not be read: what it was given is not known."""
    kai: KaiMarks | None = None
    """KAI Scheduler's labels and annotations on it; None where it carries none."""

    @property
    def terminal(self) -> bool:
        """Succeeded or Failed: its containers have ended and hold no GPU."""
        return self.phase in TERMINAL_PHASES


class PodDirectory(Protocol):
    def lookup(self, pod_uid: str) -> PodMeta | None:
        """The pod whose cgroups carry `pod_uid` (a static pod's config hash
        included), or None when it is not known (yet)."""
        ...

    def pods(self) -> Mapping[str, PodMeta]:
        """Every known pod, keyed as its cgroups name it."""
        ...

    def knows_every_pod(self) -> bool:
        """Whether a pod it does not know is no pod of this node's (yet): the Kubernetes API
        is on and has listed the node's pods. Such a pod then holds no share (collect/trust.py)."""
        ...


class StaticDirectory:
    """A fixed directory (the simulated node's, which stands for the Kubernetes API)."""

    def __init__(self, pods: Mapping[str, PodMeta]) -> None:
        self._pods = dict(pods)

    def lookup(self, pod_uid: str) -> PodMeta | None:
        return self._pods.get(pod_uid)

    def pods(self) -> Mapping[str, PodMeta]:
        return self._pods

    def knows_every_pod(self) -> bool:
        return True


class UnresolvedDirectory:
    """Resolves nothing: pods keep their UID in `pod` and an empty `namespace`."""

    def lookup(self, pod_uid: str) -> PodMeta | None:
        return None

    def pods(self) -> Mapping[str, PodMeta]:
        return {}

    def knows_every_pod(self) -> bool:
        return False
