"""OTLP push into a real receiver (rotel), beside the Prometheus endpoint; a failing push
logged with its reason."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import MetricsData

from otel_vgpu.export.otlp import OtlpSettings, make_exporter
from otel_vgpu.export.otlp_failures import export_or_reason
from otel_vgpu.logs import LogLimit
from testkit.agent import clean_env, get, running_agent, wait_for
from testkit.clock import Clock
from testkit.logfmt import parse_logfmt
from testkit.otlp_names import prometheus_label, prometheus_name
from testkit.promtext import Exposition
from testkit.rotel import running_rotel

from ..conftest import GIB


def base_args(scenario_file: Path, ratio_file: Path, *extra: str) -> list[str]:
    return ["--simulate", str(scenario_file), "--allocation-file", str(ratio_file), *extra]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_push_arrives_with_names_units_attributes_and_resource(
    tmp_path: Path, scenario_file: Path, ratio_file: Path, protocol: str
) -> None:
    env = clean_env(
        OTEL_RESOURCE_ATTRIBUTES="k8s.cluster.name=gpu-east,deployment.environment=test",
        OTEL_SERVICE_NAME="gpu-monitor",
    )
    with running_rotel(tmp_path) as rotel:
        url = rotel.grpc_url if protocol == "grpc" else rotel.http_url
        args = base_args(
            scenario_file,
            ratio_file,
            "--otlp-endpoint",
            url,
            "--otlp-protocol",
            protocol,
            "--otlp-interval",
            "0.5",
            "--node-name",
            "node-7",
        )
        with running_agent(*args, env=env) as agent:
            batches = rotel.wait_for_batches(2)
            assert agent.scrape().series("vgpu_pod_memory_used_bytes"), "the Prometheus endpoint stays on"
            code, err = agent.stop()
    assert code == 0, err
    batch = batches[-1]
    assert batch.resource["service.name"] == "gpu-monitor"
    assert batch.resource["k8s.cluster.name"] == "gpu-east"
    assert batch.resource["k8s.node.name"] == "node-7"
    assert batch.resource["service.version"]
    # Each node's agent is its own instance on the OTLP path; its host is the node.
    assert batch.resource["service.instance.id"] == batch.resource["host.name"] == "node-7"
    units = {name: metric.unit for name, metric in batch.metrics.items()}
    assert units["vgpu.pod.memory.used"] == "By"
    assert units["vgpu.pod.memory.allocated"] == "By"
    assert units["vgpu.pod.sm.utilization"] == "1"  # vgpu_pod_sm_utilization_ratio, scraped or pushed
    assert units["vgpu.pod.vgpu.utilization"] == "1"
    assert units["vgpu.pod.processes"] == "{process}"
    assert units["vgpu.gpu.memory.total"] == "By"
    assert units["vgpu.gpu.vgpus"] == "{vgpu}"
    assert units["vgpu.agent.collection.duration"] == "s"
    assert batch.metrics["vgpu.pod.memory.used"].data_type == "Gauge"
    points = {
        (p.attributes["namespace"], p.attributes["pod"], p.attributes["gpu_id"]): p
        for p in batch.metrics["vgpu.pod.memory.used"].points
    }
    trainer = points[("ml", "trainer", "0")]
    assert trainer.value == 12 * GIB
    assert trainer.attributes["gpu_uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert all(m.description for m in batch.metrics.values())


def test_standard_variables_turn_the_push_on(tmp_path: Path, scenario_file: Path, ratio_file: Path) -> None:
    with running_rotel(tmp_path) as rotel:
        env = clean_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=rotel.http_url,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_METRIC_EXPORT_INTERVAL="300",
            OTEL_EXPORTER_OTLP_HEADERS="x-tenant=gpu-team",
        )
        with running_agent(*base_args(scenario_file, ratio_file), env=env) as agent:
            batches = rotel.wait_for_batches(2)
            agent.stop()
    assert "vgpu.gpu.memory.total" in batches[-1].metrics


def test_push_and_scrapes_share_sweeps(tmp_path: Path, scenario_file: Path, ratio_file: Path) -> None:
    with running_rotel(tmp_path) as rotel:
        args = base_args(
            scenario_file,
            ratio_file,
            "--otlp-endpoint",
            rotel.grpc_url,
            "--otlp-interval",
            "0.2",
            "--min-interval",
            "2",
        )
        with running_agent(*args) as agent:
            started = time.monotonic()
            scrapes = 0
            # At least 4 s and 20 scrapes, however slow a loaded machine makes each.
            while time.monotonic() - started < 4 or scrapes < 20:
                agent.scrape()
                scrapes += 1
                time.sleep(0.1)
            elapsed = time.monotonic() - started
            sweeps = agent.scrape().series("vgpu_agent_collection_duration_seconds_count")
            agent.stop()
        pushes = len(rotel.batches())
    sweep_count = next(iter(sweeps.values()))
    assert scrapes >= 20 and pushes >= 10
    # one sweep per 2 s whatever pulls it, plus the probe's and the first
    assert sweep_count <= elapsed / 2 + 3, (sweep_count, scrapes, pushes)


def test_unreachable_collector_never_slows_scrapes(scenario_file: Path, ratio_file: Path) -> None:
    # A socket that accepts connections into its backlog and never answers:
    # each export hangs until its timeout.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        # Each export hangs for its whole timeout: 3 s (the interval's).
        args = base_args(
            scenario_file, ratio_file, "--otlp-endpoint", url, "--otlp-interval", "3", "--min-interval", "0"
        )
        with running_agent(*args) as agent:
            latencies = []
            for _ in range(40):
                started = time.monotonic()
                status, _, _ = get(f"{agent.url}/metrics")
                latencies.append(time.monotonic() - started)
                assert status == 200
                time.sleep(0.1)
            # The first export fails once its 3 s are out.
            exposition = wait_for(
                agent, lambda e: next(iter(e.series("vgpu_agent_export_failures_total").values())) >= 1
            )
            stop_started = time.monotonic()
            code, err = agent.stop()
            stop_seconds = time.monotonic() - stop_started
    finally:
        silent.close()
    # A scrape held behind a hung export would wait out the rest of its 3 s;
    # none does, and a typical one takes what a scrape takes.
    latencies.sort()
    assert latencies[-1] < 3.0 and latencies[len(latencies) // 2] < 0.5, latencies
    assert next(iter(exposition.series("vgpu_agent_export_failures_total").values())) >= 1
    assert err.count("OTLP export to") == 1, err
    assert code == 0 and stop_seconds < 8


def test_sigterm_flushes_the_last_export(tmp_path: Path, scenario_file: Path, ratio_file: Path) -> None:
    with running_rotel(tmp_path) as rotel:
        args = base_args(scenario_file, ratio_file, "--otlp-endpoint", rotel.grpc_url, "--otlp-interval", "3600")
        with running_agent(*args) as agent:
            agent.scrape()
            assert rotel.batches() == []
            started = time.monotonic()
            code, _ = agent.stop()
            stopped = time.monotonic() - started
        batches = rotel.wait_for_batches(1, timeout=5)
    assert code == 0 and stopped < 5
    assert len(batches) == 1 and "vgpu.pod.memory.used" in batches[0].metrics


def test_exporter_is_imported_only_when_used(ratio_file: Path) -> None:
    probe = (
        "import sys, threading\n"
        "from otel_vgpu import cli\n"
        "threading.Timer(1.5, lambda: (print(any(m.startswith('opentelemetry.exporter.otlp') for m in sys.modules),"
        " flush=True), __import__('os').kill(__import__('os').getpid(), 15))).start()\n"
        f"cli.main(['--simulate', '--port', '0', '--address', '127.0.0.1', '--allocation-file', '{ratio_file}'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=clean_env(), timeout=20, check=False
    )
    assert result.stdout.strip() == "False", result.stderr


def test_pushed_names_in_prometheus_are_the_scraped_names(
    tmp_path: Path, scenario_file: Path, ratio_file: Path
) -> None:
    """What a push becomes once Prometheus ingests it (its OTLP translation:
    testkit/otlp_names.py) is, family for family and label for label, what a
    scrape serves: one dashboard and one set of alerts for both paths."""
    with running_rotel(tmp_path) as rotel:
        args = base_args(scenario_file, ratio_file, "--otlp-endpoint", rotel.grpc_url, "--otlp-interval", "0.5")
        with running_agent(*args, "--by-container", env=clean_env()) as agent:
            batch = rotel.wait_for_batches(2)[-1]
            exposition = agent.scrape()
            code, err = agent.stop()
    assert code == 0, err
    pushed = {
        prometheus_name(m.name, m.unit, m.data_type) + ("_count" if m.data_type == "Histogram" else ""): m
        for m in batch.metrics.values()
    }
    scraped = {
        name
        for name in exposition.values
        if name.startswith("vgpu_") and not name.endswith(("_bucket", "_sum", "_created"))
    }
    assert set(pushed) == scraped
    assert {
        "vgpu_pod_sm_utilization_ratio",
        "vgpu_pod_vgpu_utilization_ratio",
        "vgpu_gpu_sm_utilization_ratio",
    } <= scraped
    for name, metric in pushed.items():
        if metric.data_type == "Histogram":
            continue
        # rotel prints no attribute block for a point without attributes.
        pushed_labels = {frozenset(prometheus_label(k) for k in p.attributes) for p in metric.points} or {frozenset()}
        scraped_labels = {frozenset(label for label, _ in key) for key in exposition.series(name)}
        assert pushed_labels == scraped_labels, name


def test_the_translation_follows_prometheus() -> None:
    # Cases from prometheus/otlptranslator's own tests of the suffixing strategy.
    assert prometheus_name("system.filesystem.usage", "By", "Gauge") == "system_filesystem_usage_bytes"
    assert prometheus_name("http.server.request.duration", "s", "Histogram") == "http_server_request_duration_seconds"
    assert prometheus_name("system.cpu.utilization", "1", "Gauge") == "system_cpu_utilization_ratio"
    assert prometheus_name("foo.ratio", "1", "Gauge") == "foo_ratio"
    assert prometheus_name("requests", "{request}", "Sum") == "requests_total"
    assert prometheus_name("network.io", "By/s", "Gauge") == "network_io_bytes_per_second"
    assert prometheus_name("cpu.usage", "1", "Sum") == "cpu_usage_total"
    assert prometheus_label("k8s.node.name") == "k8s_node_name"


def test_the_lists_of_families_apply_to_the_push_as_to_the_scrape(
    tmp_path: Path, scenario_file: Path, ratio_file: Path
) -> None:
    # One allowlist, of a Prometheus name and a dotted OpenTelemetry name: the push and the
    # scrape carry those two of the agent's GPU and pod families, and nothing else of them.
    with running_rotel(tmp_path) as rotel:
        args = base_args(
            scenario_file,
            ratio_file,
            "--otlp-endpoint",
            rotel.http_url,
            "--otlp-protocol",
            "http/protobuf",
            "--otlp-interval",
            "0.5",
            "--metric-allowlist",
            r"vgpu_pod_memory_used_bytes,vgpu\.gpu\.memory\.total",
        )
        with running_agent(*args) as agent:
            batches = rotel.wait_for_batches(2)
            scraped = agent.scrape()
            agent.stop()
    pushed = {name for name in batches[-1].metrics if name.startswith(("vgpu.pod.", "vgpu.gpu."))}
    assert pushed == {"vgpu.pod.memory.used", "vgpu.gpu.memory.total"}
    served = {name for name in scraped.types if name.startswith(("vgpu_pod_", "vgpu_gpu_"))}
    assert served == {"vgpu_pod_memory_used_bytes", "vgpu_gpu_memory_total_bytes"}


def failed_exports(exposition: Exposition) -> float:
    return next(iter(exposition.series("vgpu_agent_export_failures_total").values()))


@contextmanager
def refusing_port() -> Iterator[str]:
    """The URL of a port bound and never listened on: every connection is refused, and no other
    process (a test session beside this one) can take the port meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_refused_push_says_why_once_not_at_every_push(scenario_file: Path, ratio_file: Path) -> None:
    with refusing_port() as url:
        args = base_args(scenario_file, ratio_file, "--otlp-endpoint", url, "--otlp-interval", "0.5")
        with running_agent(*args, "--log-format", "json", "--log-level", "WARN") as agent:
            wait_for(agent, lambda exposition: failed_exports(exposition) >= 4)
            code, err = agent.stop()
    assert code == 0, err
    lines = [json.loads(line) for line in err.splitlines()]
    assert {line["level"] for line in lines} <= {"warning", "error"}, lines  # WARN: nothing below
    said = [line for line in lines if line["logger"] == "otel_vgpu.export.otlp"]
    # Four pushes and more failed, each reason is said once: the gRPC status and its details.
    reasons = [line["reason"] for line in said]
    assert reasons and len(reasons) == len(set(reasons)), reasons
    refused = next(line for line in said if "Connection refused" in line["reason"])
    assert refused["reason"].startswith("gRPC UNAVAILABLE: ") and refused["endpoint"] == url
    assert refused["message"] == (
        f"OTLP export to {url} failed: {refused['reason']}; retrying every 0.5 s (each reason logged at most once "
        "a minute)"
    )


@contextmanager
def collector_answering(status: int) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server answering every POST with `status`: its URL, and the paths posted to."""
    posted: list[str] = []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            posted.append(self.path)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", posted
    finally:
        server.shutdown()
        server.server_close()


def test_a_push_answered_404_says_the_status_once(scenario_file: Path, ratio_file: Path) -> None:
    # The format and the level from their variables, in other cases than the flags'.
    env = clean_env(OTEL_VGPU_LOG_FORMAT="logfmt", OTEL_VGPU_LOG_LEVEL="Warning")
    with collector_answering(404) as (url, posted):
        args = base_args(scenario_file, ratio_file, "--otlp-endpoint", url, "--otlp-protocol", "http/protobuf")
        with running_agent(*args, "--otlp-interval", "0.2", env=env) as agent:
            wait_for(agent, lambda exposition: failed_exports(exposition) >= 5)
            code, err = agent.stop()
    assert code == 0, err
    assert len(posted) >= 5 and set(posted) == {"/v1/metrics"}
    lines = [parse_logfmt(line) for line in err.splitlines()]
    assert {line["level"] for line in lines} <= {"warning", "error"}, lines
    said = [line for line in lines if line["logger"] == "otel_vgpu.export.otlp"]
    assert len(said) == 1, said
    assert said[0]["reason"] == "HTTP 404 Not Found" and said[0]["endpoint"] == url
    assert said[0]["msg"].startswith(f"OTLP export to {url} failed: HTTP 404 Not Found; retrying every 0.2 s")


@contextmanager
def failing_endpoint(answer: str) -> Iterator[str]:
    """The URL of a port that refuses connections (`refused`), or of a server answering `answer`."""
    if answer == "refused":
        with refusing_port() as url:
            yield url
    else:
        with collector_answering(int(answer)) as (url, _):
            yield url


@pytest.mark.parametrize(
    ("answer", "reason"),
    [("refused", "ConnectionError: [Errno 111] Connection refused"), ("503", "HTTP 503 Service Unavailable")],
)
def test_the_http_exporter_says_why_its_retries_failed(answer: str, reason: str) -> None:
    # The HTTP client's last record says only "due to timeout, max retries or shutdown"; the
    # retries before it say why (export/otlp_failures.py), and that is the reason given.
    with failing_endpoint(answer) as url:
        settings = OtlpSettings(url, "http/protobuf", interval_s=2.5, timeout_s=2.5)
        assert export_or_reason(make_exporter(settings), MetricsData(resource_metrics=[]), 2500) == reason


@pytest.mark.unit
def test_each_reason_is_logged_when_new_then_at_most_once_a_minute() -> None:
    clock = Clock()
    reasons = LogLimit(clock=clock.monotonic)
    assert reasons.due("gRPC UNAVAILABLE") and reasons.due("HTTP 404 Not Found")
    clock.t += 59.9
    assert not reasons.due("gRPC UNAVAILABLE") and not reasons.due("HTTP 404 Not Found")
    assert reasons.due("gRPC DEADLINE_EXCEEDED")  # another reason is said at once
    clock.t += 0.1
    assert reasons.due("gRPC UNAVAILABLE") and not reasons.due("gRPC UNAVAILABLE")
