"""The agent's own exposition against the upstream one, from the same collections.

Each collection is rendered twice: by `exposition.Renderer`, and by what the
agent used before, `opentelemetry-exporter-prometheus`'s reader translating
into `prometheus_client` families that `prometheus_client` writes. The bytes
must be equal, in the text format, in OpenMetrics, and under every escaping
scheme a scraper may ask for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_exposition
from prometheus_client.openmetrics import exposition as openmetrics

from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.export.exposition import TEXT, Format, Renderer, negotiate
from otel_vgpu.export.reader import ScrapeReader
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.promtext import parse

from ...conftest import make_sampler

pytestmark = pytest.mark.unit

ACCEPTS = [
    "",
    "*/*",
    "text/plain",
    "text/plain;version=0.0.4",
    "text/plain; version=1.0.0; escaping=allow-utf-8",
    "text/plain; version=1.0.0; escaping=underscores",
    "text/plain; version=1.0.0; escaping=dots",
    "text/plain; version=1.0.0; escaping=values",
    "text/plain; version=1.0.0; escaping=nonsense",
    "application/openmetrics-text",
    "application/openmetrics-text; version=1.0.0",
    "application/openmetrics-text; version=0.0.1",
    "application/openmetrics-text; version=2.0.0; escaping=allow-utf-8",
    "application/openmetrics-text; version=1.0.0; escaping=dots",
    # What Prometheus 2.x and 3.x send.
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "application/json, text/plain;version=0.0.4",
]

MIXED = """
node: node-a
gpus:
  - {memory: 80GiB}
  - {memory: 80GiB, mig: [{profile: 3g.40gb, memory: 40GiB}, {profile: 3g.40gb, memory: 40GiB}]}
pods:
  - name: trainer
    shares: {0: 2}
    processes:
      - {gpu: 0, memory: 2GiB, sm: 0.5, container: main}
      - {gpu: 0, memory: 1GiB, sm: 0.25, container: side}
  - name: tenant-a
    shares: {"1/0": 1}
    processes: [{gpu: 1, mig: 0, memory: 1GiB}]
host_processes:
  - {gpu: 0, memory: 512MiB, sm: 0.0}
"""


def upstream(data: MetricsData, fmt: Format) -> bytes:
    """What opentelemetry-exporter-prometheus and prometheus_client write for `data`."""
    registry = CollectorRegistry(auto_describe=False)
    reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    logging.getLogger("opentelemetry.sdk.metrics._internal.export").disabled = True
    try:
        reader._receive_metrics(data)  # the reader's own entry point for a collection
        if fmt.openmetrics:
            body: bytes = openmetrics.generate_latest(registry, escaping=fmt.escaping)  # type: ignore[no-untyped-call]
            return body
        return text_exposition.generate_latest(registry, escaping=fmt.escaping)
    finally:
        logging.getLogger("opentelemetry.sdk.metrics._internal.export").disabled = False


def collect(telemetry: Telemetry) -> MetricsData:
    with telemetry.scope.collection("scrape"):
        data = telemetry.reader.collect_data()
    assert data is not None
    return data


@pytest.fixture
def telemetry(tmp_path: Path, ratio_file: Path) -> Iterator[Telemetry]:
    node = SimulatedNode(parse_scenario(MIXED, "mixed.yaml"), tmp_path / "node")
    health = AgentHealth()
    # A container label on the pod families: more labels to order.
    sampler = make_sampler(node, ratio_file, health=health, by_container=True)
    telemetry = Telemetry(
        sampler,
        health,
        min_interval=0.0,
        node_name="node-a",
        seed_metrics=True,
    )
    yield telemetry
    telemetry.shutdown()


@pytest.mark.parametrize("accept", ACCEPTS)
def test_the_format_is_chosen_as_prometheus_client_chooses_it(accept: str) -> None:
    _, content_type = text_exposition.choose_encoder(accept)
    assert negotiate(accept).content_type == content_type
    assert negotiate(accept).openmetrics == content_type.startswith("application/openmetrics-text")


@pytest.mark.parametrize("accept", ACCEPTS)
def test_the_agents_families_render_as_the_exporter_renders_them(telemetry: Telemetry, accept: str) -> None:
    fmt = negotiate(accept)
    renderer = Renderer()
    for _ in range(3):  # the second and third render come from the remembered label texts
        data = collect(telemetry)
        assert renderer.render(data, fmt).encode() == upstream(data, fmt)


def test_edge_cases_render_as_the_exporter_renders_them() -> None:
    """Label values to escape, non-string attributes, a label only some series have, keys that
    sanitise to one label, units with annotations, a sum that may go down, names to sanitise."""
    reader = ScrapeReader()
    provider = MeterProvider(
        resource=Resource.create({"service.name": 'we"ird\\name', "k8s.node.name": "node\nA", "count": 3}),
        metric_readers=[reader],
    )
    meter = provider.get_meter("test")
    observations: list[Observation] = [
        Observation(1.5, {"a": 'quote"d', "b": "back\\slash"}),
        Observation(2, {"a": "new\nline"}),
        Observation(3e9, {"a": "big", "flag": True, "n": 7, "f": 0.5, "list": ("x", "y")}),
        Observation(float("-1e-7"), {"k.dot": "1", "k_dot": "2"}),
        Observation(123456789.0, {"9lives": "cat", "ünï": "code"}),
    ]

    def observe(options: CallbackOptions) -> list[Observation]:
        return observations

    meter.create_observable_gauge("weird.name-with/slash", [observe], unit="{thing}/s", description='say "hi"\\n')
    meter.create_observable_up_down_counter("queue.depth", [observe], unit="By", description="up\ndown")
    meter.create_observable_counter("requests_total", [observe], unit="1", description="")
    counter = meter.create_counter("plain.counter", unit="ms")
    counter.add(5, {"route": "/x"})
    histogram = meter.create_histogram("latency", unit="s", description="latency")
    for value in (0.001, 0.2, 3.0, 400.0):
        histogram.record(value, {"route": "/x"})
    histogram.record(1.0)
    renderer = Renderer()
    try:
        for accept in ACCEPTS:
            fmt = negotiate(accept)
            data = reader.collect_data()
            assert data is not None
            ours = renderer.render(data, fmt)
            assert ours.encode() == upstream(data, fmt), accept
            # What the cases are there for is in the output.
            assert 'quote\\"d' in ours and "new\\nline" in ours and 'flag="true"' in ours, accept
            assert ours.count("latency") >= 10 and "queue" in ours and "plain" in ours, accept
    finally:
        provider.shutdown()


def test_a_render_keeps_the_label_texts_of_live_series_only(telemetry: Telemetry) -> None:
    renderer = Renderer()
    renderer.render(collect(telemetry), TEXT)
    remembered: dict[Any, Any] = renderer._labels
    live = sum(len(texts) for texts in remembered.values())
    assert live > 0
    renderer.render(None, TEXT)
    assert renderer._labels == {}


def test_the_agents_scrape_is_the_process_metrics_then_the_exporters_families(telemetry: Telemetry) -> None:
    for accept in ("", "application/openmetrics-text; version=1.0.0"):
        fmt = negotiate(accept)
        body = telemetry.render(fmt).decode()
        exposition = parse(body)
        assert "process_resident_memory_bytes" in exposition.values
        assert "python_gc_objects_collected_total" in exposition.values or fmt.openmetrics
        assert exposition.series("vgpu_pod_memory_used_bytes")
        assert body.startswith("# HELP process_") or body.startswith("# HELP python_")
        assert body.count("# EOF") == (1 if fmt.openmetrics else 0)
        assert body.endswith("# EOF\n") == fmt.openmetrics


def test_target_info_texts_do_not_grow_with_the_versions_clients_name(telemetry: Telemetry) -> None:
    renderer = Renderer()
    data = collect(telemetry)
    for n in range(50):  # a client may put any version in Accept
        fmt = negotiate(f"application/openmetrics-text; version=1.{n}.0")
        assert renderer.render(data, fmt).encode() == upstream(data, fmt)
    assert len(renderer._target) == 1


def test_alternating_escapings_keep_each_ones_label_texts(telemetry: Telemetry) -> None:
    renderer = Renderer()
    data = collect(telemetry)
    dots = negotiate("text/plain; version=1.0.0; escaping=dots")
    renderer.render(data, TEXT)
    renderer.render(data, dots)
    escapings = {key[0] for key in renderer._labels}
    assert escapings == {TEXT.escaping, dots.escaping}, "one render does not drop the other escaping's texts"
    assert renderer.render(data, TEXT).encode() == upstream(data, TEXT)
