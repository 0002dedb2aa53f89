"""The BindRequests KAI Scheduler wrote for this node, listed then watched (allocation/kai.py
reads them).

KAI's scheduler labels each BindRequest `selected-node=<node>` (pkg/scheduler/cache/cache.go,
createBindRequest), and its CRD declares no field a selector may name: so the agent asks for
its node's by that label, across namespaces, as it asks for its node's pods by field. The label
only narrows the list; spec.selectedNode decides. It needs get, list and watch on
bindrequests.scheduling.run.ai (the chart's kai.enabled).

With --kai auto the list starts once a pod of KAI's reservation namespace is on this node: a
cluster without KAI is never asked for a resource it does not serve, nor counted failing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from otel_vgpu.agent_health import Reader, Stage
from otel_vgpu.allocation.kai import (
    API_GROUP,
    API_VERSION,
    KIND,
    NODE_LABEL,
    PLURAL,
    BindRequest,
    KaiSettings,
    KaiView,
    parse_portion,
)
from otel_vgpu.kubernetes.list_watch import ListWatch, WatchSettings, report_failure, status_of
from otel_vgpu.pods.directory import PodMeta

log = logging.getLogger(__name__)


def bind_request(obj: Any) -> BindRequest:
    """A BindRequest as the API serves it (a lightkube generic object, or its dict)."""
    data: Mapping[str, Any] = obj.to_dict() if hasattr(obj, "to_dict") else obj
    metadata = data.get("metadata") or {}
    spec = data.get("spec") or {}
    received = spec.get("receivedGPU") or {}
    owners = tuple(str(ref.get("uid", "")) for ref in metadata.get("ownerReferences") or () if ref.get("kind") == "Pod")
    return BindRequest(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        owners=owners,
        node=str(spec.get("selectedNode", "")),
        resource_type=str(spec.get("receivedResourceType", "")),
        portion=parse_portion(received.get("portion", "")),
        groups=tuple(str(group) for group in spec.get("selectedGPUGroups") or ()),
        phase=str((data.get("status") or {}).get("phase", "")),
    )


class KaiBindRequests:
    """This node's BindRequests, kept current by a watch once KAI is seen (`mode` auto) or from
    the start (on)."""

    def __init__(self, settings: WatchSettings, mode: str, kai: KaiSettings) -> None:
        from lightkube.generic_resource import create_namespaced_resource  # noqa: PLC0415

        self._mode = mode
        self._kai = kai
        self._node = settings.node_name
        self._health = settings.health
        self._lock = threading.Lock()
        self._requests: dict[str, BindRequest] = {}  # by UID
        self._begun = False
        self._loop = ListWatch(
            settings,
            create_namespaced_resource(API_GROUP, API_VERSION, KIND, PLURAL),
            what="bindrequests",
            fields={},
            labels={NODE_LABEL: settings.node_name},
            namespace="*",
            on_list=self._listed,
            on_event=self._changed,
            on_failure=self._failed,
            stage=Stage.BIND_REQUESTS,
            reader=Reader.API_BIND_REQUESTS,
        )

    def start(self) -> None:
        if self._mode == "on":
            self._begin("--kai on")

    def stop(self) -> None:
        if self._begun:
            self._loop.stop()

    def wait_synced(self, timeout: float) -> bool:
        return self._loop.synced.wait(timeout)

    def view(self, pods: Mapping[str, PodMeta]) -> KaiView | None:
        """What the BindRequests say now: not listed yet (or not readable), none, but KAI's
        reservation pods still hold their GPUs; None while KAI is not read (auto, until the first
        pod of the reservation namespace among `pods`, which starts the watch)."""
        if not self._begun and self._mode == "auto":
            seen = next((meta for meta in pods.values() if meta.namespace == self._kai.namespace), None)
            if seen is not None:
                self._begin(f"pod {seen.namespace}/{seen.name} of KAI's reservation namespace runs on this node")
        if not self._begun:
            return None
        with self._lock:
            return KaiView(self._node, tuple(self._requests.values()), self._kai, self._loop.synced.is_set())

    def _begin(self, why: str) -> None:
        self._begun = True
        log.info("KAI Scheduler: %s; reading the BindRequests of node %s for its GPU fractions", why, self._node)
        self._loop.start()

    def _listed(self, items: list[Any]) -> None:
        requests = {}
        for item in items:
            requests[_uid(item)] = bind_request(item)
        with self._lock:
            self._requests = requests
        self._health.recovered(Stage.BIND_REQUESTS, "KAI Scheduler's BindRequests readable again")

    def _changed(self, kind: str, item: Any) -> None:
        with self._lock:
            if kind == "DELETED":
                self._requests.pop(_uid(item), None)
            else:
                self._requests[_uid(item)] = bind_request(item)

    def _failed(self, error: Exception) -> None:
        if status_of(error) == 404:
            self._health.failed(
                Stage.BIND_REQUESTS,
                "404",
                f"the Kubernetes API serves no {PLURAL}.{API_GROUP}/{API_VERSION}: KAI Scheduler is not installed "
                "(or --kai-reservation names a namespace of another's); its fractions are not read, give --kai off "
                "where it does not run",
            )
            return
        report_failure(
            self._health,
            Stage.BIND_REQUESTS,
            error,
            refused=f"Kubernetes API refused the agent ({{status}}) listing KAI Scheduler's BindRequests: it needs "
            f"get, list and watch on {PLURAL}.{API_GROUP} (the chart's kai.enabled); KAI's fractions are not read "
            "until it is allowed",
            failed="Kubernetes API failed listing KAI Scheduler's BindRequests",
        )


def _uid(item: Any) -> str:
    data = item.to_dict() if hasattr(item, "to_dict") else item
    metadata = data.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace')}/{metadata.get('name')}")
