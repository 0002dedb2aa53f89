"""The agent's `pod` and `namespace` labels name the pods using the GPUs. They survive the
ways clusters scrape the agent, in the real Prometheus, one run for all of them:

- the chart's ServiceMonitor, as the Prometheus Operator turns it into a scrape config
  (testkit/prometheus.py servicemonitor_scrape_config, with its sources);
- the annotated pods' job of the prometheus-community chart (`kubernetes-pods`, honor_labels
  true; testkit/prometheus.py annotation_scrape_config, with its source);
- the job of the agent's own that docs/troubleshooting.md shows;
- and, as the control, the annotation job without honor_labels, where Prometheus renames the
  agent's labels to exported_pod and exported_namespace and puts the agent's own in their place.

No Kubernetes runs here: each job's targets carry by hand the discovery labels that
kubernetes_sd would give the agent's pod, and the job's own relabelings make the target
labels from them. The shipped dashboard's queries, the recording rules and the README's
chargeback queries then find the tenants' pods and namespaces, and no exported_ label, in
the jobs that honor the agent's labels. And docs/dashboard.svg, those panels' queries on the
demo node, draws panels the dashboard has."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from testkit.agent import ROOT, running_agent
from testkit.dashboard import dashboard_queries, panel, scoped
from testkit.helm import NAMESPACE, template
from testkit.prometheus import (
    Prometheus,
    annotation_scrape_config,
    pod_role_targets,
    running_prometheus,
    servicemonitor_scrape_config,
)
from testkit.scripts import load
from testkit.yamldocs import documents

from ..conftest import STEADY

RULES = ROOT / "deploy" / "prometheus" / "otel-vgpu-rules.yaml"
README = ROOT / "README.md"
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"

# The steady node, with a third GPU that one pod has alone (the dashboard's per-pod tensor
# panel shows only such pods) and an XID error, so that every panel has something to show.
SCENARIO: dict[str, Any] = yaml.safe_load(STEADY)
SCENARIO["gpus"].append({"model": "NVIDIA H100 80GB HBM3", "memory": "80GiB"})
SCENARIO["pods"].append(
    {
        "namespace": "research",
        "name": "solo",
        "cgroup": {"version": 2, "driver": "systemd", "runtime": "containerd", "qos": "guaranteed"},
        "shares": {2: 2},
        "processes": [{"gpu": 2, "memory": "8GiB", "sm": 0.6, "tensor": 0.4, "dram": 0.2}],
    }
)
SCENARIO["health_events"] = [{"gpu": 0, "at_s": 0, "xid": 13}]

# The tenants as the agent names them: a pod the pod directory does not know is named by its
# UID, with an empty namespace.
TENANTS = {
    (pod["namespace"], pod["name"]) if pod.get("in_directory", True) else (None, pod["uid"]) for pod in SCENARIO["pods"]
}
TENANT_PODS = {pod for _, pod in TENANTS}
TENANT_NAMESPACES = {namespace for namespace, _ in TENANTS if namespace}

NODE = "node-a"
AGENT_POD = f"otel-vgpu-{NODE}"
# The job labels: the ServiceMonitor's is its Service's name.
SERVICEMONITOR = "otel-vgpu"
ANNOTATIONS = "kubernetes-pods"
# The doc's job is named otel-vgpu, as the ServiceMonitor's: here a name of its own.
OWN = "otel-vgpu-own-job"
CONTROL = "kubernetes-pods-without-honor-labels"
HONORING = (SERVICEMONITOR, ANNOTATIONS, OWN)
# The control keeps two families: enough to show the renamed labels, and none that the
# namespace rules sum, so the recorded series stay the honoring jobs'. Metric relabelings
# run after Prometheus has attached the target's labels (scrape.go, mutateSampleLabels,
# then the metric_relabel_configs), so keeping changes no label.
CONTROL_FAMILIES = "vgpu_pod_memory_used_bytes|vgpu_gpu_memory_total_bytes"


def chart() -> list[dict[str, Any]]:
    """The chart with its ServiceMonitor, its pods annotated for annotation-based jobs."""
    return documents(
        template(
            "--set", "prometheus.monitor.enabled=true",
            "--set-string", r"podAnnotations.prometheus\.io/scrape=true",
            "--set-string", r"podAnnotations.prometheus\.io/port=8080",
        )
    )  # fmt: skip


def kind(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == name]
    return found


def own_job(pod_template: dict[str, Any], targets: dict[str, str]) -> dict[str, Any]:
    """The job of the agent's own that docs/troubleshooting.md shows, on the pods it discovers."""
    blocks = re.findall(r"```yaml\n(.*?)```", TROUBLESHOOTING.read_text(), flags=re.DOTALL)
    ((job,),) = [yaml.safe_load(block) for block in blocks if "job_name: otel-vgpu" in block]
    assert job.pop("kubernetes_sd_configs") == [{"role": "pod", "namespaces": {"names": [NAMESPACE]}}]
    return {**job, "job_name": OWN, "static_configs": pod_role_targets(pod_template, NAMESPACE, targets)}


def scrape_configs(address: str) -> list[dict[str, Any]]:
    docs = chart()
    targets = {address: NODE}
    pod_template = kind(docs, "DaemonSet")["spec"]["template"]
    control = annotation_scrape_config(pod_template, NAMESPACE, targets, job_name=CONTROL, honor_labels=False)
    control["metric_relabel_configs"] = [{"source_labels": ["__name__"], "regex": CONTROL_FAMILIES, "action": "keep"}]
    return [
        servicemonitor_scrape_config(kind(docs, "ServiceMonitor"), kind(docs, "Service"), targets),
        annotation_scrape_config(pod_template, NAMESPACE, targets),
        own_job(pod_template, targets),
        control,
    ]


def recording_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "record" in rule]


def settle(prometheus: Prometheus) -> None:
    """Back once every job has scraped its target three times (a rate has two samples) and
    every recording rule has recorded series (each evaluated since)."""
    for job in (*HONORING, CONTROL):
        prometheus.wait_for(f'count_over_time(up{{job="{job}"}}[10m]) >= 3 and up{{job="{job}"}} == 1', timeout=90)
    for rule in recording_rules():
        prometheus.wait_for(rule["record"], timeout=90)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp_path = tmp_path_factory.mktemp("scrape-labels")
    scenario = tmp_path / "node.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("2\n")
    with running_agent("--simulate", str(scenario), "--allocation-file", str(ratio)) as agent:
        configs = scrape_configs(agent.url.removeprefix("http://"))
        with running_prometheus(tmp_path, configs, [RULES]) as prometheus:
            settle(prometheus)
            yield prometheus
        agent.stop()


@dataclass(frozen=True)
class Seen:
    """What a query's series say of pods and namespaces."""

    pods: set[str | None]
    namespaces: set[str | None]
    exported: set[str]

    @classmethod
    def of(cls, series: list[dict[str, Any]]) -> Seen:
        return cls(
            pods={s["metric"].get("pod") for s in series},
            namespaces={s["metric"].get("namespace") for s in series},
            exported={name for s in series for name in s["metric"] if name.startswith("exported_")},
        )

    def tenants_only(self) -> bool:
        """Every pod and namespace named is a tenant's, and no label was renamed."""
        return self.pods - {None} <= TENANT_PODS and self.namespaces - {None} <= TENANT_NAMESPACES and not self.exported


def pairs(series: list[dict[str, Any]], prefix: str = "") -> set[tuple[str | None, str | None]]:
    return {(s["metric"].get(f"{prefix}namespace"), s["metric"].get(f"{prefix}pod")) for s in series}


@pytest.mark.parametrize("job", (SERVICEMONITOR, OWN))
def test_the_charts_servicemonitor_and_a_job_of_its_own_keep_the_tenants_and_the_agents_pod_off(
    prometheus: Prometheus, job: str
) -> None:
    pods = prometheus.query(f'vgpu_pod_memory_used_bytes{{job="{job}"}}')
    assert pairs(pods) == TENANTS
    assert Seen.of(pods).tenants_only()
    # The node and the target's address, not the agent's container.
    assert all(s["metric"]["node"] == NODE and s["metric"]["instance"] and "container" not in s["metric"] for s in pods)
    if job == SERVICEMONITOR:
        # The operator's labels of the Service and its port.
        assert all(s["metric"]["service"] == "otel-vgpu" and s["metric"]["endpoint"] == "metrics" for s in pods)
    # The GPUs' series name no pod: not the agent's either.
    gpus = prometheus.query(f'vgpu_gpu_memory_total_bytes{{job="{job}"}}')
    assert len(gpus) == len(SCENARIO["gpus"]) and pairs(gpus) == {(None, None)}


def test_the_annotation_job_keeps_the_tenants_with_honor_labels_and_renames_them_without(
    prometheus: Prometheus,
) -> None:
    honored = prometheus.query(f'vgpu_pod_memory_used_bytes{{job="{ANNOTATIONS}"}}')
    assert pairs(honored) == TENANTS and Seen.of(honored).tenants_only()
    # Series that carry no pod of their own (the GPUs', the agent's) get the target's: the
    # agent's pod and namespace. No panel or rule reads a GPU's series by pod.
    gpus = prometheus.query(f'vgpu_gpu_memory_total_bytes{{job="{ANNOTATIONS}"}}')
    assert pairs(gpus) == {(NAMESPACE, AGENT_POD)}
    # Without honor_labels every tenant's pod and namespace is renamed, and the agent's
    # own put in their place (an empty namespace has nothing to rename).
    renamed = prometheus.query(f'vgpu_pod_memory_used_bytes{{job="{CONTROL}"}}')
    assert pairs(renamed) == {(NAMESPACE, AGENT_POD)}
    assert pairs(renamed, "exported_") == TENANTS
    # So the dashboard's memory panel shows the agent's pod alone, a line a GPU.
    memory = panel("GPU memory per pod: used and allocated")["targets"][0]["expr"]
    lines = prometheus.query(scoped(memory, CONTROL))
    assert pairs(lines) == {(NAMESPACE, AGENT_POD)} and len(lines) == len({s["metric"]["gpu_id"] for s in renamed})


def reads_pods(query: str) -> bool:
    """A query over the pods' series, not the GPUs' or the agents'."""
    return "vgpu_pod_" in query or "pod_gpu:" in query


def names_right(seen: Seen, per_pod: bool, job: str | None) -> bool:
    """A per-pod query names tenants only; any other names no pod, or through the annotation
    job the agent's own (`job` None: a series summed over the jobs)."""
    if seen.exported:
        return False
    if per_pod:
        return seen.tenants_only()
    if job == ANNOTATIONS:
        return seen.pods <= {None, AGENT_POD} and seen.namespaces <= {None, NAMESPACE}
    return seen.pods == seen.namespaces == {None}


def in_seconds(promql: str) -> str:
    """A subquery's steps fall on whole minutes of the clock, so its first comes up to a
    minute after the first scrape: here they are seconds, as the scrapes are."""
    return promql.replace(":1m]", ":1s]")


@pytest.mark.parametrize("job", HONORING)
def test_every_dashboard_query_finds_the_tenants_and_no_exported_label(prometheus: Prometheus, job: str) -> None:
    for query in dashboard_queries():
        promql = in_seconds(scoped(query, job))
        seen = Seen.of(prometheus.wait_for(promql, timeout=60))
        assert names_right(seen, reads_pods(query), job), (promql, seen)
        # Not vacuous: every query over the pods' series names their namespaces or pods.
        assert not reads_pods(query) or (seen.namespaces | seen.pods) - {None}, (promql, seen)


def test_every_recording_rule_records_the_tenants(prometheus: Prometheus) -> None:
    for rule in recording_rules():
        name = rule["record"]
        # The namespace rules sum the jobs away: only the honoring jobs feed them.
        jobs: tuple[str | None, ...] = (None,) if name.startswith("namespace:") else HONORING
        for job in jobs:
            series = prometheus.query(f'{name}{{job="{job}"}}' if job else name)
            seen = Seen.of(series)
            assert series and names_right(seen, reads_pods(rule["expr"]), job), (name, job, seen)
            # Not vacuous: a rule over the pods' series keeps their namespace, or pod and namespace.
            assert not reads_pods(rule["expr"]) or seen.namespaces - {None}, (name, job, seen)
    # The control's renamed labels reach the series recorded from it.
    renamed = prometheus.query(f'vgpu:pod_memory_used:mebibytes{{job="{CONTROL}"}}')
    assert pairs(renamed, "exported_") == TENANTS and pairs(renamed) == {(NAMESPACE, AGENT_POD)}


def readme_queries() -> list[str]:
    """The queries of the README's chargeback section, a line each."""
    section = README.read_text().split("\n## Chargeback\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```promql\n(.*?)```", section, flags=re.DOTALL)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readmes_chargeback_queries_bill_the_tenants(prometheus: Prometheus) -> None:
    queries = readme_queries()
    assert len(queries) >= 2, "the README's chargeback block"
    for query in queries:
        # A month in 5-minute steps, made the few seconds scraped here in 1-second steps.
        assert "[30d:5m]" in query, query
        series = prometheus.wait_for(query.replace("[30d:5m]", "[5m:1s]"), timeout=60)
        seen = Seen.of(series)
        assert seen.tenants_only() and seen.namespaces - {None}, (query, seen)


def test_the_troubleshooting_query_finds_the_renamed_series_and_only_those(prometheus: Prometheus) -> None:
    blocks = re.findall(r"```promql\n(.*?)```", TROUBLESHOOTING.read_text(), flags=re.DOTALL)
    (query,) = [block.strip() for block in blocks if "exported_pod" in block]
    assert {s["metric"]["job"] for s in prometheus.query(query)} == {CONTROL}


@pytest.mark.unit
def test_the_dashboard_picture_draws_panels_of_the_dashboard() -> None:
    image = (ROOT / "docs" / "dashboard.svg").read_text()
    for title in load("dashboard_picture.py").PANELS:
        assert panel(title)["targets"], title
        assert html.escape(title) in image, f"{title!r} is not drawn: run scripts/dashboard_picture.py"
    assert "](dashboard.svg)" in (ROOT / "docs" / "alerts.md").read_text()
