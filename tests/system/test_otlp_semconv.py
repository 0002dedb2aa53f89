"""The OTLP push under OpenTelemetry's semantic conventions (--otlp-names semconv), received by a
real OTLP receiver (rotel) from the simulated node, a Hopper GPU with GPM and NVLink beside an
A100 without GPM, and checked point by point: the names, units, instruments, value types and
required attributes against the conventions' own YAML (tests/data/semconv/, v1.44.0); no
scrape label on any point; each pod's points under a Resource of the pod's; and each value the
scrape's of the same collection. The default push stays the agent's own names, as scraped."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.config import ConfigError, parse_config
from otel_vgpu.conventions import Kind
from otel_vgpu.export.agent_families import AGENT_FAMILIES
from otel_vgpu.export.families import FAMILIES, Feature
from otel_vgpu.export.figure_families import GPM_FAMILIES_OF
from otel_vgpu.export.otlp import OtlpPusher, OtlpSettings
from otel_vgpu.export.semconv import forms, translate
from otel_vgpu.gpu.device_figures import GPM_TABLE
from otel_vgpu.sim.device_figure_values import IDLE_PCIE_RX, IDLE_PCIE_TX
from testkit.agent import InProcessAgent, agent_in_process, clean_env, wait_until
from testkit.kept_exporter import KeptExporter
from testkit.otlp_names import prometheus_name
from testkit.promtext import Exposition
from testkit.rotel import DecodedMetric, DecodedResource, Receiver, running_rotel
from testkit.rotel_dump import DUMP_FILE, process_metrics
from testkit.semconv_model import metrics as conventions
from testkit.semconv_model import registry

HOPPER = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
AMPERE = "GPU-bbbbbbbb-1111-4111-8111-111111111111"
UNNAMED = "0e886e9a-3879-45f9-b44d-86ef9df03224"
# A Hopper GPU (GPM, NVLink) and an Ampere one (no GPM); pods of one and of two containers, and
# one the Kubernetes API does not know. Constant figures: a health read between a scrape and a
# push reads what the one before did.
SCENARIO = f"""
node: gpu-node-3
gpus:
  - {{model: NVIDIA H100 80GB HBM3, memory: 80GiB, uuid: {HOPPER}, nvlink: true, lacks: [encoder]}}
  - {{model: NVIDIA A100-SXM4-80GB, memory: 80GiB, uuid: {AMPERE}, lacks: [encoder]}}
pods:
  - namespace: ml
    name: trainer
    cgroup: {{version: 2, driver: systemd, runtime: containerd, qos: guaranteed}}
    shares: {{0: 2}}
    processes:
      - {{gpu: 0, memory: 10GiB, sm: 0.5, decoder: 0.1, jpeg: 0.05, tensor: 0.4, dram: 0.2, container: main}}
      - {{gpu: 0, memory: 2GiB, sm: 0.1, container: sidecar}}
  - namespace: web
    name: api
    cgroup: {{version: 1, driver: cgroupfs, runtime: docker, qos: burstable}}
    shares: {{1: 1}}
    processes:
      - {{gpu: 1, memory: 3GiB, sm: 0.2, decoder: 0.4, optical_flow: 0.1, container: server}}
  - namespace: web
    name: batch
    cgroup: {{version: 2, driver: systemd, runtime: crio, qos: burstable}}
    shares: {{1: 1}}
    processes:
      - {{gpu: 1, memory: 4GiB, sm: 0.25, container: worker}}
  - namespace: hidden
    name: unknown-to-directory
    uid: {UNNAMED}
    in_directory: false
    cgroup: {{version: 2, driver: cgroupfs, runtime: crio, qos: burstable}}
    processes:
      - {{gpu: 1, memory: 1GiB, sm: 0.05}}
"""
AGENT_POD = {"k8s.pod.uid": "agent-pod-uid", "k8s.pod.name": "otel-vgpu-x7k2p", "k8s.namespace.name": "monitoring"}
ADDED = {"k8s.cluster.name": "gpu-east", "deployment.environment.name": "test"}
SCRAPE_ONLY = {"pod", "namespace", "pod_uid", "container", "gpu_id", "gpu_uuid", "gpu_model"}

# What each name of the push that is no family's own is made from, as the design has it: by the
# name and the value of its fixed attribute, the scrape's family.
RENAMED: dict[tuple[str, str | None], str] = {
    ("hw.gpu.utilization", "general"): "vgpu_gpu_sm_utilization_ratio",
    **{
        ("hw.gpu.utilization", e): f"vgpu_gpu_{e}_utilization_ratio"
        for e in ("encoder", "decoder", "jpeg", "optical_flow")
    },
    ("hw.gpu.memory.usage", None): "vgpu_gpu_memory_used_bytes",
    ("hw.gpu.memory.limit", None): "vgpu_gpu_memory_total_bytes",
    ("hw.energy", None): "vgpu_gpu_energy_joules_total",
    ("hw.power", None): "vgpu_gpu_power_watts",
    ("hw.temperature", "gpu"): "vgpu_gpu_temperature_celsius",
    ("hw.temperature", "memory"): "vgpu_gpu_memory_temperature_celsius",
    ("hw.errors", "corrected"): "vgpu_gpu_ecc_corrected_total",
    ("hw.errors", "uncorrected"): "vgpu_gpu_ecc_uncorrected_total",
    ("vgpu.pod.gpu.memory.usage", None): "vgpu_pod_memory_used_bytes",
    ("vgpu.pod.gpu.memory.limit", None): "vgpu_pod_memory_allocated_bytes",
    ("vgpu.pod.gpu.memory.peak", None): "vgpu_pod_memory_peak_bytes",
    ("vgpu.pod.gpu.process.count", None): "vgpu_pod_processes",
    ("vgpu.pod.gpu.energy", None): "vgpu_pod_energy_joules_total",
    ("vgpu.pod.gpu.utilization", "general"): "vgpu_pod_sm_utilization_ratio",
    ("vgpu.pod.gpu.time", "general"): "vgpu_pod_sm_busy_seconds_total",
    **{
        ("vgpu.pod.gpu.utilization", e): f"vgpu_pod_{e}_utilization_ratio"
        for e in ("encoder", "decoder", "jpeg", "optical_flow")
    },
    **{
        ("vgpu.pod.gpu.time", e): f"vgpu_pod_{e}_busy_seconds_total"
        for e in ("encoder", "decoder", "jpeg", "optical_flow")
    },
}
# The attribute that tells the families of one name apart.
FIXED = ("hw.gpu.task", "hw.sensor_location", "error.type", "network.io.direction")
# The agent's own per-pod names (no convention has any): instrument, unit, integer values.
POD_FORMS = {
    "vgpu.pod.gpu.memory.usage": ("updowncounter", "By", True),
    "vgpu.pod.gpu.memory.limit": ("updowncounter", "By", True),
    "vgpu.pod.gpu.memory.peak": ("gauge", "By", True),
    "vgpu.pod.gpu.process.count": ("updowncounter", "{process}", True),
    "vgpu.pod.gpu.energy": ("counter", "J", False),
    "vgpu.pod.gpu.utilization": ("gauge", "1", False),
    "vgpu.pod.gpu.time": ("counter", "s", False),
}
# hw.gpu.task values beside the enum's, which its docs allow ("a custom value MAY be used").
CUSTOM_TASKS = {"jpeg", "optical_flow"}
# Values read anew at every collection, not from the sweep's snapshot.
PER_COLLECTION = {"vgpu.gpu.health.age"}


def instrument(metric: DecodedMetric) -> str:
    """The conventions' instrument a received metric is."""
    if metric.kind == "Sum":
        assert metric.temporality == "AGGREGATION_TEMPORALITY_CUMULATIVE", metric.name
        return "counter" if metric.monotonic else "updowncounter"
    return metric.kind.lower()


@dataclasses.dataclass(frozen=True)
class Pushed:
    """One point as received, with its metric and Resource."""

    metric: DecodedMetric
    resource: dict[str, str]
    attributes: dict[str, str]
    value: float
    integer: bool
    start: int
    time: int


def points(resources: list[DecodedResource]) -> list[Pushed]:
    return [
        Pushed(m, r.attributes, p.attributes, p.value, p.integer, p.start_time_unix_nano, p.time_unix_nano)
        for r in resources
        for m in r.metrics
        for p in m.points
    ]


@pytest.fixture
def node_files(tmp_path: Path) -> tuple[Path, Path]:
    scenario, ratio = tmp_path / "node.yaml", tmp_path / "gpu_allocation.txt"
    scenario.write_text(SCENARIO)
    ratio.write_text("2\n")
    return scenario, ratio


@pytest.fixture
def resource_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the manifests put there (the agent's own pod), and what an operator adds.
    attributes = {**AGENT_POD, **ADDED}
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", ",".join(f"{k}={v}" for k, v in attributes.items()))
    for name in ("OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


@dataclasses.dataclass
class Node:
    agent: InProcessAgent
    rotel: Receiver

    def windows_closed(self) -> None:
        """Back once a scrape has GPM's and the engines' figures (their windows closed) and the
        health figures (read now, not at the health reader's first round, 10 s after the start)."""
        wait_until(
            lambda: (
                self.agent.scrape().series("vgpu_gpu_pcie_transmit_bytes_per_second")
                and self.agent.scrape().series("vgpu_gpu_decoder_utilization_ratio")
            ),
            what="GPM and engine windows closed",
        )
        self.agent.agent.devices.refresh()
        # A scrape of the same sweep serves the body rendered for it: the next sweep's has them.
        wait_until(lambda: self.agent.scrape().series("vgpu_gpu_temperature_celsius"), what="health figures")

    def one_collection(self, per_pod: bool = True) -> tuple[Exposition, list[DecodedResource]]:
        """A scrape and a push of the same sweep's snapshot (pushed right after the scrape, again
        where a sweep came between), and what rotel received of that push: the node's Resource,
        and with `per_pod` each pod's."""
        sampler = self.agent.agent.sampler
        pusher = self.agent.agent.telemetry.pusher

        def attempt() -> tuple[Exposition, int] | None:
            exposition = self.agent.scrape()
            swept, pushed_after = sampler.sweeps, time.time_ns()
            pusher.push()
            return (exposition, pushed_after) if sampler.sweeps == swept else None

        exposition, after = wait_until(attempt, what="a push of the scrape's sweep")
        # One Resource for the node and, per_pod, one per pod (and container) the scrape has.
        pods = (
            set()
            if not per_pod
            else {
                (dict(k)["pod_uid"], dict(k).get("container")) for k in exposition.series("vgpu_pod_memory_used_bytes")
            }
        )

        def received() -> list[DecodedResource] | None:
            batch = [
                r for r in self.rotel.decoded() if any(p.time_unix_nano >= after for m in r.metrics for p in m.points)
            ]
            return batch if len(batch) == 1 + len(pods) else None

        return exposition, wait_until(received, what="rotel received the push")


@pytest.fixture
def node(
    request: pytest.FixtureRequest, tmp_path: Path, node_files: tuple[Path, Path], resource_env: None
) -> Iterator[Node]:
    scenario, ratio = node_files
    flags: tuple[str, ...] = request.param
    with running_rotel(tmp_path, dump=True) as rotel:
        args = [
            *("--simulate", str(scenario), "--allocation-file", str(ratio), "--node-name", "gpu-node-3"),
            # Sweeps only for a collection, one per second at most: a scrape and a push read one.
            *("--sweep-interval", "0", "--min-interval", "1"),
            *("--otlp-endpoint", rotel.grpc_url, "--otlp-interval", "3600", *flags),
        ]
        # GPM's and the engines' windows, and the energy counter's reads, a few tenths of a second apart.
        with agent_in_process(*args, env=clean_env(), engine_every_s=0.3, energy_every_s=0.3) as agent:
            yield Node(agent, rotel)


SEMCONV = ("--otlp-names", "semconv")


@pytest.mark.parametrize("node", [SEMCONV, (*SEMCONV, "--by-container")], indirect=True, ids=["by-pod", "by-container"])
def test_the_semconv_push_follows_the_conventions_and_carries_the_scrapes_values(node: Node) -> None:
    by_container = node.agent.agent.config.by_container
    node.windows_closed()
    exposition, resources = node.one_collection()
    received = points(resources)
    convention, attributes = conventions(), registry()
    node_resource = next(r.attributes for r in resources if "k8s.pod.uid" not in r.attributes)

    # The node's Resource: who the figures are from, what OTEL_RESOURCE_ATTRIBUTES adds, not the agent's pod.
    assert node_resource["service.name"] == "otel-vgpu" and node_resource["service.version"]
    assert (
        node_resource["service.instance.id"]
        == node_resource["k8s.node.name"]
        == node_resource["host.name"]
        == "gpu-node-3"
    )
    assert ADDED.items() <= node_resource.items()
    assert not set(AGENT_POD) & set(node_resource)

    for point in received:
        name, labels = point.metric.name, point.attributes
        # No scrape label on any point; every attribute namespaced.
        assert not SCRAPE_ONLY & set(labels) and all("." in key for key in labels), (name, labels)
        pod = "k8s.pod.uid" in point.resource
        # A pod's points, and only they, under a Resource of the pod's, over the node's.
        assert pod == name.startswith("vgpu.pod."), name
        if pod:
            assert node_resource.items() <= {k: v for k, v in point.resource.items() if k not in AGENT_POD}.items()
            assert set(labels) - {"hw.gpu.task"} == {"hw.id"}, (name, labels)
            if point.resource["k8s.pod.uid"] == UNNAMED:
                assert "k8s.pod.name" not in point.resource and "k8s.namespace.name" not in point.resource
            else:
                assert {"k8s.pod.uid", "k8s.pod.name", "k8s.namespace.name"} <= set(point.resource)
            has = {"k8s.container.name", "container.id"} & set(point.resource)
            assert len(has) == (1 if by_container else 0), point.resource
        if name.startswith("hw."):
            rules = convention[name]
            assert point.metric.unit == rules.unit and instrument(point.metric) == rules.instrument, name
            assert point.integer == (rules.value_type == "int"), name
            required = {a for a, level in rules.attributes.items() if level == "required"}
            assert required <= set(labels), (name, labels)
            assert set(labels) <= set(attributes) and all(k.startswith("hw.") or k in rules.attributes for k in labels)
            # Each enum's value one of its members; error.type's, one the GPU refinement names (below).
            for key, value in labels.items():
                members = attributes[key].members if key != "error.type" else ()
                assert not members or value in members or (key == "hw.gpu.task" and value in CUSTOM_TASKS), (key, value)
            assert labels["hw.type"] == "gpu" and labels["hw.vendor"] == "NVIDIA" and labels["hw.driver_version"]
            assert labels["hw.name"] in ("gpu0", "gpu1") and labels["hw.model"].startswith("NVIDIA ")
            if name == "hw.errors":
                assert labels["error.type"] in ("corrected", "uncorrected")  # the GPU refinement's
        if name in POD_FORMS:
            kind, unit, integer = POD_FORMS[name]
            assert (instrument(point.metric), point.metric.unit, point.integer) == (kind, unit, integer), name
        if instrument(point.metric) == "updowncounter":
            assert 0 < point.start <= point.time, name
        assert point.metric.description, name

    # Both GPUs, and every pod, the one the Kubernetes API does not know among them.
    assert {p.attributes.get("hw.id") for p in received} >= {HOPPER, AMPERE}
    assert UNNAMED in {p.resource.get("k8s.pod.uid") for p in received}

    # Each point is the scrape's of the same collection, the pods' matched by their Resource.
    families = {family.name: family for family in FAMILIES}
    matched: dict[str, int] = {}
    for point in received:
        name, labels = point.metric.name, point.attributes
        fixed = next((labels[key] for key in FIXED if key in labels), None)
        if (name, fixed) in RENAMED:
            scraped = RENAMED[(name, fixed)]
        elif name in families and "hw.id" in labels and name not in PER_COLLECTION:
            scraped = prometheus_name(name, point.metric.unit, point.metric.kind, point.metric.monotonic is not False)
        else:
            # The agent's own families, and the two names no family is: checked below. Any other
            # name, a form this table does not know, fails here rather than go unchecked.
            assert name in families or name in ("hw.gpu.io", "hw.gpu.memory.utilization"), (name, labels)
            continue
        wanted = {"gpu_uuid": labels["hw.id"]}
        wanted |= {
            key.removeprefix("vgpu.").replace(".", "_"): v for key, v in labels.items() if key.startswith("vgpu.")
        }
        if "k8s.pod.uid" in point.resource:
            wanted["pod_uid"] = point.resource["k8s.pod.uid"]
            wanted["container"] = point.resource.get("k8s.container.name") or point.resource.get("container.id", "")
        series = [
            (dict(k), v)
            for k, v in exposition.series(scraped).items()
            if wanted.items() <= {**{"container": ""}, **dict(k)}.items()
        ]
        assert len(series) == 1, (name, labels, point.resource, scraped)
        scrape_labels, scraped_value = series[0]
        expected = round(scraped_value) if point.integer else pytest.approx(scraped_value, rel=1e-12)
        assert point.value == expected, (name, labels)
        if "k8s.pod.name" in point.resource:
            assert (point.resource["k8s.pod.name"], point.resource["k8s.namespace.name"]) == (
                scrape_labels["pod"],
                scrape_labels["namespace"],
            )
        matched[scraped] = matched.get(scraped, 0) + 1
    # Every series of each family pushed is pushed, none twice.
    assert matched == {name: len(exposition.series(name)) for name in matched}
    assert set(RENAMED.values()) - {
        "vgpu_gpu_encoder_utilization_ratio",
        "vgpu_pod_encoder_utilization_ratio",
        "vgpu_pod_encoder_busy_seconds_total",
    } <= set(matched)

    # hw.gpu.memory.utilization: the fraction of memory used, each GPU's used over its total.
    used, total = (exposition.by(n, "gpu_uuid") for n in ("vgpu_gpu_memory_used_bytes", "vgpu_gpu_memory_total_bytes"))
    share = {p.attributes["hw.id"]: p.value for p in received if p.metric.name == "hw.gpu.memory.utilization"}
    assert share == pytest.approx({uuid: used[(uuid,)] / total[(uuid,)] for (uuid,) in used})

    # hw.gpu.io: the Hopper's PCIe bytes each way, GPM's rates over the same windows; none without GPM.
    io = {
        (p.attributes["hw.id"], p.attributes["network.io.direction"]): p.value
        for p in received
        if p.metric.name == "hw.gpu.io"
    }
    assert set(io) == {(HOPPER, "transmit"), (HOPPER, "receive")}
    assert io[(HOPPER, "transmit")] / io[(HOPPER, "receive")] == pytest.approx(IDLE_PCIE_TX / IDLE_PCIE_RX, rel=1e-3)
    nvlink = {f.name for figure in GPM_TABLE if figure.nvlink for f in GPM_FAMILIES_OF[figure.name]}
    assert {p.attributes["hw.id"] for p in received if p.metric.name in nvlink} == {HOPPER}
    # The scrape has neither the byte counters nor anything else of this push alone, and keeps the rates.
    only_pushed = {f.prometheus_name for f in FAMILIES if f.needs is Feature.SEMCONV}
    assert only_pushed and not only_pushed & set(exposition.values) and not only_pushed & set(exposition.types)
    assert exposition.series("vgpu_gpu_pcie_transmit_bytes_per_second")

    # The agent's own families under the node's Resource, their labels vgpu.* attributes.
    readers = [p for p in received if p.metric.name == "vgpu.agent.reader.success"]
    assert readers and all(set(p.attributes) == {"vgpu.reader"} and "k8s.pod.uid" not in p.resource for p in readers)
    assert not {p.metric.name for p in received} & {f.name for f in FAMILIES if f.needs is Feature.SEED_METRICS}

    # The bytes are counted on: a later collection, another window closed, has more of them.
    swept = node.agent.agent.sampler.sweeps
    wait_until(lambda: node.agent.scrape() and node.agent.agent.sampler.sweeps >= swept + 2, what="two more sweeps")
    _, later = node.one_collection()
    later_io = {
        (p.attributes["hw.id"], p.attributes["network.io.direction"]): p.value
        for p in points(later)
        if p.metric.name == "hw.gpu.io"
    }
    assert all(later_io[key] > value for key, value in io.items())


@pytest.mark.parametrize("node", [(), ("--otlp-names", "vgpu")], indirect=True, ids=["default", "vgpu"])
def test_the_default_push_is_the_agents_own_names_as_scraped(node: Node) -> None:
    node.windows_closed()
    exposition, resources = node.one_collection(per_pod=False)
    # One Resource, the node's as ever: the agent's pod in it, as OTEL_RESOURCE_ATTRIBUTES says.
    assert len(resources) == 1 and {**AGENT_POD, **ADDED}.items() <= resources[0].attributes.items()
    agents = {family.name for family in AGENT_FAMILIES}  # their values are read anew at each collection
    for metric in resources[0].metrics:
        if metric.kind == "Histogram":
            continue
        scraped = exposition.series(
            prometheus_name(metric.name, metric.unit, metric.kind, metric.monotonic is not False)
        )
        # Each point is a series of the scrape, label for label and value for value.
        pushed = {frozenset(p.attributes.items()): p.value for p in metric.points}
        assert set(pushed) == set(scraped), metric.name
        if metric.name not in PER_COLLECTION and metric.name not in agents:
            assert pushed == pytest.approx(scraped), metric.name
    names = {metric.name for metric in resources[0].metrics}
    assert all(name.startswith("vgpu.") for name in names)
    assert not {f.name for f in FAMILIES if f.needs is Feature.SEMCONV} & names


def one_gauge(resource: Resource, name: str, *labelled: dict[str, str]) -> MetricsData:
    gauge = Gauge([NumberDataPoint(labels, None, 1_000, 5.0) for labels in labelled])  # type: ignore[arg-type]
    metric = Metric(name, "", "By", gauge)
    return MetricsData([ResourceMetrics(resource, [ScopeMetrics(InstrumentationScope("otel_vgpu"), [metric], "")], "")])


@pytest.mark.parametrize("names", ["vgpu", "semconv"])
def test_the_pusher_translates_only_with_semconv(names: str) -> None:
    exporter = KeptExporter()
    settings = OtlpSettings(None, "grpc", 60.0, 10.0, names)
    pusher = OtlpPusher(
        exporter, settings, scope=contextlib.nullcontext, after_collect=lambda _: None, health=AgentHealth()
    )
    pod = {"namespace": "ml", "pod": "trainer", "pod_uid": "u-1", "gpu_id": "0", "gpu_uuid": "GPU-1"}
    data = one_gauge(Resource({"service.name": "otel-vgpu", **AGENT_POD}), "vgpu.pod.memory.used", pod)
    pusher._receive_metrics(data)
    (sent,) = exporter.batches
    if names == "vgpu":
        assert sent is data  # the very collection, byte for byte today's
        return
    (pushed,) = sent.resource_metrics
    assert dict(pushed.resource.attributes) == {
        "service.name": "otel-vgpu",
        "k8s.pod.uid": "u-1",
        "k8s.pod.name": "trainer",
        "k8s.namespace.name": "ml",
    }
    (metric,) = pushed.scope_metrics[0].metrics
    assert isinstance(metric.data, Sum) and not metric.data.is_monotonic
    assert metric.data.aggregation_temporality is AggregationTemporality.CUMULATIVE
    assert metric.name == "vgpu.pod.gpu.memory.usage" and metric.data.data_points[0].value == 5
    assert isinstance(metric.data.data_points[0].value, int)


def test_equal_resources_are_one_and_a_container_known_by_its_id_is_a_container_id() -> None:
    node = Resource({"service.name": "otel-vgpu"})
    cid = "0123456789abcdef" * 4
    labels = {"namespace": "", "pod": "u-9", "pod_uid": "u-9", "gpu_id": "1", "gpu_uuid": "GPU-2", "container": cid}
    first = one_gauge(node, "vgpu.pod.memory.used", labels)
    second = one_gauge(node, "vgpu.pod.memory.peak", labels, {**labels, "gpu_uuid": "GPU-3", "gpu_id": "2"})
    both = MetricsData([*first.resource_metrics, *second.resource_metrics])
    (pushed,) = translate(both, 1).resource_metrics
    # A pod the API did not name has its UID alone; its container, known by its runtime ID, that ID.
    assert dict(pushed.resource.attributes) == {"service.name": "otel-vgpu", "k8s.pod.uid": "u-9", "container.id": cid}
    (scope,) = pushed.scope_metrics
    assert [m.name for m in scope.metrics] == ["vgpu.pod.gpu.memory.usage", "vgpu.pod.gpu.memory.peak"]
    assert [dict(p.attributes or {}) for p in scope.metrics[1].data.data_points] == [
        {"hw.id": "GPU-2"},
        {"hw.id": "GPU-3"},
    ]


def test_the_declarations_are_the_conventions() -> None:
    convention = conventions()
    by_name: dict[str, list[Any]] = {}
    for family in FAMILIES:
        form = family.semconv
        if form is None:
            continue
        by_name.setdefault(form.name, []).append(form)
        # A counter comes from a counter; a gauge and an updowncounter from a gauge.
        assert (form.kind is Kind.COUNTER) == (family.instrument.value == "counter"), family.name
        if form.name.startswith("hw."):
            rules = convention[form.name]
            assert (form.unit, form.kind.value, form.integer) == (
                rules.unit,
                rules.instrument,
                rules.value_type == "int",
            )
            assert set(form.fixed) <= set(rules.attributes), form.name
    for name, declared in by_name.items():
        # One metric: one unit, instrument and description, and each family told apart.
        assert len({(f.unit, f.kind, f.description, f.integer) for f in declared}) == 1, name
        assert len({f.attributes for f in declared}) == len(declared), name
    kept = {family.name for family in FAMILIES if family.semconv is None}
    assert not kept & set(by_name), "a name of the push is one family's own and another's form"
    assert {form.name for form, _ in forms()} == {*by_name, "hw.gpu.memory.utilization"}
    assert {"hw.gpu.io", "hw.energy", "hw.power", "hw.temperature", "hw.errors", "hw.gpu.utilization"} <= set(by_name)
    # The memory's busy time is no fraction of memory used (OpenLIT's trap).
    assert next(f for f in FAMILIES if f.name == "vgpu.gpu.memory_copy.utilization").semconv is None


@pytest.mark.parametrize(("argv", "environ"), [(["--otlp-names", "otel"], {}), ([], {"OTEL_VGPU_OTLP_NAMES": "hw"})])
def test_a_bad_otlp_names_is_refused_naming_what_is_valid(
    capsys: pytest.CaptureFixture[str], argv: list[str], environ: dict[str, str]
) -> None:
    if argv:
        with pytest.raises(SystemExit) as stopped:
            parse_config(argv, environ)
        assert stopped.value.code == 2
        said = capsys.readouterr().err.strip()
        assert (
            len(said.splitlines()) == 1
            and "--otlp-names: invalid OTLP names 'otel': expected vgpu" in said
            and "or semconv" in said
        )
    else:
        with pytest.raises(
            ConfigError, match=r"^OTEL_VGPU_OTLP_NAMES: invalid OTLP names 'hw': expected vgpu .* or semconv"
        ):
            parse_config(argv, environ)
    assert parse_config([], {"OTEL_VGPU_OTLP_NAMES": "semconv"}).otlp_names == "semconv"
    assert parse_config([], {}).otlp_names == "vgpu"


def test_a_record_rotel_is_still_writing_is_read_once_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # rotel writes each ResourceMetrics it receives as a line while the test reads the file: a
    # last line without its '\n' yet is left for a later read, never parsed half written.
    dump = tmp_path / "rotel-received.jsonl"
    monkeypatch.setenv(DUMP_FILE, str(dump))
    attribute = SimpleNamespace(key="k8s.node.name", value=SimpleNamespace(value="gpu-node-3"))
    process_metrics(SimpleNamespace(resource=SimpleNamespace(attributes=[attribute]), scope_metrics=[]))
    line = dump.read_bytes()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    receiver = Receiver("", "", tmp_path / "rotel.log", dump)
    with dump.open("ab") as out:
        out.write(line[: len(line) // 2])
    assert [r.attributes for r in receiver.decoded()] == [{"k8s.node.name": "gpu-node-3"}]
    with dump.open("ab") as out:
        out.write(line[len(line) // 2 :])
    assert len(receiver.decoded()) == 2
