"""The OTLP push under the semantic conventions (`--otlp-names semconv`) on a real GPU, through
the pod harness: what a Collector receives from the agent as the chart runs it.

Run as root on a GPU node from the repository root (bench/README.md says what the GPU scripts
need), with a manifest rendered with a cluster name:

    helm template otel-vgpu charts/otel-vgpu --namespace otel-vgpu --set clusterName=h200-lab > chart-semconv.yaml
    python3 bench/gpu_validate_semconv.py --pod chart-semconv.yaml [--out results.md]

A pod of two busy CUDA processes on GPU 0 (a Hopper GPU has GPM: PCIe bytes), the agent pushing
OTLP/HTTP every 2 s to a receiver in this process, which decodes each request with
opentelemetry-proto's own messages. The checks: the node's Resource (the cluster's name, no
agent pod), the GPU's points under the hardware conventions with its real identity (UUID,
model, driver), each convention's instrument, the PCIe byte counter growing, and the pod's
Resource with its UID, name and namespace. Nothing on the GPU is reconfigured.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import free_port, wait_serving
from testkit.cuda_workloads import nvml_truth, require_gpu
from testkit.gpu_node import AGENT_PORT, NODE, POD_RESOURCES_DIR, Doubles, pod_harness
from testkit.host_pods import HostPod, start_in, stop_pods
from testkit.report import Report

URL = f"http://127.0.0.1:{AGENT_PORT}"
CLUSTER = "h200-lab"
# What only a scrape carries: never on a semconv point.
# The GPU's identity on each of its points, left out of the table of points.
IDENTITY = {"hw.id", "hw.name", "hw.model", "hw.vendor", "hw.driver_version", "hw.type"}
SCRAPE_ONLY = {"pod", "namespace", "pod_uid", "container", "gpu_id", "gpu_uuid", "gpu_model"}
Point = tuple[dict[str, Any], dict[str, Any], float, str]
"""A point as received: its Resource's attributes, its own, its value, its metric's kind."""


class Received:
    """Every metric of every OTLP/HTTP export request, decoded, by name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pushes: list[dict[str, list[Point]]] = []

    def add(self, body: bytes) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: PLC0415
            ExportMetricsServiceRequest,
        )

        request = ExportMetricsServiceRequest.FromString(body)
        push: dict[str, list[Point]] = {}
        for resource_metrics in request.resource_metrics:
            resource = _attributes(resource_metrics.resource.attributes)
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    kind = str(metric.WhichOneof("data"))
                    if kind not in ("gauge", "sum"):
                        continue  # the agent's own histograms: their buckets are no figure of the GPU's
                    data = getattr(metric, kind)
                    if kind == "sum":
                        kind = f"sum {'monotonic' if data.is_monotonic else 'non-monotonic'}"
                    for point in data.data_points:
                        value = point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
                        push.setdefault(metric.name, []).append(
                            (resource, _attributes(point.attributes), float(value), f"{kind} {metric.unit}")
                        )
        with self.lock:
            self.pushes.append(push)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: getattr(pair.value, pair.value.WhichOneof("value")) for pair in pairs}


def receiver(received: Received) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            encoding = self.headers.get("Content-Encoding", "")
            body = gzip.decompress(body) if encoding == "gzip" else zlib.decompress(body) if encoding else body
            received.add(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait_push(received: Received, test: Any, what: str, timeout: float = 90.0) -> dict[str, list[Point]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with received.lock:
            found = [push for push in received.pushes if test(push)]
        if found:
            return found[-1]
        time.sleep(0.5)
    raise SystemExit(f"{what}: not within {timeout:g} s")


def proof(args: argparse.Namespace, cluster: Doubles, tmp: Path, report: Report) -> None:
    lines, check = report.lines, report.check
    _, total, model, gpu_uuid, driver = nvml_truth()
    pod = HostPod("ml", "trainer-0", "systemd", "guaranteed")
    cluster.kubelet.allocatable = {"nvidia.com/gpu": [f"{gpu_uuid}::{n}" for n in range(2)]}
    received = Received()
    server = receiver(received)
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    push_args = ("--otlp-endpoint", endpoint, "--otlp-protocol", "http/protobuf", "--otlp-interval", "2")
    agent = pod_harness(args.pod, tmp / "semconv", cluster, NODE, extra_args=(*push_args, "--otlp-names", "semconv"))
    try:
        wait_serving(URL, agent.start(), agent.log.read_text, timeout=60)
        lines += [f"GPU: {model}, driver {driver}; the agent as `{args.pod.name}` runs it (pod harness)", ""]
        start_in(pod, ["busy", "busy"], 2.0)
        cluster.add(pod, {"main": [f"{gpu_uuid}::0"]})

        def pod_points(push: dict[str, list[Point]], name: str) -> list[Point]:
            return [p for p in push.get(name, []) if p[0].get("k8s.pod.name") == pod.name]

        first = wait_push(received, lambda p: pod_points(p, "vgpu.pod.gpu.utilization") and "hw.gpu.io" in p, "a push")
        later = wait_push(
            received,
            lambda p: (
                p is not first
                and "hw.gpu.io" in p
                and _io(p) != _io(first)
                and pod_points(p, "vgpu.pod.gpu.utilization")
            ),
            "a later push whose PCIe bytes moved",
        )
        node = next(resource for resource, _, _, _ in later["hw.gpu.utilization"])
        lines += ["### The node's Resource", "", *(f"    {k}: {v}" for k, v in sorted(node.items())), ""]
        check(
            node.get("k8s.cluster.name") == CLUSTER,
            f"the cluster's name from the chart: {node.get('k8s.cluster.name')}",
        )
        check(node.get("k8s.node.name") == NODE and node.get("service.name") == "otel-vgpu", "the node and the service")
        check("k8s.pod.uid" not in node and "k8s.pod.name" not in node, "no agent pod on the node's Resource")

        lines += ["### The GPU's points", "", "| metric | kind, unit | attributes | value |", "|---|---|---|---|"]
        for name in sorted(n for n in later if n.startswith("hw.")):
            for _, attributes, value, kind in later[name]:
                own = {
                    k: v
                    for k, v in attributes.items()
                    if not k.startswith("hw.") or k in ("hw.gpu.task", "hw.sensor_location")
                }
                lines.append(f"| `{name}` | {kind} | {own} | {value:g} |")
        lines.append("")
        general = [a for _, a, _, _ in later["hw.gpu.utilization"] if a.get("hw.gpu.task") == "general"]
        identity = general[0] if general else {}
        check(identity.get("hw.id") == gpu_uuid, f"hw.id is the GPU's UUID: {identity.get('hw.id')}")
        check(
            identity.get("hw.model") == model and identity.get("hw.vendor") == "NVIDIA",
            f"hw.model {identity.get('hw.model')}",
        )
        check(identity.get("hw.driver_version") == driver, f"hw.driver_version {identity.get('hw.driver_version')}")
        kinds = {name: {kind for _, _, _, kind in points} for name, points in later.items()}
        for name, kind in (
            ("hw.gpu.utilization", "gauge 1"),
            ("hw.gpu.memory.usage", "sum non-monotonic By"),
            ("hw.gpu.memory.limit", "sum non-monotonic By"),
            ("hw.energy", "sum monotonic J"),
            ("hw.power", "gauge W"),
            ("hw.temperature", "gauge Cel"),
            ("hw.errors", "sum monotonic {error}"),
            ("hw.gpu.io", "sum monotonic By"),
        ):
            check(kinds.get(name) == {kind}, f"{name}: {kinds.get(name)}, the convention's {kind}")
        limit = [value for _, _, value, _ in later.get("hw.gpu.memory.limit", [])]
        check(limit == [float(total)], f"hw.gpu.memory.limit {limit} is NVML's total {total}")
        check(_io(later)["transmit"] > _io(first)["transmit"], f"hw.gpu.io grows: {_io(first)} then {_io(later)}")
        scrape_only = {k for points in later.values() for _, a, _, _ in points for k in a} & SCRAPE_ONLY
        check(not scrape_only, f"no scrape-only label on any point: {sorted(scrape_only)}")

        mine = pod_points(later, "vgpu.pod.gpu.utilization")
        resource = mine[0][0]
        lines += ["### The pod's Resource", "", *(f"    {k}: {v}" for k, v in sorted(resource.items())), ""]
        check(resource.get("k8s.pod.uid") == pod.uid, f"k8s.pod.uid {resource.get('k8s.pod.uid')}")
        check(resource.get("k8s.namespace.name") == pod.namespace, "k8s.namespace.name")
        busy = [v for _, a, v, _ in mine if a.get("hw.gpu.task") == "general"]
        check(bool(busy) and busy[0] > 0.5, f"the busy pod's vgpu.pod.gpu.utilization (general): {busy}")
        used = [v for _, _, v, _ in pod_points(later, "vgpu.pod.gpu.memory.usage")]
        check(bool(used) and used[0] > 1 << 30, f"the pod's vgpu.pod.gpu.memory.usage: {used}")
        lines += [f"{len(received.pushes)} pushes received", ""]
    finally:
        log = agent.stop()
        stop_pods([pod])
        server.shutdown()
        errors = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
        lines += [f"agent log: {len(log.splitlines())} lines, {len(errors)} errors", ""]
        lines += [f"    {line}" for line in errors[:5]]


def _io(push: dict[str, list[Point]]) -> dict[str, float]:
    return {a.get("network.io.direction", ""): v for _, a, v, _ in push.get("hw.gpu.io", [])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pod", type=Path, required=True, metavar="MANIFEST")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_gpu()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-semconv-", dir="/var/tmp"))
    cluster = Doubles(tmp, NODE, pki=True, socket_dir=POD_RESOURCES_DIR)
    report = Report()
    try:
        try:
            proof(args, cluster, tmp, report)
        except SystemExit as stopped:
            report.check(False, str(stopped))
    finally:
        cluster.stop()
    return report.finish("The semantic-conventions push, on a real GPU", args.out)


if __name__ == "__main__":
    raise SystemExit(main())
