"""collector-config/: every file parses, every pipeline names only components
its file defines and the contrib Collector has under their current names, the
gateway's and the semantic conventions' pipelines do what their READMEs say,
and the Collector's ClusterRole grants what its k8s_attributes reads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.agent import ROOT
from testkit.manifests import validate_strictly
from testkit.yamldocs import documents

CONFIGS = sorted((ROOT / "collector-config").glob("*/config.yaml"))
SEMCONV = ROOT / "collector-config" / "semconv"
# Component types of otelcol-contrib v0.165 that these files may use.
KNOWN = {
    "receivers": {"otlp", "prometheus"},
    "processors": {"memory_limiter", "batch", "transform", "groupbyattrs", "k8s_attributes"},
    "exporters": {"prometheus_remote_write", "otlp_grpc", "otlp_http", "debug"},
    "extensions": {"health_check"},
}
# Deprecated names (collector-config/README.md says where each was read).
DEPRECATED = {
    "exporters": {"otlp": "otlp_grpc", "otlphttp": "otlp_http", "prometheusremotewrite": "prometheus_remote_write"},
    "processors": {"k8sattributes": "k8s_attributes"},
}
DEPRECATED_FIELDS = {
    "add_metric_suffixes": "translation_strategy",
    "resource_to_telemetry_conversion": "resource_constant_labels",
}
# The remote-write exporter's HTTP client settings at its top level, deprecated since v0.158.0
# for the same under `http` (exporter/prometheusremotewriteexporter/config.go's topLevelHTTPClientKeys).
TOP_LEVEL_HTTP = {"endpoint", "proxy_url", "tls", "headers", "auth", "compression", "compression_params"}


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), path
    return document


def test_the_configurations_exist_with_readmes() -> None:
    assert {path.parent.name for path in CONFIGS} == {"gateway", "scrape", "semconv"}
    for path in CONFIGS:
        assert (path.parent / "README.md").read_text().strip()


@pytest.mark.parametrize("path", CONFIGS, ids=[p.parent.name for p in CONFIGS])
def test_pipelines_reference_defined_components(path: Path) -> None:
    config = load(path)
    service = config["service"]
    for extension in service.get("extensions", []):
        assert extension in config.get("extensions", {}), f"{path}: extension {extension} is not defined"
    pipelines = service["pipelines"]
    assert pipelines, path
    for name, pipeline in pipelines.items():
        assert name.split("/", 1)[0] == "metrics", f"{path}: {name} is not a metrics pipeline"
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in (config.get(kind) or {}), f"{path}: {name} names undefined {kind[:-1]} {component}"
        processors = pipeline.get("processors", [])
        assert processors[0] == "memory_limiter", f"{path}: {name} must start with memory_limiter"
        assert "batch" in processors, f"{path}: {name} has no batch"
        assert pipeline["receivers"] and pipeline["exporters"]
    for kind, known in KNOWN.items():
        for component in config.get(kind) or {}:
            assert component.split("/", 1)[0] in known, f"{path}: unknown {kind[:-1]} type {component}"


@pytest.mark.parametrize("path", CONFIGS, ids=[p.parent.name for p in CONFIGS])
def test_environment_placeholders_use_the_collector_syntax(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"\$\{(?!env:)[^}]*\}", text), "use ${env:NAME}"
    assert not re.search(r"(?<!\$)\$[A-Z_]+\b", text)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.parent.name for p in CONFIGS])
def test_no_deprecated_component_or_field(path: Path) -> None:
    config = load(path)
    for kind, names in DEPRECATED.items():
        for component in config.get(kind) or {}:
            old = component.split("/", 1)[0]
            assert old not in names, f"{path}: {kind[:-1]} {old} is deprecated; use {names[old]}"
    for field, instead in DEPRECATED_FIELDS.items():
        assert field not in path.read_text(), f"{path}: {field} is deprecated; use {instead}"
    for component, settings in (config.get("exporters") or {}).items():
        if component.split("/", 1)[0] == "prometheus_remote_write":
            flat = TOP_LEVEL_HTTP & set(settings)
            assert not flat, f"{path}: {component}: put {sorted(flat)} under http (deprecated at the top level)"


def statements(config: dict[str, Any], processor: str) -> list[str]:
    return [s for block in config["processors"][processor]["metric_statements"] for s in block["statements"]]


def test_gateway_gives_prometheus_the_scrapes_names_and_node() -> None:
    gateway = load(ROOT / "collector-config" / "gateway" / "config.yaml")
    assert set(gateway["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    pipeline = gateway["service"]["pipelines"]["metrics/prometheus"]
    assert pipeline["exporters"] == ["prometheus_remote_write"]
    assert "transform/node" in pipeline["processors"]
    # The translation tests/system/test_otlp.py checks the scrape's names against.
    assert gateway["exporters"]["prometheus_remote_write"]["translation_strategy"] == "UnderscoreEscapingWithSuffixes"
    (node,) = statements(gateway, "transform/node")
    assert node.startswith('set(attributes["node"], resource.attributes["k8s.node.name"])')


def test_gateway_gives_otlp_back_ends_the_semantic_conventions() -> None:
    gateway = load(ROOT / "collector-config" / "gateway" / "config.yaml")
    pipeline = gateway["service"]["pipelines"]["metrics/otlp"]
    assert pipeline["exporters"] == ["otlp_grpc"]
    processors = pipeline["processors"]
    # Attributes copied, then moved onto a resource per pod, then enriched by UID.
    order = [processors.index(name) for name in ("transform/semconv", "groupbyattrs/pod", "k8s_attributes")]
    assert order == sorted(order), processors
    text = " ".join(statements(gateway, "transform/semconv"))
    for target, source in (("k8s.pod.uid", "pod_uid"), ("k8s.pod.name", "pod"), ("k8s.namespace.name", "namespace")):
        assert f'set(attributes["{target}"], attributes["{source}"])' in text
    assert set(gateway["processors"]["groupbyattrs/pod"]["keys"]) == {
        "k8s.pod.uid",
        "k8s.pod.name",
        "k8s.namespace.name",
    }
    association = gateway["processors"]["k8s_attributes"]["pod_association"][0]["sources"][0]
    assert association == {"from": "resource_attribute", "name": "k8s.pod.uid"}
    for old, new in (
        ("vgpu.gpu.memory.total", "hw.gpu.memory.limit"),
        ("vgpu.gpu.memory.used", "hw.gpu.memory.usage"),
        ("vgpu.gpu.sm.utilization", "hw.gpu.utilization"),
    ):
        assert f'set(name, "{new}") where name == "{old}"' in text
    assert 'set(attributes["hw.id"], attributes["gpu_uuid"])' in text


def test_scrape_keeps_the_agents_labels_and_discovers_pods() -> None:
    scrape = load(ROOT / "collector-config" / "scrape" / "config.yaml")
    job = scrape["receivers"]["prometheus"]["config"]["scrape_configs"][0]
    assert job["honor_labels"] is True
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]


def test_semconv_exports_the_agents_names_as_they_come_with_each_pods_workload() -> None:
    semconv = load(SEMCONV / "config.yaml")
    pipelines = semconv["service"]["pipelines"]
    assert {name: p["exporters"] for name, p in pipelines.items()} == {
        "metrics/prometheus": ["prometheus_remote_write"],
        "metrics/otlp": ["otlp_grpc"],
    }
    for pipeline in pipelines.values():
        # The agent pushes the conventions' names and a resource per pod: nothing renames or regroups.
        assert pipeline["processors"] == ["memory_limiter", "k8s_attributes", "batch"]
    k8s = semconv["processors"]["k8s_attributes"]
    # Resource attributes are all the processor reads: each pod's resource, by its UID.
    assert k8s["pod_association"] == [{"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]}]
    owners = {f"k8s.{kind}.name" for kind in ("deployment", "replicaset", "statefulset", "daemonset", "job", "cronjob")}
    assert owners <= set(k8s["extract"]["metadata"])
    (label,) = k8s["extract"]["labels"]
    # semantic-conventions v1.44.0 model/k8s/registry.yaml: k8s.pod.label.<key>, the key as it is.
    assert label == {"tag_name": f"k8s.pod.label.{label['key']}", "key": "app.kubernetes.io/name", "from": "pod"}
    remote_write = semconv["exporters"]["prometheus_remote_write"]
    # Without the pod's resource attributes as labels, two pods on one GPU would be one series.
    assert remote_write["resource_constant_labels"] == {"included": ["*"]}
    assert remote_write["translation_strategy"] == "UnderscoreEscapingWithSuffixes"


# What k8s_attributes reads, by what it extracts: its README's "Role-based access control"
# (pods and namespaces always; replicasets for the Deployment; nodes for the node's UID or
# labels; jobs for the CronJob's UID), and each workload whose own labels are extracted.
ALWAYS = {("", "pods"), ("", "namespaces")}
NEEDS = {
    "k8s.deployment.name": {("apps", "replicasets")},
    "k8s.deployment.uid": {("apps", "replicasets")},
    "k8s.node.uid": {("", "nodes")},
    "k8s.cronjob.uid": {("batch", "jobs")},
}
FROM = {
    "node": ("", "nodes"),
    "deployment": ("apps", "deployments"),
    "statefulset": ("apps", "statefulsets"),
    "daemonset": ("apps", "daemonsets"),
    "job": ("batch", "jobs"),
}


def needed(k8s_attributes: dict[str, Any]) -> set[tuple[str, str]]:
    extract = k8s_attributes.get("extract", {})
    found = set(ALWAYS)
    for name in extract.get("metadata", []):
        found |= NEEDS.get(name, set())
    for rule in [*extract.get("labels", []), *extract.get("annotations", [])]:
        if rule.get("from", "pod") in FROM:
            found.add(FROM[rule["from"]])
    return found


def granted(role: dict[str, Any]) -> set[tuple[str, str]]:
    out = set()
    for rule in role["rules"]:
        assert set(rule["verbs"]) == {"get", "list", "watch"}, rule
        out |= {(group, resource) for group in rule["apiGroups"] for resource in rule["resources"]}
    return out


def test_the_semconv_collector_is_granted_what_it_reads_and_no_more(tmp_path: Path) -> None:
    text = (SEMCONV / "rbac.yaml").read_text()
    validate_strictly(text, tmp_path / "rbac.yaml")
    objects = {doc["kind"]: doc for doc in documents(text)}
    assert granted(objects["ClusterRole"]) == needed(load(SEMCONV / "config.yaml")["processors"]["k8s_attributes"])
    account = objects["ServiceAccount"]["metadata"]
    assert objects["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    assert objects["ClusterRoleBinding"]["roleRef"]["name"] == objects["ClusterRole"]["metadata"]["name"]
    # The rule can fail: a node label to extract would need the nodes.
    widened = {"extract": {"metadata": ["k8s.deployment.name"], "labels": [{"key": "zone", "from": "node"}]}}
    assert ("", "nodes") in needed(widened) and ("", "nodes") not in granted(objects["ClusterRole"])
