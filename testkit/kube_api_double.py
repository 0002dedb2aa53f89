"""A Kubernetes API server double: pods of one node over HTTPS, in the API's JSON.

It speaks what a real API server speaks for `GET /api/v1/pods` (and nodes, and KAI Scheduler's
BindRequests, a custom resource checked against its CRD): bearer-token authentication,
`fieldSelector` and `labelSelector`, lists with a resourceVersion, and watch streams (chunked,
one JSON event per line) that resume from a resourceVersion and answer `410 Gone` (an ERROR
event) once it is compacted. Faults are switched on from the test: refused tokens, failing or
slow lists, a watch that breaks mid-stream, a resource refused or not served.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from testkit.crds import problems

if TYPE_CHECKING:
    from testkit.certs import Certs


def pod_object(
    namespace: str,
    name: str,
    uid: str,
    node: str,
    containers: dict[str, str] | None = None,
    gpu_limits: dict[str, int] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
    init_containers: tuple[str, ...] = (),
    resource: str = "nvidia.com/gpu",
    labels: dict[str, str] | None = None,
    service_account: str = "default",
) -> dict[str, Any]:
    """A Pod as the API returns it. `containers` maps name to container ID;
    `gpu_limits` gives containers a limit of `resource`."""
    containers = containers or {"main": ""}
    gpu_limits = gpu_limits or {}
    metadata = {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations or {}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**metadata, "labels": labels or {}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            **(
                {"initContainers": [{"name": n, "image": "registry.example/init:1"} for n in init_containers]}
                if init_containers
                else {}
            ),
            "containers": [
                {
                    "name": cname,
                    "image": "registry.example/app:1",
                    "resources": {"limits": {resource: str(gpu_limits[cname])}} if cname in gpu_limits else {},
                }
                for cname in containers
            ],
        },
        "status": {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": cname,
                    "containerID": f"containerd://{cid}" if cid else None,
                    "image": "registry.example/app:1",
                    "imageID": "sha256:00",
                    "ready": True,
                    "restartCount": 0,
                }
                for cname, cid in containers.items()
            ],
        },
    }


def bind_request_object(
    namespace: str,
    pod: str,
    pod_uid: str,
    node: str,
    *,
    resource_type: str = "Fraction",
    portion: str = "1.00",
    groups: tuple[str, ...] = (),
    count: int = 1,
    phase: str | None = "Succeeded",
) -> dict[str, Any]:
    """A BindRequest as KAI Scheduler's scheduler creates it for a pod (pkg/scheduler/cache/cache.go,
    createBindRequest: named as the pod, in its namespace, owned by it, labelled with the node)
    and its binder leaves it (status.phase; None: not yet reconciled)."""
    return {
        "apiVersion": "scheduling.run.ai/v1alpha2",
        "kind": "BindRequest",
        "metadata": {
            "name": pod,
            "namespace": namespace,
            "uid": str(uuidlib.uuid5(uuidlib.NAMESPACE_OID, f"bindrequest/{namespace}/{pod}/{pod_uid}")),
            "labels": {"selected-node": node},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid}],
        },
        "spec": {
            "podName": pod,
            "selectedNode": node,
            "receivedResourceType": resource_type,
            "receivedGPU": {"count": count, "portion": portion},
            **({"selectedGPUGroups": list(groups)} if groups else {}),
        },
        **({"status": {"phase": phase}} if phase else {}),
    }


def node_object(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node as the API returns it (the parts the agent reads: its labels)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"node-{name}", "labels": dict(labels or {})},
    }


# What each resource's list and watch select by, as the agent asks: pods of one node, one node by
# name (fieldSelector); BindRequests by the node KAI's scheduler labels them with (labelSelector).
_SELECTORS = {"pods": "spec.nodeName", "nodes": "metadata.name"}
BIND_REQUESTS = "/apis/scheduling.run.ai/v1alpha2/bindrequests"
_LABEL_SELECTORS = {"bindrequests": "selected-node"}


def _selected(resource: str, obj: dict[str, Any], node: str) -> bool:
    if resource == "pods":
        return bool(obj["spec"]["nodeName"] == node)
    if resource == "bindrequests":
        return bool(obj["metadata"].get("labels", {}).get("selected-node") == node)
    return bool(obj["metadata"]["name"] == node)


@dataclass
class ApiState:
    node: str
    token: str
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    bindrequests: dict[str, dict[str, Any]] = field(default_factory=dict)
    serve_bind_requests: bool = True
    """False: the API serves no BindRequests (404), as a cluster without KAI's CRDs."""
    forbid_bind_requests: bool = False
    """BindRequests answer 403, as under a ClusterRole without them."""
    events: list[tuple[int, str, str, dict[str, Any]]] = field(default_factory=list)
    """(resourceVersion, resource, type, object)."""
    version: int = 100
    compacted_below: int = 0
    list_failures: list[int] = field(default_factory=list)
    """HTTP statuses the next lists answer with, one each."""
    list_delay: float = 0.0
    down: bool = False
    """Every list answers 503 while set."""
    garbage_lists: int = 0
    """How many of the next lists answer 200 with a body that is not JSON."""
    forbidden: bool = False
    forbid_nodes: bool = False
    """Nodes answer 403, as under a ClusterRole without them."""
    endless_watch_line: int = 0
    """The next pods watch sends this many bytes with no newline (one line that never ends), then closes."""
    hang_watches: bool = False
    """Watches answer their headers, then nothing, and never end (a half-open connection)."""
    refuse_all: bool = False
    watch_generation: int = 0
    requests: list[str] = field(default_factory=list)
    lists: int = 0
    watches: int = 0
    condition: threading.Condition = field(default_factory=threading.Condition)


class KubeApiDouble:
    def __init__(self, certs: Certs | None, node: str, token: str = "test-token") -> None:
        """HTTPS with `certs`; plain HTTP without (for a kubeconfig with an http:// server)."""
        self.state = ApiState(node=node, token=token)
        handler = type("Handler", (_Handler,), {"state": self.state})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        if certs is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certs.cert, certs.key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> KubeApiDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.state.condition:
            self.state.watch_generation += 1
            self.state.condition.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # --- changing the cluster ------------------------------------------------

    def _event(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        state = self.state
        store: dict[str, dict[str, Any]] = getattr(state, resource)
        with state.condition:
            state.version += 1
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["resourceVersion"] = str(state.version)
            if kind == "DELETED":
                store.pop(obj["metadata"]["uid"], None)
            else:
                store[obj["metadata"]["uid"]] = obj
            state.events.append((state.version, resource, kind, obj))
            state.condition.notify_all()

    def put(self, pod: dict[str, Any]) -> None:
        kind = "MODIFIED" if pod["metadata"]["uid"] in self.state.pods else "ADDED"
        self._event("pods", kind, pod)

    def delete(self, uid: str) -> None:
        self._event("pods", "DELETED", self.state.pods[uid])

    def put_bind_request(self, request: dict[str, Any]) -> None:
        """Create or replace a BindRequest, refused as the API server would where its CRD says no."""
        wrong = problems(request)
        assert not wrong, f"a BindRequest its CRD refuses: {wrong}"
        kind = "MODIFIED" if request["metadata"]["uid"] in self.state.bindrequests else "ADDED"
        self._event("bindrequests", kind, request)

    def delete_bind_request(self, uid: str) -> None:
        self._event("bindrequests", "DELETED", self.state.bindrequests[uid])

    def put_node(self, node: dict[str, Any]) -> None:
        kind = "MODIFIED" if node["metadata"]["uid"] in self.state.nodes else "ADDED"
        self._event("nodes", kind, node)

    def node_labels(self, name: str) -> dict[str, str]:
        node = self.state.nodes.get(f"node-{name}")
        return dict(node["metadata"]["labels"]) if node else {}

    def label_node(self, name: str, labels: dict[str, str]) -> None:
        """Set (or, with a value of None, remove) labels of a node, as `kubectl label` does."""
        node = json.loads(json.dumps(self.state.nodes.get(f"node-{name}") or node_object(name)))
        for key, value in labels.items():
            if value is None:
                node["metadata"]["labels"].pop(key, None)
            else:
                node["metadata"]["labels"][key] = value
        self.put_node(node)

    def compact(self) -> None:
        """Forget history: watches resuming from an older version get 410 Gone."""
        with self.state.condition:
            self.state.compacted_below = self.state.version + 1
            self.state.version += 1
            self.state.watch_generation += 1  # open watches end with the ERROR too
            self.state.condition.notify_all()

    def break_watches(self) -> None:
        """Drop every open watch connection without ending the stream."""
        with self.state.condition:
            self.state.watch_generation += 1
            self.state.condition.notify_all()


class _Handler(BaseHTTPRequestHandler):
    state: ApiState
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }

    def do_GET(self) -> None:
        state = self.state
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        state.requests.append(self.path)
        if state.refuse_all or self.headers.get("Authorization") != f"Bearer {state.token}":
            self._json(401, self._status(401, "Unauthorized", "Unauthorized"))
            return
        if state.forbidden:
            message = 'pods is forbidden: User "system:serviceaccount:otel-vgpu:otel-vgpu" cannot list resource "pods"'
            self._json(403, self._status(403, "Forbidden", message))
            return
        resource = "bindrequests" if url.path == BIND_REQUESTS else url.path.removeprefix("/api/v1/")
        if resource not in (*_SELECTORS, *_LABEL_SELECTORS) or (
            resource == "bindrequests" and not state.serve_bind_requests
        ):
            self._json(404, self._status(404, "NotFound", f"the server could not find {url.path}"))
            return
        selector, expected = (
            ("labelSelector", f"{_LABEL_SELECTORS[resource]}={state.node}")
            if resource in _LABEL_SELECTORS
            else ("fieldSelector", f"{_SELECTORS[resource]}={state.node}")
        )
        if query.get(selector) != expected or (resource in _LABEL_SELECTORS and query.get("fieldSelector")):
            # Only this node's pods, BindRequests and node may be asked for: anything else is a test failure.
            self._json(400, self._status(400, "BadRequest", f"unexpected {selector} {query.get(selector)}"))
            return
        if resource == "bindrequests" and state.forbid_bind_requests:
            user = "system:serviceaccount:otel-vgpu:otel-vgpu"
            message = f'bindrequests.scheduling.run.ai is forbidden: User "{user}" cannot list resource "bindrequests"'
            self._json(403, self._status(403, "Forbidden", message))
            return
        if resource == "nodes" and state.forbid_nodes:
            user = "system:serviceaccount:otel-vgpu:otel-vgpu"
            message = f'nodes is forbidden: User "{user}" cannot list resource "nodes"'
            self._json(403, self._status(403, "Forbidden", message))
            return
        if query.get("watch") in ("true", "1"):
            self._watch(resource, int(query.get("resourceVersion") or 0), float(query.get("timeoutSeconds") or 30))
        else:
            self._list(resource)

    def _list(self, resource: str) -> None:
        state = self.state
        if resource == "pods":
            state.lists += 1
            if self._pod_list_fault():
                return
        elif state.down:
            self._json(503, self._status(503, "InternalError", "injected 503"))
            return
        with state.condition:
            store: dict[str, dict[str, Any]] = getattr(state, resource)
            items = [obj for obj in store.values() if _selected(resource, obj, state.node)]
            body = {
                "apiVersion": "scheduling.run.ai/v1alpha2" if resource == "bindrequests" else "v1",
                "kind": {"pods": "PodList", "nodes": "NodeList"}.get(resource, "BindRequestList"),
                "metadata": {"resourceVersion": str(state.version)},
                "items": items,
            }
        self._json(200, body)

    def _pod_list_fault(self) -> bool:
        """The faults a test switched on for pod lists (the node's own list fails only while `down`)."""
        state = self.state
        if state.list_delay:
            time.sleep(state.list_delay)
        if state.garbage_lists:
            state.garbage_lists -= 1
            data = b'{"apiVersion": "v1", "kind": "PodList", "items": [{"metadata": '
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return True
        if state.list_failures or state.down:
            code = state.list_failures.pop(0) if state.list_failures else 503
            self._json(code, self._status(code, "InternalError", f"injected {code}"))
            return True
        return False

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, resource: str, since: int, timeout: float) -> None:
        state = self.state
        with state.condition:
            # Counted and joined to the present generation at once: a watch the tests see
            # counted is one break_watches() breaks.
            generation = state.watch_generation
            if resource == "pods":
                state.watches += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if state.endless_watch_line and resource == "pods":
            left, state.endless_watch_line = state.endless_watch_line, 0
            piece = b"x" * (1 << 20)
            try:
                while left > 0:
                    self._chunk(piece[:left])
                    left -= len(piece)
            except OSError:
                pass  # the client gave up on it, as it should
            self.close_connection = True
            return
        if state.hang_watches and resource == "pods":
            with state.condition:
                while state.watch_generation == generation:
                    state.condition.wait(0.5)
            self.close_connection = True
            return
        deadline = time.monotonic() + timeout
        sent = since
        while True:
            with state.condition:
                if since < state.compacted_below:
                    gone = {
                        "type": "ERROR",
                        "object": self._status(410, "Expired", f"too old resource version: {since}"),
                    }
                    self._chunk(json.dumps(gone).encode() + b"\n")
                    break
                if state.watch_generation != generation:
                    # broken mid-stream: no terminating chunk
                    self.close_connection = True
                    return
                pending = [
                    (v, k, o)
                    for v, r, k, o in state.events
                    if v > sent and r == resource and _selected(resource, o, state.node)
                ]
                if not pending:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    state.condition.wait(min(remaining, 0.5))
                    continue
            for version, kind, obj in pending:
                self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                sent = version
        self._chunk(b"")
