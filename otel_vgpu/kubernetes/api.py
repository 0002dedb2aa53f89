"""The pod directory from the Kubernetes API: this node's pods, listed then watched.

Only pods bound to this node are asked for (`fieldSelector=spec.nodeName=<node>`),
so the agent's memory and the API server's work scale with one node, not the
cluster. A background thread lists, then watches from the list's
resourceVersion; after `410 Gone`, a broken watch or any error it lists again,
with exponential backoff. Sweeps read the current state and never wait for the
API. The client is lightkube (TLS verified against the service account's CA).

Pods are known by the UID their cgroups carry: their own, or, for a static pod, the
UID the kubelet gave it from its manifest, which its mirror pod carries in
`kubernetes.io/config.mirror`. Only that annotation names a static pod: the API
server refuses to add it to a pod or change it (ValidatePodSpecificAnnotationUpdates),
and the kubelet runs no pod that has it and deletes those that match no static pod
of its own; `kubernetes.io/config.hash` is anyone's to write on their pod, and is
refused (docs/trust.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_vgpu.agent_health import Reader, Refusal, Stage
from otel_vgpu.allocation.hami import ANNOTATION as HAMI_ANNOTATION
from otel_vgpu.allocation.hami import HamiAnnotationError, parse_hami
from otel_vgpu.allocation.kai import kai_marks
from otel_vgpu.allocation.shares import counted
from otel_vgpu.config import DEFAULT_RESOURCES
from otel_vgpu.files import FileProblem, read_regular
from otel_vgpu.kubernetes.list_watch import ListWatch, WatchSettings, report_failure
from otel_vgpu.pods.directory import PodMeta, StatedGrant

log = logging.getLogger(__name__)

CONFIG_HASH = "kubernetes.io/config.hash"
CONFIG_MIRROR = "kubernetes.io/config.mirror"


@dataclass(frozen=True, slots=True)
class _Entry:
    uid: str
    cgroup_uid: str
    """What the pod's cgroups carry: the UID, or a static pod's config hash."""
    meta: PodMeta
    problem: str | None = None
    """Why part of the pod could not be read (a malformed allocator annotation)."""
    refused: str | None = None
    """Why an annotation that would name its cgroups was refused (docs/trust.md)."""


def cgroup_uid(metadata: Any, node_name: str) -> tuple[str, str | None]:
    """The UID a pod's cgroups carry, and why an annotation that claims another was refused.

    A mirror pod names its static pod by `kubernetes.io/config.mirror`, the static pod's UID
    (pkg/kubelet/pod/mirror_client.go, CreateMirrorPod): the kubelet names it `<static pod>-<node>`
    (pkg/kubelet/config/common.go, generatePodName). `kubernetes.io/config.hash` on any other
    pod is its author's word, and names nothing."""
    annotations = metadata.annotations or {}
    where = f"pod {metadata.namespace}/{metadata.name}"
    mirror = annotations.get(CONFIG_MIRROR)
    if mirror:
        suffix = f"-{node_name.lower()}"
        if node_name and not str(metadata.name).endswith(suffix):
            return metadata.uid, (
                f"{where}: annotation {CONFIG_MIRROR} on a pod not named as the kubelet names this node's mirror "
                f"pods (<static pod>{suffix}); ignored"
            )
        return str(mirror), None
    if CONFIG_HASH in annotations:
        return metadata.uid, (
            f"{where}: annotation {CONFIG_HASH} on a pod that is not a mirror pod (no {CONFIG_MIRROR}); ignored, "
            "its cgroups carry its own UID"
        )
    return metadata.uid, None


def pod_entry(pod: Any, resources: Iterable[str] = DEFAULT_RESOURCES, node_name: str = "") -> _Entry:
    """A lightkube Pod (or anything shaped like one) to a directory entry."""
    metadata = pod.metadata
    annotations = metadata.annotations or {}
    spec = pod.spec
    containers: dict[str, str] = {}
    status = pod.status
    for statuses in (
        (status.containerStatuses if status else None) or [],
        (status.initContainerStatuses if status else None) or [],
        (status.ephemeralContainerStatuses if status else None) or [],
    ):
        for container in statuses:
            if container.containerID:
                # "containerd://<id>", "cri-o://<id>", "docker://<id>"
                containers[container.containerID.split("://", 1)[-1]] = container.name
    limits: dict[str, float] = {}
    wanted = tuple(resources)
    regular = (spec.containers if spec else None) or []
    for container in regular:
        declared = (container.resources.limits if container.resources else None) or {}
        count = sum(_quantity(value) for name, value in declared.items() if counted(name, wanted))
        if count:
            limits[container.name] = count
    stated: dict[str, tuple[StatedGrant, ...]] = {}
    problem = None
    init = [c.name for c in (spec.initContainers if spec else None) or []]
    hami = annotations.get(HAMI_ANNOTATION)
    if hami:
        where = f"pod {metadata.namespace}/{metadata.name}: annotation {HAMI_ANNOTATION}"
        try:
            stated = parse_hami(hami, init, [c.name for c in regular], where)
        except HamiAnnotationError as error:
            problem = str(error)
    carried, refused = cgroup_uid(metadata, node_name)
    return _Entry(
        uid=metadata.uid,
        cgroup_uid=carried,
        refused=refused,
        meta=PodMeta(
            metadata.namespace or "",
            metadata.name,
            containers=containers,
            gpu_limits=limits,
            phase=(status.phase if status else None) or "Pending",
            stated=stated,
            uid=metadata.uid,
            unreadable=problem is not None,
            kai=kai_marks(
                metadata.labels or {},
                annotations,
                (spec.serviceAccountName if spec else None) or "",
                init,
                [c.name for c in regular],
            ),
        ),
        problem=problem,
    )


def _quantity(value: Any) -> float:
    from lightkube.utils.quantity import parse_quantity  # noqa: PLC0415

    parsed = parse_quantity(str(value))
    return float(parsed) if parsed is not None else 0.0


class KubePodDirectory:
    """This node's pods from the Kubernetes API, kept current by a watch."""

    def __init__(
        self,
        settings: WatchSettings,
        resources: Iterable[str] = DEFAULT_RESOURCES,
    ) -> None:
        from lightkube.resources.core_v1 import Pod  # noqa: PLC0415

        node_name = self._node = settings.node_name
        self._resources = tuple(resources)
        self._health = settings.health
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}  # by API UID
        self._by_cgroup: dict[str, PodMeta] = {}
        self._loop = ListWatch(
            settings,
            Pod,
            what="pods",
            fields={"spec.nodeName": node_name},
            namespace="*",
            on_list=self._listed,
            on_event=self._changed,
            on_failure=self._failed,
            stage=Stage.KUBERNETES,
            reader=Reader.API_PODS,
        )

    # --- PodDirectory --------------------------------------------------------

    def lookup(self, pod_uid: str) -> PodMeta | None:
        with self._lock:
            return self._by_cgroup.get(pod_uid)

    def pods(self) -> Mapping[str, PodMeta]:
        with self._lock:
            return dict(self._by_cgroup)

    def knows_every_pod(self) -> bool:
        return self._loop.synced.is_set()

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        self._loop.start()

    def wait_synced(self, timeout: float) -> bool:
        return self._loop.synced.wait(timeout)

    def stop(self) -> None:
        self._loop.stop()

    # --- what the loop hears -------------------------------------------------------

    def _listed(self, pods: list[Any]) -> None:
        entries = {}
        for pod in pods:
            entry = self._entry(pod)
            entries[entry.uid] = entry
        with self._lock:
            self._entries = entries
            self._reindex()
        healed = f"Kubernetes API reachable again; {len(entries)} pods on node {self._node}"
        if not self._health.recovered(Stage.KUBERNETES, healed) and not self._loop.synced.is_set():
            log.info("Kubernetes API: %d pods on node %s", len(entries), self._node)

    def _changed(self, kind: str, pod: Any) -> None:
        entry = self._entry(pod)
        with self._lock:
            if kind == "DELETED":
                self._entries.pop(entry.uid, None)
            else:
                self._entries[entry.uid] = entry
            self._reindex()

    def _entry(self, pod: Any) -> _Entry:
        entry = pod_entry(pod, self._resources, self._node)
        if entry.problem is not None:
            # Counted and logged once per pod; the pod keeps its name and
            # counts as one share where it runs.
            self._health.failed(Stage.POD_ANNOTATIONS, entry.uid, f"{entry.problem}; its shares count as one")
        if entry.refused is not None:
            self._health.refused(
                Refusal.CONFIG_HASH, entry.uid, f"refused ({Refusal.CONFIG_HASH.value}): {entry.refused}", log_each=True
            )
        return entry

    def _reindex(self) -> None:
        """Rebuild the cgroup-UID index; the caller holds the lock. Every pod is known by its
        own UID; a mirror pod by its static pod's too, unless two claim one static pod (one is
        not the kubelet's, which deletes it soon): then neither, until one is gone."""
        index = {e.uid: e.meta for e in self._entries.values()}
        claims: dict[str, list[_Entry]] = {}
        for entry in self._entries.values():
            if entry.cgroup_uid != entry.uid:
                claims.setdefault(entry.cgroup_uid, []).append(entry)
        for carried, claimants in claims.items():
            if len(claimants) == 1:
                index[carried] = claimants[0].meta
                continue
            names = ", ".join(sorted(f"{e.meta.namespace}/{e.meta.name}" for e in claimants))
            for entry in claimants:
                self._health.refused(
                    Refusal.CONFIG_HASH,
                    f"{entry.uid}:{carried}",
                    f"refused ({Refusal.CONFIG_HASH.value}): pods {names} all claim to mirror static pod {carried}; "
                    "none is taken for it until one is gone",
                    log_each=True,
                )
        self._by_cgroup = index

    def _failed(self, error: Exception) -> None:
        report_failure(
            self._health,
            Stage.KUBERNETES,
            error,
            refused="Kubernetes API refused the agent ({status}): it needs get, list and watch on pods; "
            "pod names stay unresolved until it is allowed",
            failed="Kubernetes API failed",
        )


# A kubeconfig with its certificates inline is tens of kilobytes; past this it is not one.
MAX_KUBECONFIG_BYTES = 4 * 1024 * 1024


class KubeconfigError(ValueError):
    """A kubeconfig that cannot be used: `what` says why in a few words, one line."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(f"{path}: {what}")
        self.path = path
        self.what = what


def read_kubeconfig(path: Path) -> Any:
    """The lightkube configuration in the kubeconfig at `path`, read as every file the agent is
    given is (otel_vgpu/files.py): lightkube's own reader would open a FIFO and wait, and
    says "not found" of a directory. KubeconfigError where it cannot be used."""
    import yaml  # noqa: PLC0415
    from lightkube import KubeConfig  # noqa: PLC0415

    path = path.expanduser()
    try:
        document = yaml.safe_load(read_regular(path, MAX_KUBECONFIG_BYTES))
    except FileProblem as problem:
        raise KubeconfigError(path, problem.what) from None
    except yaml.YAMLError as error:
        raise KubeconfigError(path, f"not YAML ({' '.join(str(error).split())})") from None
    if not isinstance(document, dict) or not all(
        isinstance(document.get(key), list) for key in ("clusters", "contexts")
    ):
        raise KubeconfigError(path, "not a kubeconfig (a YAML mapping with clusters and contexts)")
    return KubeConfig.from_dict(document, fname=path)


def make_client(kubeconfig: Path | None, service_account_dir: Path) -> Any:
    """A lightkube client from a kubeconfig file, or from the pod's service
    account (the token is read anew for each client, so rotated tokens are
    picked up)."""
    import httpx2  # noqa: PLC0415 - lightkube's HTTP client
    from lightkube import Client, KubeConfig  # noqa: PLC0415

    config = read_kubeconfig(kubeconfig) if kubeconfig else KubeConfig.from_service_account(service_account_dir)
    client = Client(config=config, timeout=httpx2.Timeout(10.0), trust_env=False)
    # lightkube reads a watch line by line (httpx2's iter_lines), each line whole before it
    # parses it, with no bound: a watch line of 200 MB took 230 MiB. Its transport (the
    # one lightkube's client adapter built, TLS and all) is wrapped to bound each line.
    from otel_vgpu.kubernetes.bounded import MAX_WATCH_LINE_BYTES, BoundedWatchLines  # noqa: PLC0415

    http = client._client._client
    transport = BoundedWatchLines(http._transport, MAX_WATCH_LINE_BYTES)
    http._transport = transport
    # How a list-and-watch loop that gives this client up wakes its reader (list_watch.py).
    client.otel_vgpu_interrupt = transport.interrupt  # type: ignore[attr-defined]
    return client
