"""The pod directory from the Kubernetes API: this node's pods, listed then watched.

Only pods bound to this node are asked for (`fieldSelector=spec.nodeName=<node>`),
so the agent's memory and the API server's work scale with one node, not the
cluster. A background thread lists, then watches from the list's
resourceVersion; after `410 Gone`, a broken watch or any error it lists again,
with exponential backoff. Sweeps read the current state and never wait for the
API. The client is lightkube (TLS verified against the service account's CA).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_vgpu.allocation.hami import ANNOTATION as HAMI_ANNOTATION
from otel_vgpu.allocation.hami import HamiAnnotationError, parse_hami
from otel_vgpu.allocation.shares import counted
from otel_vgpu.config import DEFAULT_BACKOFF, DEFAULT_RESOURCES, Backoff
from otel_vgpu.health import Health, Stage
from otel_vgpu.pods.directory import PodMeta, StatedGrant

log = logging.getLogger(__name__)

CONFIG_HASH = "kubernetes.io/config.hash"
# The API server closes a watch after this long; the client then lists again
# only if the watch broke, otherwise it resumes from the last resourceVersion.
WATCH_SECONDS = 300


@dataclass(frozen=True, slots=True)
class _Entry:
    uid: str
    cgroup_uid: str
    """What the pod's cgroups carry: the UID, or a static pod's config hash."""
    meta: PodMeta
    problem: str | None = None
    """Why part of the pod could not be read (a malformed allocator annotation)."""


def pod_entry(pod: Any, resources: Iterable[str] = DEFAULT_RESOURCES) -> _Entry:
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
    hami = annotations.get(HAMI_ANNOTATION)
    if hami:
        init = [c.name for c in (spec.initContainers if spec else None) or []]
        where = f"pod {metadata.namespace}/{metadata.name}: annotation {HAMI_ANNOTATION}"
        try:
            stated = parse_hami(hami, init, [c.name for c in regular], where)
        except HamiAnnotationError as error:
            problem = str(error)
    return _Entry(
        uid=metadata.uid,
        cgroup_uid=annotations.get(CONFIG_HASH, metadata.uid),
        meta=PodMeta(
            metadata.namespace or "",
            metadata.name,
            containers=containers,
            gpu_limits=limits,
            phase=(status.phase if status else None) or "Pending",
            stated=stated,
            uid=metadata.uid,
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
        make_client: Callable[[], Any],
        node_name: str,
        resources: Iterable[str] = DEFAULT_RESOURCES,
        health: Health | None = None,
        watch_seconds: int = WATCH_SECONDS,
        backoff: Backoff = DEFAULT_BACKOFF,
        watch_grace_s: float = 5.0,
    ) -> None:
        self._make_client = make_client
        self._client: Any = None
        self._generation = 0
        self._progress = time.monotonic()
        self._node = node_name
        self._resources = tuple(resources)
        self._health = health or Health()
        self._watch_seconds = watch_seconds
        self._backoff = backoff
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}  # by API UID
        self._by_cgroup: dict[str, PodMeta] = {}
        self._stop = threading.Event()
        self._synced = threading.Event()
        # A list or watch event must come within this long, or the watch is
        # taken for hung (a half-open connection the server never closes):
        # the agent lists again on a new connection. On a quiet node that is
        # one extra list every few minutes.
        self._silence_limit = watch_seconds * 1.2 + watch_grace_s
        self._watchdog = threading.Thread(target=self._watch_the_watch, name="kubernetes-watchdog", daemon=True)

    # --- PodDirectory --------------------------------------------------------

    def lookup(self, pod_uid: str) -> PodMeta | None:
        with self._lock:
            return self._by_cgroup.get(pod_uid)

    def pods(self) -> Mapping[str, PodMeta]:
        with self._lock:
            return dict(self._by_cgroup)

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        self._begin()
        self._watchdog.start()

    def _begin(self) -> None:
        """A new list-and-watch loop on a new client; the previous loop's
        events are ignored from now on."""
        with self._lock:
            self._generation += 1
            generation = self._generation
            old, self._client = self._client, self._make_client()
            self._progress = time.monotonic()
        if old is not None:
            with contextlib.suppress(Exception):
                old.close()
        client = self._client
        threading.Thread(
            target=self._run, args=(client, generation), name=f"kubernetes-pods-{generation}", daemon=True
        ).start()

    def _watch_the_watch(self) -> None:
        while not self._stop.wait(min(5.0, self._silence_limit / 4)):
            silent = time.monotonic() - self._progress
            if self._synced.is_set() and not self._health.failing(Stage.KUBERNETES) and silent > self._silence_limit:
                # Counted and logged each time: a hung watch is an event, not an outage.
                self._health.count(Stage.KUBERNETES)
                log.warning(
                    "no word from the Kubernetes API watch for %.0f s; listing again on a new connection", silent
                )
                self._begin()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def stop(self) -> None:
        self._stop.set()
        # The loop may be blocked in a watch's read, which closing the client
        # does not interrupt; its thread is a daemon, so it is not waited for.
        with contextlib.suppress(Exception):
            self._client.close()

    # --- the loop ----------------------------------------------------------------

    def _current(self, generation: int) -> bool:
        return generation == self._generation and not self._stop.is_set()

    def _run(self, client: Any, generation: int) -> None:
        first, most = self._backoff.first, self._backoff.most
        backoff = first
        while self._current(generation):
            try:
                version = self._list(client, generation)
                backoff = first
                self._watch(client, generation, version)
            except Exception as error:  # any failure of the API means: list again later
                if not self._current(generation):
                    return
                if _status(error) == 410:
                    log.debug("watch expired (410 Gone); listing again")
                    continue
                self._failed(error)
                self._stop.wait(backoff)
                backoff = min(most, backoff * 2)

    def _list(self, client: Any, generation: int) -> str:
        from lightkube.resources.core_v1 import Pod  # noqa: PLC0415

        listing = client.list(Pod, namespace="*", fields={"spec.nodeName": self._node})
        entries = {}
        for pod in listing:
            entry = self._entry(pod)
            entries[entry.uid] = entry
        with self._lock:
            if generation != self._generation:
                raise _Superseded
            self._entries = entries
            self._reindex()
            self._progress = time.monotonic()
        healed = f"Kubernetes API reachable again; {len(entries)} pods on node {self._node}"
        if not self._health.recovered(Stage.KUBERNETES, healed) and not self._synced.is_set():
            log.info("Kubernetes API: %d pods on node %s", len(entries), self._node)
        self._synced.set()
        version: str = listing.resourceVersion
        return version

    def _watch(self, client: Any, generation: int, version: str) -> None:
        from lightkube.resources.core_v1 import Pod  # noqa: PLC0415

        events = client.watch(
            Pod,
            namespace="*",
            fields={"spec.nodeName": self._node},
            resource_version=version,
            server_timeout=self._watch_seconds,
        )
        for kind, pod in events:
            entry = self._entry(pod)
            with self._lock:
                if generation != self._generation or self._stop.is_set():
                    return
                self._progress = time.monotonic()
                if kind == "DELETED":
                    self._entries.pop(entry.uid, None)
                else:
                    self._entries[entry.uid] = entry
                self._reindex()

    def _entry(self, pod: Any) -> _Entry:
        entry = pod_entry(pod, self._resources)
        if entry.problem is not None:
            # Counted and logged once per pod; the pod keeps its name and
            # counts as one share where it runs.
            self._health.failed(Stage.POD_ANNOTATIONS, entry.uid, f"{entry.problem}; its shares count as one")
        return entry

    def _reindex(self) -> None:
        """Rebuild the cgroup-UID index; the caller holds the lock."""
        self._by_cgroup = {e.cgroup_uid: e.meta for e in self._entries.values()}

    def _failed(self, error: Exception) -> None:
        status = _status(error)
        if status in (401, 403):
            message = (
                f"Kubernetes API refused the agent ({status}): it needs get, list and watch on pods; "
                "pod names stay unresolved until it is allowed"
            )
        else:
            message = f"Kubernetes API failed ({_describe(error)}); retrying with backoff"
        self._health.failed(Stage.KUBERNETES, f"{type(error).__name__}:{status}", message)


class _Superseded(Exception):
    """A loop the watchdog replaced finished a list: its result is dropped."""


def _status(error: Exception) -> int | None:
    status = getattr(error, "status", None)
    code = getattr(status, "code", None)
    return int(code) if isinstance(code, int) else None


def _describe(error: Exception) -> str:
    text = str(error) or type(error).__name__
    return text.splitlines()[0][:200]


def make_client(kubeconfig: Path | None, service_account_dir: Path) -> Any:
    """A lightkube client from a kubeconfig file, or from the pod's service
    account (the token is read anew for each client, so rotated tokens are
    picked up)."""
    import httpx2  # noqa: PLC0415 - lightkube's HTTP client
    from lightkube import Client, KubeConfig  # noqa: PLC0415

    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account(service_account_dir)
    return Client(config=config, timeout=httpx2.Timeout(10.0), trust_env=False)
