"""Which pod, and which container, a process belongs to, from its cgroup.

`parse_cgroup` reads the text of `/proc/<pid>/cgroup`. The kubelet names a
pod's cgroup after the pod UID, whatever the driver:

- cgroupfs: `.../kubepods/<qos>/pod<uid>/<container-id>`
- systemd:  `.../kubepods-<qos>-pod<uid_with_underscores>.slice/<runtime>-<id>.scope`
  (kind prefixes every slice with `kubelet-`; clusters from before
  Kubernetes 1.6 used `BestEffort-pod<uid>.slice`; containerd's v1 systemd
  layout writes `<pod-slice>:cri-containerd:<id>` in one component)

so the rules are about path components, not whole-path templates, and they
follow who can write each component (docs/trust.md):

- the pod is the *outermost* component that names a pod UID. Everything above
  it is the node's (its kubepods root and QoS level, a kind or minikube node
  container, an ECS task, a relative cgroup-namespace prefix); everything below
  the container's own cgroup may be the tenant's, since a pod running systemd,
  rootless podman or Docker-in-Docker is delegated its subtree and names what
  it creates there as it likes, another pod's UID included;
- the container is the component directly below the pod (or the one its
  component names inline): what the runtime created. Whatever a container nests
  below itself stays that container's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# A pod UID in a path: dashed (cgroupfs) or underscored (systemd) 8-4-4-4-12,
# or the 32-hex config hash of a static pod.
_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
_HASH = r"[0-9a-fA-F]{32}"
# `pod<uid>` as a whole component, or `<prefix>-pod<uid>.slice`, optionally
# followed by containerd's `:cri-containerd:<id>` suffix.
_POD_COMPONENT = re.compile(rf"^(?:.*-)?pod(?P<uid>{_UID}|{_HASH})(?:\.slice)?(?::(?P<rest>.*))?$")
# A container component: a bare 64-hex ID or `<runtime>-<id>[.scope]`
# (docker-, cri-containerd-, crio-, libpod-, ...).
_CONTAINER_COMPONENT = re.compile(r"^(?:[A-Za-z][\w.-]*?[-:])?(?P<id>[0-9a-f]{64})(?:\.scope)?$")
# `N:controllers:path` (the path itself may contain colons).
_PROC_LINE = re.compile(r"^\d+:[^:]*:(?P<path>.*)$")


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod (and container) a process runs in."""

    pod_uid: str
    """Dashed lowercase UID; for a static pod, its 32-hex config hash."""
    container_id: str | None
    """Full ID of the container the runtime made directly below the pod, if the path names one."""
    names_another_pod: bool = field(default=False, compare=False)
    """A cgroup below the container is named like a pod: the container's own doing, which
    does not change whose process it is (counted as a refusal, docs/trust.md)."""


def parse_cgroup(text: str) -> PodRef | None:
    """The pod a process belongs to, from the text of its `/proc/<pid>/cgroup`.

    Accepts cgroup v1, v2 and hybrid files, single lines, and bare cgroup
    paths. Returns None for a process in no pod. When lines disagree in
    detail (v1 controllers mounted at different depths), the first line that
    names both a pod and a container wins, else the first that names a pod.
    """
    pod_only: PodRef | None = None
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line:
            continue
        match = _PROC_LINE.match(line)
        ref = parse_cgroup_path(match.group("path") if match else line)
        if ref is None:
            continue
        if ref.container_id is not None:
            return ref
        if pod_only is None:
            pod_only = ref
    return pod_only


def parse_cgroup_path(path: str) -> PodRef | None:
    """The pod a single cgroup path belongs to, or None."""
    components = [c for c in path.split("/") if c]
    for index, component in enumerate(components):
        match = _POD_COMPONENT.match(component)
        if match is None:
            continue
        # The outermost pod component is the kubelet's: a pod can create cgroups only
        # inside its own container's, below it (docs/trust.md).
        inline = match.group("rest")
        below = inline if inline else (components[index + 1] if index + 1 < len(components) else None)
        nested = components[index + 1 :] if inline else components[index + 2 :]
        return PodRef(
            pod_uid=_normalise_uid(match.group("uid")),
            container_id=_container(below),
            names_another_pod=any(_POD_COMPONENT.match(c) for c in nested),
        )
    return None


def _container(component: str | None) -> str | None:
    """The container a pod's child component names; None for a conmon scope, or none."""
    # cri-o's monitor process lives in `crio-conmon-<id>.scope`: it is
    # not the container, and its cgroup holds no workload.
    if component is None or "conmon" in component:
        return None
    match = _CONTAINER_COMPONENT.match(component)
    return None if match is None else match.group("id")


def _normalise_uid(raw: str) -> str:
    raw = raw.lower()
    if len(raw) == 32:
        return raw
    return raw.replace("_", "-")
