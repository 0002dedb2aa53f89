"""The deployments of the semconv push run the agent with it: the chart's schema offers the
names the agent's --otlp-names takes and no other; the chart's semconv values and the
otlp-semconv overlay give the agent an environment its own parsing reads as the semconv push;
and the chart's clusterName is on every Resource that push sends, the node's and each pod's."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import yaml
from opentelemetry.sdk.metrics.export import Gauge, Metric, MetricsData, NumberDataPoint, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_vgpu.config import FLAGS, Config, ConfigError, parse_config
from otel_vgpu.export.otlp import OtlpSettings, settings_from
from otel_vgpu.export.semconv import translate
from otel_vgpu.export.telemetry import agent_resource
from otel_vgpu.flag_values import OTLP_NAMES, OTLP_SEMCONV
from testkit.helm import CHART, chart_daemonset, flavour_args
from testkit.manifests import POD_FIELDS, agent_container, container_environment

OVERLAY = "otlp-semconv"
"""kustomize/overlays/otlp-semconv, and the chart's ci/otlp-semconv-values.yaml that renders it."""
WORKLOAD = {"namespace": "ml", "pod": "trainer", "pod_uid": "7c1e2f90", "gpu_id": "0", "gpu_uuid": "GPU-1"}


def test_the_schema_offers_the_names_the_agent_takes_and_no_other() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["otlp"]["properties"]["names"]["enum"]
    (flag,) = [flag for flag in FLAGS if flag.name == "--otlp-names"]
    # The names the flag's parser takes (flag_values.py), as --help shows them.
    assert enum == list(OTLP_NAMES) and flag.metavar == "{" + ",".join(enum) + "}"
    assert [flag.from_text(name) for name in enum] == enum
    with pytest.raises(ConfigError, match="OTEL_VGPU_OTLP_NAMES: invalid OTLP names 'otel'"):
        flag.from_text("otel")
    # The chart's default is the agent's: no value set, the push the agent makes without the flag.
    assert yaml.safe_load((CHART / "values.yaml").read_text())["otlp"]["names"] == flag.default == Config().otlp_names


def _container(source: str, *args: str) -> dict[str, Any]:
    if source == "kustomize":
        return agent_container(OVERLAY)
    (container,) = chart_daemonset(*flavour_args(OVERLAY), *args)["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def _started(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Config, OtlpSettings | None]:
    """The agent's configuration and push settings from a rendered container, read as the agent
    reads them at its start (agent.py): its flags and environment, and the SDK's variables from
    the process's own environment, which is the container's alone."""
    env = container_environment(container)
    config = parse_config(container.get("args", []), env)
    for name in [name for name in os.environ if name.startswith("OTEL_") or name == "NODE_NAME"]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = settings_from(config.otlp_endpoint, config.otlp_protocol, config.otlp_interval, config.otlp_names)
    return config, settings


@pytest.mark.parametrize("source", ["chart", "kustomize"])
def test_the_semconv_deployments_start_the_agent_with_the_semconv_push(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, settings = _started(_container(source), monkeypatch)
    assert config.otlp_names == OTLP_SEMCONV and config.given["otlp_names"] == "OTEL_VGPU_OTLP_NAMES"
    assert settings is not None and settings.names == OTLP_SEMCONV, "a push, in the semantic conventions"
    assert config.node_name == POD_FIELDS["spec.nodeName"]


def test_the_environment_is_read_as_the_kubelet_makes_it() -> None:
    container = {
        "env": [
            {"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "B", "value": "$(A),$(C),$$(A),$(B)"},
            {"name": "C", "value": "c"},
        ]
    }
    assert container_environment(container) == {"A": "gpu-node-1", "B": "gpu-node-1,$(C),$(A),$(B)", "C": "c"}
    with pytest.raises(AssertionError, match="secretKeyRef"):
        container_environment({"env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]})


def test_the_cluster_name_is_on_every_resource_of_the_semconv_push(monkeypatch: pytest.MonkeyPatch) -> None:
    config, settings = _started(_container("chart", "--set", "clusterName=gpu-east"), monkeypatch)
    assert settings is not None and settings.names == OTLP_SEMCONV
    # One collection of a GPU's figure and a workload's, under the agent's resource, as the push translates it.
    gpu = {"gpu_id": "0", "gpu_uuid": "GPU-1", "gpu_model": "NVIDIA H100 80GB HBM3"}
    metrics = [
        Metric(name, "", unit, Gauge([NumberDataPoint(labels, None, 1_000, 5.0)]))  # type: ignore[arg-type]
        for name, unit, labels in (("vgpu.gpu.power", "W", gpu), ("vgpu.pod.memory.used", "By", WORKLOAD))
    ]
    scope = ScopeMetrics(InstrumentationScope("otel_vgpu"), metrics, "")
    collection = MetricsData([ResourceMetrics(agent_resource(config.node_name), [scope], "")])
    pushed = {
        resource_metrics.scope_metrics[0].metrics[0].name: dict(resource_metrics.resource.attributes)
        for resource_metrics in translate(collection, 1).resource_metrics
    }
    assert set(pushed) == {"hw.power", "vgpu.pod.gpu.memory.usage"}
    node, pod = pushed["hw.power"], pushed["vgpu.pod.gpu.memory.usage"]
    assert node["k8s.cluster.name"] == pod["k8s.cluster.name"] == "gpu-east"
    assert node["k8s.node.name"] == pod["k8s.node.name"] == POD_FIELDS["spec.nodeName"]
    # The node's Resource leaves the agent's own pod off; the workload's names the workload.
    assert "k8s.pod.uid" not in node and node["service.instance.id"] == POD_FIELDS["metadata.uid"]
    assert (pod["k8s.pod.uid"], pod["k8s.pod.name"], pod["k8s.namespace.name"]) == ("7c1e2f90", "trainer", "ml")
