"""The Helm chart, with the real helm: it lints, renders what kustomize renders,
refuses bad values with a message that names them, asks the cluster for the
custom kinds it renders, and upgrades without touching the DaemonSet's selector."""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_vgpu.config import ConfigError, parse_config
from otel_vgpu.export.telemetry import agent_resource
from testkit.agent import ROOT
from testkit.helm import (
    CHART,
    CUSTOM_KINDS,
    FLAVOURS,
    NAMESPACE,
    RELEASE,
    WITHOUT_OPERATOR,
    chart_daemonset,
    flavour_args,
    helm,
    install_notes,
    notes_scrape_job,
    packaged,
    template,
)
from testkit.helm import values_file as ci_values
from testkit.manifests import OVERLAYS, POD_FIELDS, container_environment, render, validate_strictly
from testkit.scripts import load as load_script
from testkit.yamldocs import documents

# Helm's standard labels, which kustomize's objects do not carry, and kustomize's
# part-of, which the chart's selectors leave out (they name the release instead).
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
}
PART_OF = "app.kubernetes.io/part-of"
NAME = "app.kubernetes.io/name"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "SecurityContextConstraints"}
# kustomize's configMapGenerator appends a hash of the content to the name.
GENERATED = re.compile(r"^(otel-vgpu-allocation|otel-vgpu-collector)-[a-z0-9]{10}$")


def _labels(labels: dict[str, str], drop: set[str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k not in drop}


def _walk(node: Any) -> Any:
    """Label maps inside specs (selectors, pod templates) without Helm's and
    kustomize's bookkeeping; generated ConfigMap names without their hash."""
    if isinstance(node, list):
        return [_walk(item) for item in node]
    if isinstance(node, str):
        match = GENERATED.match(node)
        return match.group(1) if match else node
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        kept = value
        is_label_map = isinstance(value, dict) and value and all(isinstance(v, str) for v in value.values())
        if key in ("matchLabels", "labels", "selector") and is_label_map:
            kept = _labels(value, HELM_LABELS | {PART_OF})
        if key == "annotations" and isinstance(value, dict):
            # The chart's checksum annotations roll the pods where kustomize's hashed names do.
            kept = {k: v for k, v in value.items() if not k.startswith("checksum/")}
            if not kept:
                continue
        out[key] = _walk(kept)
    return out


def normalise(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    meta = doc["metadata"]
    # Every object's own labels: what is left once the standard ones go (release, Pod Security, ...).
    labels = _labels(meta.pop("labels", {}), HELM_LABELS | {PART_OF, NAME})
    if labels:
        meta["labels"] = labels
    if doc["kind"] in CLUSTER_SCOPED:
        meta.pop("namespace", None)  # kustomize sets it on kinds it does not know to be cluster-scoped
    spec = doc.get("spec")
    result: dict[str, Any] = _walk({k: v for k, v in doc.items() if k not in ("metadata", "spec")})
    result["metadata"] = _walk(meta)
    if spec is not None:
        result["spec"] = _walk(spec)
    return result


def by_object(rendered: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for document in rendered:
        normal = normalise(document)
        out[(normal["kind"], normal["metadata"]["name"])] = normal
    return out


def kustomize_target(flavour: str) -> str:
    return "base" if flavour == "defaults" else flavour


def cluster_of(kustomized: list[dict[str, Any]]) -> tuple[str, ...]:
    """The API of the cluster a kustomize target is for: the Prometheus Operator's where it ships
    a monitor; none of its kinds where it ships none (kustomize asks no cluster: its base is the
    chart's defaults where the operator is not)."""
    return CUSTOM_KINDS if any(d["kind"] == "PodMonitor" for d in kustomized) else WITHOUT_OPERATOR


def test_every_overlay_has_its_values_file() -> None:
    assert FLAVOURS == OVERLAYS


@pytest.mark.parametrize("flavour", ["defaults", *FLAVOURS])
def test_chart_renders_what_kustomize_renders(flavour: str) -> None:
    # The namespace is Helm's to create (--create-namespace); rendered, it must say what kustomize's says.
    kinds = cluster_of(render(kustomize_target(flavour)))
    chart = by_object(documents(template(*flavour_args(flavour), "--set", "namespace.create=true", kinds=kinds)))
    kustomized = by_object(render(kustomize_target(flavour)))
    assert sorted(chart) == sorted(kustomized)
    for key, expected in kustomized.items():
        if chart[key] != expected:
            diff = difflib.unified_diff(
                yaml.safe_dump(expected).splitlines(), yaml.safe_dump(chart[key]).splitlines(), "kustomize", "chart"
            )
            pytest.fail(f"{key}:\n" + "\n".join(diff))


def test_the_comparison_sees_a_change_to_either_side() -> None:
    base = by_object(render("base"))
    plain = WITHOUT_OPERATOR
    chart = by_object(documents(template("--set", "namespace.create=true", kinds=plain)))
    assert chart == base
    changed = by_object(
        documents(template("--set", "namespace.create=true", "--set", "resources.limits.memory=256Mi", kinds=plain))
    )
    assert changed != base
    assert by_object(documents(template("--set", "namespace.create=true", "--set", "ratio=2", kinds=plain))) != base
    # The same defaults where the operator's API is: its objects, and no annotations.
    assert by_object(documents(template("--set", "namespace.create=true"))) != base


def test_defaults_leave_the_namespace_to_helm() -> None:
    assert [d for d in documents(template()) if d["kind"] == "Namespace"] == []
    (namespace,) = [d for d in documents(template("--set", "namespace.create=true")) if d["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == NAMESPACE
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


@pytest.mark.parametrize("flavour", ["defaults", *FLAVOURS])
def test_lints_strictly(flavour: str) -> None:
    # helm lint has no cluster and no --api-versions: the custom kinds are taken as given.
    result = helm("lint", "--strict", CHART, *flavour_args(flavour), "--set", "checkApiVersions=false")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


# Values no flavour file sets, each rendered and validated too.
EXTRA_RENDERS = {
    "service-monitor": ("--set", "prometheus.monitor.enabled=true", "--set", "prometheus.rules.enabled=true"),
    "mutual-tls-and-auth-apart": (
        "--set", "tls.enabled=true", "--set", "tls.clientCA=true",
        "--set", "basicAuth.enabled=true", "--set", "basicAuth.secretName=otel-vgpu-users",
        "--set", "prometheus.podMonitor.enabled=true", "--set", "tls.scraperSecretName=prometheus-client",
        "--set", "basicAuth.scraperSecretName=prometheus-scraper",
    ),
    "basic-auth-alone": (
        "--set", "basicAuth.enabled=true", "--set", "basicAuth.secretName=otel-vgpu-users",
        "--set", "basicAuth.scraperSecretName=prometheus-scraper",
    ),
    "the-keys-from-other-charts": (
        "--set", "nameOverride=gpu-usage", "--set", "commonLabels.team=platform", "--set", "revisionHistoryLimit=3",
        "--set", "dnsPolicy=ClusterFirstWithHostNet", "--set", "daemonsetAnnotations.a=b",
        "--set", "containerSecurityContext.seLinuxOptions.type=spc_t", "--set", "livenessProbe.periodSeconds=60",
        "--set", "env.X.valueFrom.secretKeyRef.name=s", "--set", "env.X.valueFrom.secretKeyRef.key=k",
        "--set", "global.imageRegistry=mirror.example.com", "--set", "global.imagePullSecrets={mirror}",
        "--set", "otlp.collector.enabled=true", "--set", "otlp.collector.minAvailable=1",
        "--set", "otlp.collector.replicas=3",
    ),
    "every-option": (
        "--set", "nodes.presets={eks,aks,gke,hami}", "--set", "gpuOperator.clientLabel=true",
        "--set", "runtime.deviceListVolumeMount=true", "--set", "kubelet.rootDir=/var/lib/k0s/kubelet",
        "--set", "ratio=4", "--set", "seedMetrics=true", "--set", "otlp.endpoint=http://collector.observability:4317",
        "--set", "image.digest=sha256:" + "ab" * 32, "--set", "imagePullSecrets[0].name=regcred",
        "--set", "extraArgs={--by-container}", "--set", "env.OTEL_VGPU_LOG_LEVEL=debug",
        "--set", "podAnnotations.example\\.com/team=gpu", "--set", "podLabels.team=gpu",
        "--set", "priorityClassName=", "--set", "service.clusterIP=", "--set", "service.internalTrafficPolicy=Local",
        "--set", "service.port=9400", "--set", "nodeSelector.pool=gpu", "--set", "namespace.create=true",
        "--set", "fullnameOverride=gpu-usage", "--set", "serviceAccount.annotations.example\\.com/role=reader",
        "--set-json", 'initContainers=[{"name":"wait","image":"busybox:1.37","command":["true"]}]',
        "--set-json", 'extraVolumes=[{"name":"extra","emptyDir":{}}]',
        "--set-json", 'extraVolumeMounts=[{"name":"extra","mountPath":"/extra","readOnly":true}]',
        "--set-json",
        'prometheus.podMonitor.metricRelabelings=[{"action":"drop","regex":"process_.*","sourceLabels":["__name__"]}]',
        "--set-json", 'prometheus.podMonitor.relabelings=[{"targetLabel":"cluster","replacement":"east"}]',
        "--set", "prometheus.podMonitor.enabled=true", "--set", "prometheus.podMonitor.additionalLabels.team=gpu",
        "--set", "prometheus.release=",
    ),
    "all-nodes": ("--set", "nodes.all=true"),
    "every-scrape-switch-on": (
        "--set", "prometheus.monitor.enabled=true", "--set", "prometheus.rules.enabled=true",
        "--set", "prometheus.scrapeAnnotations=true", "--set", "grafana.dashboard.enabled=true",
        "--set", "grafana.dashboard.folder=GPU", "--set", "grafana.dashboard.namespace=monitoring",
        "--set", "grafana.dashboard.label=dashboards", "--set-string", "grafana.dashboard.labelValue=otel",
        "--set", "tls.enabled=true",
    ),
}  # fmt: skip


@pytest.mark.parametrize("flavour", ["defaults", *FLAVOURS, *EXTRA_RENDERS])
def test_every_render_validates_strictly(flavour: str, tmp_path: Path) -> None:
    if flavour in EXTRA_RENDERS:
        text = template(*EXTRA_RENDERS[flavour])
    else:  # on the cluster its overlay is for
        text = template(*flavour_args(flavour), kinds=cluster_of(render(kustomize_target(flavour))))
    validate_strictly(text, tmp_path / f"{flavour}.yaml")


def test_the_values_each_render_does_what_it_says() -> None:
    ds = chart_daemonset(*EXTRA_RENDERS["every-option"])
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert ds["metadata"]["name"] == "gpu-usage"
    assert container["image"] == "ghcr.io/otel-vgpu/otel-vgpu@sha256:" + "ab" * 32
    assert container["args"][-1] == "--by-container" and "--port=9400" in container["args"]
    assert container["ports"][0]["containerPort"] == 9400
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OTEL_VGPU_LOG_LEVEL"] == "debug" and env["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://collector.")
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.client": "true", "pool": "gpu"}
    assert "priorityClassName" not in pod and pod["initContainers"][0]["name"] == "wait"
    request = {"name": "nvidia-device-request", "mountPath": "/var/run/nvidia-container-devices/all", "readOnly": True}
    assert request in container["volumeMounts"]
    k0s = {"path": "/var/lib/k0s/kubelet/pod-resources", "type": "DirectoryOrCreate"}
    assert {"name": "pod-resources", "hostPath": k0s} in pod["volumes"]
    rendered = documents(template(*EXTRA_RENDERS["every-option"]))
    (monitor,) = [d for d in rendered if d["kind"] == "PodMonitor"]
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["relabelings"][-1]["targetLabel"] == "cluster", "the user's after the chart's own"
    assert endpoint["relabelings"][1] == {"action": "labeldrop", "regex": "namespace|pod|container"}
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    assert "release" not in monitor["metadata"]["labels"] and monitor["metadata"]["labels"]["team"] == "gpu"
    (service,) = [d for d in rendered if d["kind"] == "Service"]
    assert service["spec"]["internalTrafficPolicy"] == "Local" and "clusterIP" not in service["spec"]
    (configmap,) = [d for d in rendered if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-allocation")]
    assert [line for line in configmap["data"]["gpu_allocation.txt"].splitlines() if not line.startswith("#")] == ["4"]
    # mutual TLS, and basic auth from a Secret of its own
    apart = chart_daemonset(*EXTRA_RENDERS["mutual-tls-and-auth-apart"])
    (container,) = apart["spec"]["template"]["spec"]["containers"]
    assert "--tls-client-ca-file=/etc/otel-vgpu-tls/ca.crt" in container["args"]
    assert "--basic-auth-file=/etc/otel-vgpu-auth/users" in container["args"]
    volumes = apart["spec"]["template"]["spec"]["volumes"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in volumes if "secret" in v}
    assert secrets == {"tls": "otel-vgpu-tls", "basic-auth": "otel-vgpu-users"}
    apart_rendered = documents(template(*EXTRA_RENDERS["mutual-tls-and-auth-apart"]))
    (monitor,) = [d for d in apart_rendered if d["kind"] == "PodMonitor"]
    assert monitor["spec"]["podMetricsEndpoints"][0]["scheme"] == "https"
    assert "affinity" not in chart_daemonset(*EXTRA_RENDERS["all-nodes"])["spec"]["template"]["spec"]


def test_the_lists_of_families_become_the_agents_flags_and_both_at_once_are_refused() -> None:
    def args(*values: str) -> list[str]:
        (container,) = chart_daemonset(*values)["spec"]["template"]["spec"]["containers"]
        return [a for a in container["args"] if a.startswith("--metric-")]

    assert args() == []
    assert args("--set-json", 'metricAllowlist=["vgpu_pod_.*","vgpu_gpu_memory_.*"]') == [
        "--metric-allowlist=vgpu_pod_.*,vgpu_gpu_memory_.*"
    ]
    engines = "vgpu_(pod|gpu)_(memory_copy|encoder|decoder|jpeg|optical_flow)_.*"
    assert args("--set-json", f'metricDenylist=["{engines}"]') == [f"--metric-denylist={engines}"]
    both = helm("template", RELEASE, CHART, "--set", "metricAllowlist={a}", "--set", "metricDenylist={b}")
    assert both.returncode != 0 and "metricAllowlist and metricDenylist are mutually exclusive" in both.stderr


# Bad values: refused by the schema at lint, template and install, with the value's path and what is valid.
BAD_VALUES = [
    (("--set", "ratio=1.5"), "at '/ratio'", "^(auto|[1-9][0-9]*)$"),
    (("--set", "ratio=0"), "at '/ratio'", "want 1"),
    (("--set-string", "ratio=two"), "at '/ratio'", "^(auto|[1-9][0-9]*)$"),
    (("--set", "runtime.mode=nvidia"), "at '/runtime/mode'", "'runtimeClass', 'default', 'nri', 'gke'"),
    (("--set", "nodes.presets={eks,azure}"), "at '/nodes/presets/1'", "'eks', 'aks', 'gke', 'hami'"),
    (("--set", "imagee.tag=1"), "at ''", "'imagee' not allowed"),
    (("--set", "image.tagg=1"), "at '/image'", "'tagg' not allowed"),
    (("--set", "prometheus.podMonitor.intervall=30s"), "at '/prometheus/podMonitor'", "'intervall' not allowed"),
    (("--set", "service.internalTrafficPolicy=Nearest"), "at '/service/internalTrafficPolicy'", "'Cluster', 'Local'"),
    (("--set", "kubelet.rootDir=var/lib/kubelet"), "at '/kubelet/rootDir'", "'^/'"),
    (("--set", "otlp.names=otel"), "at '/otlp/names'", "'vgpu', 'semconv'"),
    # A comma or an equals sign would be another attribute in OTEL_RESOURCE_ATTRIBUTES.
    (("--set", "clusterName=east\\,k8s.pod.name=x"), "at '/clusterName'", "'^([A-Za-z0-9][A-Za-z0-9._-]*)?$'"),
    (("--set-json", 'metricDenylist=["a,b"]'), "at '/metricDenylist/0'", "'^[^,]+$'"),
    # A version, as dcgm-exporter numbers its releases; its image tag or a `v` is no version.
    (
        ("--set-string", "prometheus.rules.dcgmExporterNames=v4.10"),
        "at '/prometheus/rules/dcgmExporterNames'",
        "does not match pattern '^$|^(0|[1-9][0-9]*)",
    ),
    (
        ("--set-string", "prometheus.rules.dcgmExporterNames=4.5.3-4.8.2"),
        "at '/prometheus/rules/dcgmExporterNames'",
        "does not match pattern",
    ),
    # auto, true or false, booleans or their words; nothing else.
    (("--set", "prometheus.monitor.enabled=yes"), "at '/prometheus/monitor/enabled'", "'auto', true, false"),
    (("--set", "grafana.dashboard.enabled=always"), "at '/grafana/dashboard/enabled'", "'auto', true, false"),
    (("--set", "prometheus.scrapeAnnotations=on"), "at '/prometheus/scrapeAnnotations'", "'auto', true, false"),
]


def refusal(command: str, args: tuple[str, ...]) -> str:
    if command == "lint":
        result = helm("lint", CHART, *args)
    elif command == "template":
        result = helm("template", RELEASE, CHART, *args)
    else:
        result = helm("install", RELEASE, CHART, "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert result.returncode != 0, f"helm {command} accepted {args}"
    return result.stdout + result.stderr


@pytest.mark.parametrize("command", ["lint", "template", "install"])
@pytest.mark.parametrize(("args", "where", "valid"), BAD_VALUES, ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_bad_values_are_refused_naming_the_value_and_what_is_valid(
    command: str, args: tuple[str, ...], where: str, valid: str
) -> None:
    message = refusal(command, args)
    assert where in message and valid in message, message


def test_free_form_maps_stay_free_and_good_values_pass() -> None:
    result = helm(
        "template", RELEASE, CHART,
        "--set-string", "podAnnotations.anything\\.example/x=1", "--set", "podLabels.any=thing",
        "--set", "nodeSelector.any=thing", "--set", "env.ANY=thing", "--set", "ratio=12", "--set-string", "ratio=3",
        "--set-json", 'affinity={"podAntiAffinity":{}}', "--set-json", 'resources={"requests":{"cpu":"1"}}',
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_the_schema_knows_every_value_and_no_other() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    # Maps the user fills (labels, annotations, resources, ...) are values, not the chart's keys.
    free = {"resources", "updateStrategy", "nodeSelector", "affinity", "env", "global"}
    free |= {"containerSecurityContext", "livenessProbe", "readinessProbe"}
    free |= {f"otlp.collector.{k}" for k in ("resources", "nodeSelector", "affinity")}
    # And the Prometheus Operator's own types, which the schema checks apart.
    free |= {
        f"prometheus.{m}.{k}" for m in ("monitor", "podMonitor") for k in ("tlsConfig", "basicAuth", "authorization")
    }

    def keys(node: dict[str, Any], prefix: str = "") -> set[str]:
        found = set()
        for key, value in node.items():
            found.add(prefix + key)
            owned = prefix + key not in free and not key.lower().endswith(("labels", "annotations"))
            if isinstance(value, dict) and value and owned:
                found |= keys(value, f"{prefix}{key}.")
        return found

    def schema_keys(node: dict[str, Any], prefix: str = "") -> set[str]:
        found = set()
        for key, sub in node.get("properties", {}).items():
            found.add(prefix + key)
            if sub.get("additionalProperties") is False and prefix + key not in free:
                found |= schema_keys(sub, f"{prefix}{key}.")
        return found

    assert schema.get("additionalProperties") is False
    # global: Helm's own, for a parent chart, open to its other keys.
    assert keys(values) == schema_keys(schema)


# The custom kinds: rendered only when asked, and then only where the API has the exact kind.
MONITORS = [
    ("prometheus.podMonitor.enabled", "monitoring.coreos.com/v1/PodMonitor", "PodMonitor"),
    ("prometheus.monitor.enabled", "monitoring.coreos.com/v1/ServiceMonitor", "ServiceMonitor"),
    ("prometheus.rules.enabled", "monitoring.coreos.com/v1/PrometheusRule", "PrometheusRule"),
    ("openshift.scc", "security.openshift.io/v1/SecurityContextConstraints", "SecurityContextConstraints"),
]


HELM_HINT = "Use --debug flag to render out invalid YAML"


def test_custom_kinds_render_only_where_asked_or_where_the_api_has_them() -> None:
    # auto asks the API: none of the operator's kinds where it lacks them, and never the SCC unasked.
    assert not {d["kind"] for d in documents(template(kinds=WITHOUT_OPERATOR))} & {kind for _, _, kind in MONITORS}
    assert {d["kind"] for d in documents(template())} & {kind for _, _, kind in MONITORS} == {
        "ServiceMonitor",
        "PrometheusRule",
    }


@pytest.mark.parametrize(("value", "api", "kind"), MONITORS, ids=[m[2] for m in MONITORS])
def test_a_custom_kind_missing_from_the_api_fails_in_one_line(value: str, api: str, kind: str) -> None:
    group = api.rsplit("/", 1)[0]
    for command in ("template", "install"):
        head: list[str | Path] = ["template", RELEASE, CHART]
        if command == "install":
            head = ["install", RELEASE, CHART, "--namespace", NAMESPACE, "--dry-run=client"]
        # No such API at all; for template, which can be told what the API lists, also the
        # group with other kinds only. (install asks the cluster; --dry-run=client lists none.)
        missing: list[tuple[str, ...]] = [()]
        if command == "template":
            missing += [("--api-versions", group), ("--api-versions", f"{group}/SomethingElse")]
        for listed in missing:
            result = helm(*head, "--set", f"{value}=true", *listed)
            assert result.returncode != 0, (command, listed)
            # One line of the chart's; helm template adds its own hint after it.
            (line,) = [line for line in result.stderr.splitlines() if line.strip() and line != HELM_HINT]
            assert line.startswith("Error: ") and f"{value} is on, but the cluster's API has no {api}" in line, line
        # the exact kind listed, or the check turned off for an offline render
        present: list[tuple[str, ...]] = [("--set", "checkApiVersions=false")]
        if command == "template":
            present.append(("--api-versions", api))
        for offline in present:
            result = helm(*head, "--set", f"{value}=true", *offline)
            assert result.returncode == 0, result.stderr
            assert f"kind: {kind}\n" in result.stdout


# How Prometheus finds the agents: the operator's objects where its API is, annotations where not.
OPERATOR_OBJECTS = {("ServiceMonitor", RELEASE), ("PrometheusRule", RELEASE), ("ConfigMap", f"{RELEASE}-dashboard")}
SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": "8080",
    "prometheus.io/path": "/metrics",
    "prometheus.io/scheme": "http",
}
SWITCHES: tuple[str, ...] = (
    "prometheus.monitor.enabled",
    "prometheus.rules.enabled",
    "prometheus.scrapeAnnotations",
    "grafana.dashboard.enabled",
)


def _objects(*args: str, kinds: tuple[str, ...] = CUSTOM_KINDS) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(template(*args, kinds=kinds))}


def _scrape_annotations(*args: str, kinds: tuple[str, ...] = CUSTOM_KINDS) -> dict[str, str]:
    annotations = chart_daemonset(*args, kinds=kinds)["spec"]["template"]["metadata"]["annotations"]
    return {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")}


def test_a_default_install_where_the_operator_is_has_its_monitor_rules_and_dashboard() -> None:
    objects = _objects()
    assert objects.keys() >= OPERATOR_OBJECTS
    assert not [key for key in objects if key[0] == "PodMonitor"], "one monitor: each agent scraped once"
    monitor = objects[("ServiceMonitor", RELEASE)]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True and endpoint["port"] == "metrics"
    assert endpoint["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"},
        {"action": "labeldrop", "regex": "namespace|pod|container"},
    ]
    service = objects[("Service", RELEASE)]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert "metrics" in [port["name"] for port in service["spec"]["ports"]]
    rule = objects[("PrometheusRule", RELEASE)]
    assert rule["spec"] == yaml.safe_load((ROOT / "deploy/prometheus/otel-vgpu-rules.yaml").read_text())
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert objects[(kind, RELEASE)]["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind
    dashboard = objects[("ConfigMap", f"{RELEASE}-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in dashboard["metadata"], "no folder unless one is named"
    assert dashboard["data"] == {
        "otel-vgpu-dashboard.json": (ROOT / "deploy/grafana/otel-vgpu-dashboard.json").read_text()
    }
    assert _scrape_annotations() == {}, "the monitor scrapes them: a job reading annotations would scrape twice"


def test_a_default_install_without_the_operator_carries_the_scrape_annotations_and_the_notes_a_job() -> None:
    objects = _objects(kinds=WITHOUT_OPERATOR)
    assert not OPERATOR_OBJECTS & objects.keys()
    assert not [key for key in objects if key[0] in ("PodMonitor", "ServiceMonitor", "PrometheusRule")]
    assert _scrape_annotations(kinds=WITHOUT_OPERATOR) == SCRAPE_ANNOTATIONS
    # helm install asks the cluster; --dry-run=client has none, as a cluster without the operator.
    job = notes_scrape_job(_notes())
    assert job["honor_labels"] is True and job["job_name"] == "otel-vgpu"
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": [NAMESPACE]}}]
    keep, node = job["relabel_configs"]
    assert keep["action"] == "keep" and keep["regex"] == f"otel-vgpu;{RELEASE};metrics"
    assert node == {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"}
    notes = _notes()
    assert "exported_pod" in notes and "exported_namespace" in notes, "why honor_labels matters"
    # With TLS: the annotations and the job say https.
    https = ("--set", "tls.enabled=true")
    assert _scrape_annotations(*https, kinds=WITHOUT_OPERATOR)["prometheus.io/scheme"] == "https"
    job = notes_scrape_job(_notes(*https))
    assert job["scheme"] == "https" and job["tls_config"]["server_name"] == f"{RELEASE}.{NAMESPACE}.svc"


@pytest.mark.parametrize(
    "values",
    [(), ("--set", "tls.enabled=true", "--set", "tls.clientCA=true", "--set", "basicAuth.enabled=true")],
    ids=["plain", "tls-and-auth"],
)
def test_the_notes_job_is_a_scrape_config_prometheus_takes(values: tuple[str, ...], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with Debian's prometheus package (scripts/test.sh)"
    job = notes_scrape_job(_notes(*values))
    # The files it names are the user's to mount; promtool reads them, so they are made here.
    for key in ("ca_file", "cert_file", "key_file"):
        if key in job.get("tls_config", {}):
            path = tmp_path / Path(job["tls_config"][key]).name
            path.write_text("")
            job["tls_config"][key] = str(path)
    if "basic_auth" in job:
        (tmp_path / "password").write_text("x")
        job["basic_auth"]["password_file"] = str(tmp_path / "password")
    # Debian's Prometheus is built without Kubernetes discovery: the rest is checked, its pods
    # given by hand (tests/system/test_prometheus_e2e.py scrapes an agent with the job so).
    assert job.pop("kubernetes_sd_configs")
    job["static_configs"] = [{"targets": ["127.0.0.1:8080"]}]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    checked = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(config)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_install_doc_shows_the_job_the_notes_print() -> None:
    install = (ROOT / "docs" / "install.md").read_text()
    section = install.split("## How Prometheus scrapes it", 1)[1]
    shown = re.search(r"```yaml\n(scrape_configs:\n.*?)```", section, re.DOTALL)
    assert shown, "docs/install.md, How Prometheus scrapes it: a scrape_configs block"
    assert yaml.safe_load(shown.group(1)) == {"scrape_configs": [notes_scrape_job(_notes())]}


@pytest.mark.parametrize("switch", SWITCHES)
def test_auto_is_each_switch_s_default_and_what_it_renders(switch: str) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    default: Any = values
    for key in switch.split("."):
        default = default[key]
    assert default == "auto"
    for kinds in (CUSTOM_KINDS, WITHOUT_OPERATOR):
        assert template("--set", f"{switch}=auto", kinds=kinds) == template(kinds=kinds), (switch, kinds)


def test_false_turns_each_off_and_true_renders_it_without_the_api() -> None:
    # false, where the API would have it rendered; as a boolean or as its word (--set-string).
    for setting in ("--set", "--set-string"):
        assert ("ServiceMonitor", RELEASE) not in _objects(setting, "prometheus.monitor.enabled=false")
        assert ("PrometheusRule", RELEASE) not in _objects(setting, "prometheus.rules.enabled=false")
        assert ("ConfigMap", f"{RELEASE}-dashboard") not in _objects(setting, "grafana.dashboard.enabled=false")
        assert _scrape_annotations(setting, "prometheus.scrapeAnnotations=false", kinds=WITHOUT_OPERATOR) == {}
    # A monitor off and none other: the pods announce themselves instead.
    assert _scrape_annotations("--set", "prometheus.monitor.enabled=false") == SCRAPE_ANNOTATIONS
    # true where the API lacks the kinds: the user's choice, rendered (the check, on by default,
    # names a missing kind first: test_a_custom_kind_missing_from_the_api_fails_in_one_line).
    asked: tuple[str, ...] = ("--set", "checkApiVersions=false")
    for switch in SWITCHES:
        asked += ("--set", f"{switch}=true")
    objects = _objects(*asked, kinds=WITHOUT_OPERATOR)
    assert objects.keys() >= OPERATOR_OBJECTS
    assert _scrape_annotations(*asked, kinds=WITHOUT_OPERATOR) == SCRAPE_ANNOTATIONS, "true: beside the monitor"
    # The dashboard needs no custom kind: true renders it wherever.
    assert ("ConfigMap", f"{RELEASE}-dashboard") in _objects(
        "--set", "grafana.dashboard.enabled=true", kinds=WITHOUT_OPERATOR
    )


def test_the_podmonitor_replaces_the_servicemonitor_and_auto_needs_the_service() -> None:
    objects = _objects("--set", "prometheus.podMonitor.enabled=true")
    assert ("PodMonitor", RELEASE) in objects and ("ServiceMonitor", RELEASE) not in objects
    assert ("ConfigMap", f"{RELEASE}-dashboard") in objects, "the dashboard beside either monitor"
    assert _scrape_annotations("--set", "prometheus.podMonitor.enabled=true") == {}
    # No Service, nothing for a ServiceMonitor to scrape through: auto renders none; true is refused.
    without = ("--set", "service.enabled=false")
    assert not [key for key in _objects(*without) if key[0] == "ServiceMonitor"]
    assert _scrape_annotations(*without) == SCRAPE_ANNOTATIONS
    refused = helm("template", RELEASE, CHART, *without, "--set", "prometheus.monitor.enabled=true",
                   "--set", "checkApiVersions=false")  # fmt: skip
    assert refused.returncode != 0 and "service.enabled is off" in refused.stderr


def test_a_default_monitor_that_cannot_reach_the_agent_says_both_ways_out() -> None:
    # Basic auth or a client certificate asked of scrapers, and none given the monitor the
    # operator's API brings: the install names the credentials to give, or the monitor to turn off.
    kinds = [f"--api-versions={kind}" for kind in CUSTOM_KINDS]
    for asked in (("--set", "basicAuth.enabled=true"), ("--set", "tls.enabled=true", "--set", "tls.clientCA=true")):
        result = helm("template", RELEASE, CHART, "--set", "tls.enabled=true", *asked, *kinds)
        assert result.returncode != 0, asked
        assert "scraperSecretName" in result.stderr and "prometheus.monitor.enabled=false" in result.stderr
        off = helm("template", RELEASE, CHART, "--set", "tls.enabled=true", *asked, *kinds,
                   "--set", "prometheus.monitor.enabled=false")  # fmt: skip
        assert off.returncode == 0, off.stderr


def test_the_dashboard_takes_the_sidecar_s_label_folder_and_namespace() -> None:
    objects = _objects(*EXTRA_RENDERS["every-scrape-switch-on"])
    dashboard = objects[("ConfigMap", f"{RELEASE}-dashboard")]
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert (
        dashboard["metadata"]["labels"]["dashboards"] == "otel"
        and "grafana_dashboard" not in dashboard["metadata"]["labels"]
    )
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert _scrape_annotations(*EXTRA_RENDERS["every-scrape-switch-on"])["prometheus.io/scheme"] == "https"
    # A key of podAnnotations is the user's: it replaces the chart's, never repeats it.
    mine = _scrape_annotations("--set-string", "podAnnotations.prometheus\\.io/port=9999", kinds=WITHOUT_OPERATOR)
    assert mine == {**SCRAPE_ANNOTATIONS, "prometheus.io/port": "9999"}


def test_openshift_keeps_its_platform_monitoring_and_gets_no_dashboard() -> None:
    # The platform Prometheus scrapes the PodMonitor (kustomize/components/openshift-monitoring);
    # OpenShift's monitoring has no Grafana for the dashboard, and the pods no annotations.
    for name in ("openshift", "openshift-oci-hook", "openshift-nri"):
        objects = _objects("--set", f"platform={name}")
        assert {("PodMonitor", RELEASE), ("PrometheusRule", RELEASE), ("Role", "prometheus-k8s")} <= objects.keys()
        assert ("ServiceMonitor", RELEASE) not in objects and ("ConfigMap", f"{RELEASE}-dashboard") not in objects
        assert _scrape_annotations("--set", f"platform={name}") == {}, name


# Upgrades.
def selector(*args: str, chart: Path = CHART, kinds: tuple[str, ...] = CUSTOM_KINDS) -> dict[str, Any]:
    (ds,) = [d for d in documents(template(*args, chart=chart, kinds=kinds)) if d["kind"] == "DaemonSet"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    return dict(ds["spec"]["selector"])


def test_the_selector_never_changes_with_values_or_chart_versions(tmp_path: Path) -> None:
    expected = {"matchLabels": {"app.kubernetes.io/name": "otel-vgpu", "app.kubernetes.io/instance": RELEASE}}
    for flavour in ("defaults", *FLAVOURS):
        kinds = cluster_of(render(kustomize_target(flavour)))
        assert selector(*flavour_args(flavour), kinds=kinds) == expected, flavour
    for args in EXTRA_RENDERS.values():
        assert selector(*args) == expected, args
    # A later chart and agent version: the template's labels may move, the selector may not.
    later = tmp_path / "otel-vgpu"
    shutil.copytree(CHART, later)
    chart_yaml = later / "Chart.yaml"
    text = chart_yaml.read_text()
    text = re.sub(r"(?m)^version: .*$", "version: 9.8.7", text)
    text = re.sub(r"(?m)^appVersion: .*$", 'appVersion: "9.8.7"', text)
    chart_yaml.write_text(text)
    assert selector(chart=later) == expected
    (ds,) = [d for d in documents(template(chart=later)) if d["kind"] == "DaemonSet"]
    assert ds["metadata"]["labels"]["helm.sh/chart"] == "otel-vgpu-9.8.7", "the copy is the later version"


def test_a_new_ratio_rolls_the_pods_and_nothing_else_does() -> None:
    def pod_template(*args: str) -> dict[str, Any]:
        return dict(chart_daemonset(*args)["spec"]["template"])

    auto, two = pod_template(), pod_template("--set", "ratio=2")
    assert auto["metadata"]["annotations"]["checksum/ratio"] != two["metadata"]["annotations"]["checksum/ratio"]
    del auto["metadata"]["annotations"]["checksum/ratio"], two["metadata"]["annotations"]["checksum/ratio"]
    assert auto == two, "only the checksum moves"
    assert pod_template("--set", "ratio=2") == pod_template("--set-string", "ratio=2")


def test_helm_packages_the_chart_and_the_archive_renders_the_same(tmp_path: Path) -> None:
    result = helm("package", CHART, "--destination", tmp_path)
    assert result.returncode == 0, result.stderr
    archive = tmp_path / "otel-vgpu-0.2.0.tgz"
    assert archive.exists(), result.stdout
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {
        "otel-vgpu/Chart.yaml",
        "otel-vgpu/values.schema.json",
        "otel-vgpu/files/otel-vgpu-rules.yaml",
        "otel-vgpu/files/otel-vgpu-dashboard.json",
    } <= names
    assert not [n for n in names if "/ci/" in n or n.endswith(".helmignore")], "test values stay out of the package"
    assert template(chart=archive) == template()


DCGM = load_script("dcgm_generations.py")


@pytest.mark.parametrize(
    "version", ["3.3.9", "4.8.1", "4.8.2", "4.8", "4.8.3", "4.8.4", "4.9", "4.9.0", "4.10", "4.10.0", "4.11", "5.0.1"]
)
def test_the_dcgm_exporter_names_are_the_set_of_the_version_given(version: str) -> None:
    # The template's choice is scripts/dcgm_generations.py's: a major.minor its newest patch, an older
    # version the first set, a newer one the newest.
    names = ("--set-string", f"prometheus.rules.dcgmExporterNames={version}")
    rendered = by_object(documents(template(*names, "--set", "prometheus.rules.enabled=false")))
    rule = rendered[("PrometheusRule", f"{RELEASE}-dcgm-exporter-names")]
    generation = DCGM.generation_of(version)
    assert rule["spec"] == yaml.safe_load(generation.path.read_text())
    assert ("PrometheusRule", RELEASE) not in rendered, "the names with or without the agent's own rules"
    both = by_object(
        documents(
            template(
                "--set-string",
                f"prometheus.rules.dcgmExporterNames={version}",
                "--set",
                "prometheus.rules.enabled=true",
            )
        )
    )
    assert {("PrometheusRule", RELEASE), ("PrometheusRule", f"{RELEASE}-dcgm-exporter-names")} <= both.keys()


def test_no_dcgm_exporter_names_by_default() -> None:
    rules = [doc["metadata"]["name"] for doc in documents(template()) if doc["kind"] == "PrometheusRule"]
    assert rules == [RELEASE], "the agent's own rules alone"


def test_the_chart_ships_every_dcgm_exporter_set_as_generated() -> None:
    sets = sorted(path.name for path in (CHART / "files" / "dcgm-exporter").iterdir())
    assert sets == sorted(load_script("gen-dcgm-rules.py").chart_file(g).name for g in DCGM.GENERATIONS)
    for generation in DCGM.GENERATIONS:
        copy = load_script("gen-dcgm-rules.py").chart_file(generation)
        assert copy.read_text() == generation.path.read_text(), "regenerate: .venv/bin/python scripts/gen-dcgm-rules.py"


def test_the_chart_ships_the_tested_rules_and_collector_config() -> None:
    files = CHART / "files"
    assert (files / "otel-vgpu-rules.yaml").read_text() == (ROOT / "deploy/prometheus/otel-vgpu-rules.yaml").read_text()
    assert (files / "collector-gateway.yaml").read_text() == (ROOT / "collector-config/gateway/config.yaml").read_text()
    assert (files / "collector-semconv.yaml").read_text() == (ROOT / "collector-config/semconv/config.yaml").read_text()
    # Helm reads only the chart's own files: the dashboard is a copy, held to deploy/grafana's.
    dashboard = (ROOT / "deploy/grafana/otel-vgpu-dashboard.json").read_text()
    assert (files / "otel-vgpu-dashboard.json").read_text() == dashboard, (
        "cp deploy/grafana/otel-vgpu-dashboard.json charts/otel-vgpu/files/"
    )


def _agent_env(*args: str) -> dict[str, str | None]:
    (container,) = chart_daemonset(*args)["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_push_speaks_the_names_asked_and_only_where_there_is_a_push() -> None:
    push = ("--set", "otlp.endpoint=http://collector.observability:4317")
    assert "OTEL_VGPU_OTLP_NAMES" not in _agent_env(*push), "the default push, as before"
    gateway = ("--set", "otlp.collector.enabled=true")
    for pushing in (push, gateway):
        assert _agent_env(*pushing, "--set", "otlp.names=semconv")["OTEL_VGPU_OTLP_NAMES"] == "semconv"
    assert "OTEL_VGPU_OTLP_NAMES" not in _agent_env("--set", "otlp.names=semconv"), "no push, nothing to name"


def test_the_cluster_name_joins_the_agents_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _agent_env()["OTEL_RESOURCE_ATTRIBUTES"]
    assert plain and "k8s.cluster.name" not in plain
    named = _agent_env("--set", "clusterName=gpu-east.1")["OTEL_RESOURCE_ATTRIBUTES"]
    assert named == f"{plain},k8s.cluster.name=gpu-east.1"
    # As the kubelet expands it, read by the agent's own resource.
    (container,) = chart_daemonset("--set", "clusterName=gpu-east.1")["spec"]["template"]["spec"]["containers"]
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", container_environment(container)["OTEL_RESOURCE_ATTRIBUTES"])
    attributes = agent_resource("gpu-node-1").attributes
    assert attributes["k8s.cluster.name"] == "gpu-east.1" and attributes["k8s.pod.uid"] == POD_FIELDS["metadata.uid"]


def test_the_gateway_runs_the_configuration_of_the_names_pushed() -> None:
    def gateway(*args: str) -> tuple[str, str]:
        docs = documents(template("--set", "otlp.collector.enabled=true", *args))
        (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-collector")]
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        return config["data"]["config.yaml"], annotations["checksum/config"]

    for args, folder in (((), "gateway"), (("--set", "otlp.names=semconv"), "semconv")):
        text, checksum = gateway(*args)
        assert text == (ROOT / "collector-config" / folder / "config.yaml").read_text(), folder
        # A new configuration rolls the gateway's pods.
        assert checksum == hashlib.sha256(text.encode()).hexdigest(), folder


def test_the_install_doc_offers_every_platform_and_feature() -> None:
    install = (ROOT / "docs" / "install.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for flavour in FLAVOURS:
        if flavour in PLATFORMS:
            assert f"platform={flavour}`" in install, flavour
            assert f"`{flavour}`" in readme.split("--set platform=", 1)[1], f"the README's install names {flavour}"
        else:
            assert str(ci_values(flavour).relative_to(ROOT)) in install, flavour


# Platforms: one value that ships in the package and sets what each overlay sets.
PLATFORMS_FILE = yaml.safe_load((CHART / "files" / "platforms.yaml").read_text())
PLATFORMS = sorted(PLATFORMS_FILE["platforms"])


def _leaves(tree: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for key, value in tree.items():
        out += _leaves(value, (*path, key)) if isinstance(value, dict) else [((*path, key), value)]
    return out


def test_the_platforms_defaults_are_values_yaml_s() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path, default in _leaves(PLATFORMS_FILE["defaults"]):
        found: Any = values
        for key in path:
            found = found[key]
        assert found == default, f"files/platforms.yaml defaults {'.'.join(path)}: {default!r}, values.yaml {found!r}"
    # Every key a platform sets has its default there: otherwise a user's value could not be told from it.
    for name, preset in PLATFORMS_FILE["platforms"].items():
        for path, _ in _leaves(preset):
            known: Any = PLATFORMS_FILE["defaults"]
            for key in path:
                assert isinstance(known, dict) and key in known, f"{name} sets {'.'.join(path)}, which defaults lacks"
                known = known[key]


def test_each_platform_s_ci_file_is_one_line_naming_it_and_the_schema_lists_them() -> None:
    assert set(PLATFORMS) <= set(FLAVOURS), "a platform without its overlay"
    for name in PLATFORMS:
        assert yaml.safe_load(ci_values(name).read_text()) == {"platform": name}
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["platform"]["enum"] == ["", *PLATFORMS]


def test_a_platform_renders_its_settings_given_as_values(tmp_path: Path) -> None:
    # The same objects as the preset's values given by hand: `platform` adds nothing else.
    for name in ("eks", "openshift", "k0s"):
        spelled = tmp_path / f"{name}.yaml"
        spelled.write_text(yaml.safe_dump(PLATFORMS_FILE["platforms"][name]))
        assert template("--set", f"platform={name}") == template("--values", str(spelled)), name
    assert template("--set", "platform=eks") != template()


def test_kai_enabled_grants_its_bind_requests_and_off_neither_grants_nor_reads_them() -> None:
    kai_rule = {"apiGroups": ["scheduling.run.ai"], "resources": ["bindrequests"], "verbs": ["get", "list", "watch"]}

    def rules(*args: str) -> list[dict[str, Any]]:
        roles = [d for d in documents(template(*args)) if d["kind"] == "ClusterRole"]
        (role,) = [d for d in roles if d["metadata"]["name"] == RELEASE]
        return list(role["rules"])

    def agent_config(*args: str) -> Any:
        (container,) = chart_daemonset(*args)["spec"]["template"]["spec"]["containers"]
        return parse_config([arg for arg in container["args"] if not arg.startswith("--allocation-file")])

    # By default: the rule, and the agent reads them once a reservation pod of KAI's is on its node.
    assert kai_rule in rules() and agent_config().kai == "auto"
    assert agent_config().kai_reservation == ("kai-resource-reservation",) * 3
    off = ("--set", "kai.enabled=false")
    assert kai_rule not in rules(*off) and agent_config(*off).kai == "off"
    legacy = agent_config("--set", "kai.reservation=runai-reservation/runai-sa")
    assert legacy.kai_reservation == ("runai-reservation", "runai-sa", "runai-reservation")


def test_a_value_the_user_sets_wins_over_the_platform_s() -> None:
    with_eks = chart_daemonset("--set", "platform=eks", "--set", "runtime.mode=nri")
    by_hand = chart_daemonset("--set", "nodes.presets={eks}", "--set", "runtime.mode=nri")
    assert with_eks == by_hand
    assert with_eks != chart_daemonset("--set", "platform=eks")
    # Lists too: the user's node presets replace the platform's.
    spec = chart_daemonset("--set", "platform=eks", "--set", "nodes.presets={aks}")["spec"]["template"]["spec"]
    assert (
        spec
        == chart_daemonset("--set", "nodes.presets={aks}", "--set", "runtime.mode=default")["spec"]["template"]["spec"]
    )


def test_the_packaged_chart_renders_every_platform_as_the_source_tree() -> None:
    archive = packaged()
    with tarfile.open(archive) as tar:
        assert "otel-vgpu/files/platforms.yaml" in tar.getnames()
    for name in PLATFORMS:
        assert template("--set", f"platform={name}", chart=archive) == template(*flavour_args(name)), name


def test_an_unknown_platform_is_refused_with_the_valid_ones() -> None:
    result = helm("template", RELEASE, CHART, "--set", "platform=eks-auto")
    assert result.returncode != 0
    assert "/platform" in result.stderr and "'openshift-oci-hook'" in result.stderr


# The docs: the values table, the schema's refusal they quote, the commands of the move from kustomize.
def test_the_values_table_is_made_from_values_yaml() -> None:
    module = load_script("gen-values-table.py")
    blocks = load_script("doc_blocks.py")
    text = (CHART / "values.yaml").read_text()
    table = module.values_table(text)
    for doc in blocks.BLOCKS["chart values table"]:
        held = blocks.block(doc.read_text(), "chart values table", str(doc))
        assert held == table, f"{doc}: regenerate it: .venv/bin/python scripts/gen-values-table.py"
    # every leaf value has a row (or sits inside a documented one)
    documented = {key for key, _ in module.rows(text)}
    values = yaml.safe_load(text)

    def leaves(node: dict[str, Any], prefix: str = "") -> set[str]:
        out = set()
        for key, value in node.items():
            if isinstance(value, dict) and value and prefix + key not in documented:
                out |= leaves(value, f"{prefix}{key}.")
            else:
                out.add(prefix + key)
        return out

    assert leaves(values) == documented


def test_a_value_without_a_comment_stops_the_table() -> None:
    module = load_script("gen-values-table.py")
    with pytest.raises(ValueError, match=r"values.yaml:4: image.tag has no `# --` comment"):
        module.rows("image:\n  # -- Registry.\n  registry: ghcr.io\n  tag: latest\n")


def test_the_refusal_the_values_doc_quotes_is_helms() -> None:
    doc = (ROOT / "docs" / "chart-values.md").read_text()
    quoted = re.search(r"```text\n(Error: values don't meet.*?)```", doc, re.DOTALL)
    assert quoted, "docs/chart-values.md quotes a refusal"
    result = helm("template", RELEASE, CHART, "--set", "runtime.mode=nvidia")
    assert result.returncode != 0
    assert quoted.group(1).strip() in result.stderr


def test_the_upgrade_docs_replace_step_deletes_all_but_the_namespace() -> None:
    upgrading = (ROOT / "docs" / "upgrading.md").read_text()
    (line,) = [
        s.strip() for s in upgrading.splitlines() if s.strip().startswith("kubectl kustomize kustomize/overlays/")
    ]
    assert line.endswith("| kubectl delete -f -")
    # What kubectl delete would be given, from the overlay it names.
    ran = subprocess.run(
        ["bash", "-c", line.removesuffix("| kubectl delete -f -") + "| cat"],
        capture_output=True, text=True, check=True, cwd=ROOT, env={**os.environ, "KUBECONFIG": "/dev/null"},
    )  # fmt: skip
    overlay = line.split()[2].removeprefix("kustomize/overlays/")
    deleted = {(d["kind"], d["metadata"]["name"]) for d in documents(ran.stdout)}
    made = {(d["kind"], d["metadata"]["name"]) for d in render(overlay)}
    assert deleted == {key for key in made if key[0] != "Namespace"} and deleted


# Ten mistakes a platform team makes, each refused at install with where and what is valid.
MISTAKES = [
    (("--set", "resources.limits.memory=192"), ["resources.limits.memory", "192Mi"]),
    (("--set", "resources.limit.cpu=1"), ["/resources", "'limit' not allowed"]),
    (("--set", "tolerations[0].opertor=Exists"), ["/tolerations/0", "'opertor' not allowed"]),
    (("--set", "tolerations[0].operator=exists"), ["/tolerations/0/operator", "'Exists'"]),
    (("--set", "affinity.nodeAfinity.x=1"), ["/affinity", "'nodeAfinity' not allowed"]),
    (("--set", "updateStrategy.type=Rollingupdate"), ["/updateStrategy/type", "'RollingUpdate', 'OnDelete'"]),
    (("--set", "prometheus.podMonitor.interval=30"), ["prometheus.podMonitor.interval", "30s"]),
    (("--set", "prometheus.monitor.scrapeTimeout=1m"), ["prometheus.monitor.scrapeTimeout", "at most the interval"]),
    (
        ("--set", "image.repository=registry.example.com/otel-vgpu"),
        ["image.repository", "image.registry=registry.example.com", "image.repository=otel-vgpu"],
    ),
    (("--set", "metricDenylist={vgpu_(pod}"), ["metricDenylist[0]", '"vgpu_(pod"', "unclosed group"]),
    (("--set", "kai.reservation=Runai-Reservation"), ["/kai/reservation", "'Runai-Reservation' does not match"]),
    (("--set", "kai.enable=false"), ["/kai", "'enable' not allowed"]),
]


@pytest.mark.parametrize("args,expected", MISTAKES, ids=[" ".join(m[0][1:]) for m in MISTAKES])
def test_a_mistake_is_refused_saying_where_and_what_is_valid(args: tuple[str, ...], expected: list[str]) -> None:
    result = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *args)
    assert result.returncode != 0, f"{args} rendered"
    for part in expected:
        assert part in result.stderr, (part, result.stderr)


# What RE2 takes and what it refuses, as Go's (the chart's check) and the agent's
# (otel_vgpu/patterns.py) read them: constructs of RE2's own, Python's that RE2 lacks, and
# the pattern that made Python's backtracking hang the start.
PATTERNS = [
    "vgpu_pod_.*",
    "vgpu_pod\\z",
    "vgpu_[[:alpha:]]+",
    "vgpu_\\pL+",
    "(?U)vgpu_.*",
    "(?P<n>vgpu)_.*",
    "(?<n>vgpu)_.*",
    "vgpu_\\Qa.b\\E",
    "(\\w|\\w)*!",
    "vgpu_\\C",
    "(?=vgpu)",
    "(vgpu)\\1",
    "vgpu_{1001}",
    "vgpu_(pod",
    "[vgpu",
    # Read inside a group, as Prometheus anchors its own: a ")|(" in it is an alternation there.
    "vgpu_pod)|(vgpu_gpu",
    "\\Qvgpu",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_chart_refuses_exactly_the_patterns_the_agent_refuses(tmp_path: Path, pattern: str) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"metricAllowlist": [pattern]}))
    result = helm("template", RELEASE, CHART, "--values", values)
    try:
        parse_config([], {"OTEL_VGPU_METRIC_ALLOWLIST": pattern})
        agent_refuses = False
    except ConfigError as error:
        agent_refuses = True
        assert f"invalid pattern {pattern!r}" in str(error) and "RE2" in str(error)
    assert (result.returncode != 0) == agent_refuses, result.stderr
    if agent_refuses:
        assert "metricAllowlist[0]" in result.stderr and "RE2" in result.stderr, result.stderr


def test_what_is_valid_still_renders(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "resources": {"requests": {"cpu": 0.05, "memory": "100M"}, "limits": {"cpu": "1", "memory": "1Gi"}},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a"]}]}
                            ]
                        }
                    }
                },
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "prometheus": {"monitor": {"interval": "1m30s", "scrapeTimeout": "90s"}},
                "image": {"registry": "localhost:5000", "repository": "team/otel-vgpu"},
                "metricDenylist": ["vgpu_(pod|gpu)_jpeg_.*", "vgpu_pod_[a-z]+_active_ratio$"],
            }
        )
    )
    daemonset = chart_daemonset("--values", str(values))
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "localhost:5000/team/otel-vgpu:0.2.0"
    assert container["resources"]["limits"]["memory"] == "1Gi"


def test_the_schema_embeds_the_kubernetes_types_it_is_generated_with() -> None:
    generator = load_script("gen-values-schema-types.py")
    assert (CHART / "values.schema.json").read_text() == generator.text(), (
        "run .venv/bin/python scripts/gen-values-schema-types.py"
    )


def _notes(*args: str) -> str:
    return install_notes(*args)


def test_the_notes_say_the_default_image_must_be_built_and_pushed_and_how() -> None:
    notes = _notes()
    assert "no\nregistry publishes" in notes and "docker build" in notes and "docker push" in notes
    assert "--set image.registry=registry.example.com" in notes
    assert "docker build" not in _notes("--set", "image.registry=registry.example.com")


def test_the_notes_name_the_dns_name_a_monitor_verifies() -> None:
    args = (
        "--set",
        "tls.enabled=true",
        "--set",
        "prometheus.podMonitor.enabled=true",
        "--set",
        "checkApiVersions=false",
    )
    assert f"{RELEASE}.{NAMESPACE}.svc" in _notes(*args)
    assert "example.org" in _notes(*args, "--set", "tls.serverName=example.org")
    assert "verifies the agent's certificate" not in _notes("--set", "tls.enabled=true")


def test_every_property_of_the_chart_has_a_description() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    operator_types = {"tlsConfig", "basicAuth", "authorization"}

    def undescribed(node: dict[str, Any], prefix: str = "") -> list[str]:
        out = []
        for key, sub in node.get("properties", {}).items():
            out += [] if sub.get("description") else [prefix + key]
            if not (prefix.startswith("prometheus.") and key in operator_types):
                out += undescribed(sub, f"{prefix}{key}.")
        return out

    assert undescribed(schema) == []
    values = load_script("gen-values-table.py").rows((CHART / "values.yaml").read_text())
    ratio = dict(values)["ratio"]
    assert schema["properties"]["ratio"]["description"] == ratio, "the comment in values.yaml is the description"


def test_helm_show_readme_prints_the_charts_readme_with_its_values_table() -> None:
    table = load_script("gen-values-table.py").values_table((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    assert table in readme, "regenerate it: .venv/bin/python scripts/gen-values-table.py"
    shown = helm("show", "readme", packaged())
    assert shown.returncode == 0, shown.stderr
    assert table in shown.stdout and "docker push" in shown.stdout


def test_artifact_hub_lists_the_image_the_defaults_run() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (image,) = yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
    container = chart_daemonset()["spec"]["template"]["spec"]["containers"][0]
    assert image["image"] == container["image"]
    changes = yaml.safe_load(chart["annotations"]["artifacthub.io/changes"])
    # Artifact Hub's kinds (artifacthub.io/docs/topics/annotations/helm).
    assert changes and {c["kind"] for c in changes} <= {
        "added",
        "changed",
        "deprecated",
        "removed",
        "fixed",
        "security",
    }
    assert chart["maintainers"]


# The keys users bring from other charts (node-exporter's and Bitnami's names), each doing what it says.
def test_names_and_namespace_can_be_overridden_and_labels_added_everywhere() -> None:
    docs = documents(
        template(
            "--set", "nameOverride=gpu-usage", "--set", "namespaceOverride=monitoring",
            "--set", "commonLabels.team=platform", "--set", "otlp.collector.enabled=true",
        )
    )  # fmt: skip
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert daemonset["metadata"]["name"] == f"{RELEASE}-gpu-usage"
    assert daemonset["spec"]["selector"]["matchLabels"][NAME] == "otel-vgpu", "a selector no value changes"
    for doc in docs:
        assert doc["metadata"]["labels"]["team"] == "platform", doc["kind"]
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] == "monitoring", doc["kind"]
    assert daemonset["spec"]["template"]["metadata"]["labels"]["team"] == "platform"
    assert "team" not in daemonset["spec"]["selector"]["matchLabels"]
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "monitoring"


def test_the_daemonset_and_pod_keys_render_where_set_and_not_otherwise(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "daemonsetAnnotations": {"argocd.argoproj.io/sync-wave": "1"},
                "revisionHistoryLimit": 3,
                "dnsPolicy": "ClusterFirstWithHostNet",
                "containerSecurityContext": {"seLinuxOptions": {"type": "spc_t"}},
                "livenessProbe": {"periodSeconds": 60},
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics", "scheme": "HTTPS"}},
                "serviceAccount": {"automountServiceAccountToken": False},
                "env": {"OTEL_EXPORTER_OTLP_HEADERS": {"valueFrom": {"secretKeyRef": {"name": "otlp", "key": "h"}}}},
            }
        )
    )
    daemonset = chart_daemonset("--values", str(values))
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert daemonset["metadata"]["annotations"] == {"argocd.argoproj.io/sync-wave": "1"}
    assert daemonset["spec"]["revisionHistoryLimit"] == 3 and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    # Merged over the chart's own: what hardens the container stays.
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    assert container["livenessProbe"]["periodSeconds"] == 60
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert pod["automountServiceAccountToken"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"] == {"secretKeyRef": {"name": "otlp", "key": "h"}}
    plain = chart_daemonset()
    assert "annotations" not in plain["metadata"] and "revisionHistoryLimit" not in plain["spec"]
    assert "dnsPolicy" not in plain["spec"]["template"]["spec"]


def test_global_registry_and_pull_secrets_reach_every_pod() -> None:
    docs = documents(
        template(
            "--set", "global.imageRegistry=mirror.example.com", "--set", "global.imagePullSecrets={mirror}",
            "--set", "imagePullSecrets[0].name=regcred", "--set", "otlp.collector.enabled=true",
        )
    )  # fmt: skip
    pods = {d["kind"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("DaemonSet", "Deployment")}
    assert pods["DaemonSet"]["containers"][0]["image"] == "mirror.example.com/otel-vgpu/otel-vgpu:0.2.0"
    assert (
        pods["Deployment"]["containers"][0]["image"]
        == "mirror.example.com/otel/opentelemetry-collector-contrib:0.165.0"
    )
    assert pods["DaemonSet"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    assert pods["Deployment"]["imagePullSecrets"] == [{"name": "mirror"}]


def test_the_collector_gateway_takes_replicas_resources_placement_and_a_budget(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "otlp": {
                    "collector": {
                        "enabled": True,
                        "replicas": 3,
                        "resources": {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
                        "nodeSelector": {"pool": "system"},
                        "tolerations": [{"key": "system", "operator": "Exists"}],
                        "minAvailable": 2,
                    }
                }
            }
        )
    )
    docs = documents(template("--values", str(values)))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 3 and pod["nodeSelector"] == {"pool": "system"}
    assert pod["containers"][0]["resources"]["limits"]["memory"] == "1Gi"
    assert pod["tolerations"] == [{"key": "system", "operator": "Exists"}]
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["minAvailable"] == 2
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert not [
        d for d in documents(template("--set", "otlp.collector.enabled=true")) if d["kind"] == "PodDisruptionBudget"
    ]


def test_extra_manifests_render_as_maps_and_as_templates(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "extraManifests": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra"}, "data": {"a": "b"}},
                    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: extra\n  namespace: {{ .Release.Namespace }}\n",
                ]
            }
        )
    )
    docs = documents(template("--values", str(values)))
    extra = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "extra")
    assert extra["data"] == {"a": "b"}
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert secret["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize("monitor,kind", [("monitor", "ServiceMonitor"), ("podMonitor", "PodMonitor")])
def test_each_monitor_takes_the_overrides_node_exporters_chart_has(monitor: str, kind: str) -> None:
    key = f"prometheus.{monitor}"
    docs = documents(
        template(
            "--set", f"{key}.enabled=true", "--set", f"{key}.namespace=monitoring",
            "--set", f"{key}.jobLabel=app.kubernetes.io/name", "--set", f"{key}.scheme=https",
            "--set", f"{key}.selectorOverride.matchLabels.team=gpu",
            "--set", f"{key}.apiVersion=monitoring.coreos.com/v1",
            "--set", f"{key}.authorization.credentials.name=token", "--set", f"{key}.authorization.credentials.key=t",
        )
    )  # fmt: skip
    (found,) = [d for d in docs if d["kind"] == kind]
    assert found["metadata"]["namespace"] == "monitoring"
    assert found["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}, "back to the agents' namespace"
    assert found["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert found["spec"]["selector"] == {"matchLabels": {"team": "gpu"}}
    (endpoint,) = found["spec"]["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["authorization"] == {"credentials": {"name": "token", "key": "t"}}
    both = helm(
        "template", RELEASE, CHART, "--set", f"{key}.enabled=true", "--set", "checkApiVersions=false",
        "--set", f"{key}.authorization.credentials.name=t", "--set", f"{key}.authorization.credentials.key=t",
        "--set", f"{key}.basicAuth.username.name=u", "--set", f"{key}.basicAuth.username.key=u",
        "--set", f"{key}.basicAuth.password.name=u", "--set", f"{key}.basicAuth.password.key=p",
    )  # fmt: skip
    assert both.returncode != 0 and "not both" in both.stderr


def test_the_gateways_memory_without_a_unit_is_refused_as_the_agents_is() -> None:
    result = helm("template", RELEASE, CHART, "--set", "otlp.collector.enabled=true",
                  "--set", "otlp.collector.resources.limits.memory=512")  # fmt: skip
    assert result.returncode != 0
    assert "otlp.collector.resources.limits.memory" in result.stderr and "512Mi" in result.stderr
    named = documents(
        template(
            "--set", "global.imageRegistry=mirror.example.com", "--set", "otlp.collector.enabled=true",
            "--set", "otlp.collector.image=ghcr.io/team/collector:1",
        )
    )  # fmt: skip
    (deployment,) = [d for d in named if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "mirror.example.com/team/collector:1"
