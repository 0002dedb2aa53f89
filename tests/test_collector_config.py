"""collector-config/: every file parses, and every pipeline names only components
its file defines and the contrib Collector has."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.agent import ROOT

CONFIGS = sorted((ROOT / "collector-config").glob("*/config.yaml"))
# Component types of otelcol-contrib that these files may use.
KNOWN = {
    "receivers": {"otlp", "prometheus"},
    "processors": {"memory_limiter", "batch", "transform"},
    "exporters": {"prometheusremotewrite", "otlp", "otlphttp", "debug"},
    "extensions": {"health_check"},
}


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), path
    return document


def test_the_three_configurations_exist_with_readmes() -> None:
    assert {path.parent.name for path in CONFIGS} == {"gateway", "scrape", "transform"}
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


def test_gateway_exports_to_remote_write_and_otlp() -> None:
    gateway = load(ROOT / "collector-config" / "gateway" / "config.yaml")
    assert set(gateway["service"]["pipelines"]["metrics"]["exporters"]) == {"prometheusremotewrite", "otlp"}
    assert set(gateway["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}


def test_scrape_keeps_the_agents_labels_and_discovers_pods() -> None:
    scrape = load(ROOT / "collector-config" / "scrape" / "config.yaml")
    job = scrape["receivers"]["prometheus"]["config"]["scrape_configs"][0]
    assert job["honor_labels"] is True
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]


def test_transform_copies_namespace_and_pod_into_semantic_conventions() -> None:
    transform = load(ROOT / "collector-config" / "transform" / "config.yaml")
    statements = " ".join(
        s
        for block in transform["processors"]["transform/k8s-semconv"]["metric_statements"]
        for s in block["statements"]
    )
    assert 'set(attributes["k8s.namespace.name"], attributes["namespace"])' in statements
    assert 'set(attributes["k8s.pod.name"], attributes["pod"])' in statements
    assert "transform/k8s-semconv" in transform["service"]["pipelines"]["metrics/otlp"]["processors"]
