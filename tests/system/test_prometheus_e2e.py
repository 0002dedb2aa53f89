"""Real Prometheus scrapes the agent (over HTTP, and over HTTPS with basic auth);
the alert rules load in it and pass promtool's unit tests; every dashboard
query is valid PromQL that Prometheus evaluates."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from testkit.agent import ROOT, running_agent, wait_until
from testkit.certs import make_certs
from testkit.dashboard import as_promql, dashboard_queries, panel_query
from testkit.helm import NAMESPACE, WITHOUT_OPERATOR, install_notes, notes_scrape_job, template
from testkit.manifests import one, render
from testkit.prometheus import (
    KUBERNETES_PODS_RELABELINGS,
    pod_role_targets,
    podmonitor_scrape_config,
    running_prometheus,
)
from testkit.yamldocs import documents

from ..conftest import GIB

RULES = ROOT / "deploy" / "prometheus" / "otel-vgpu-rules.yaml"
RULE_TESTS = ROOT / "tests" / "rules" / "otel-vgpu-rules.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "otel-vgpu-dashboard.json"
PODMONITOR = ROOT / "kustomize" / "components" / "prometheus-operator" / "podmonitor.yaml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is installed by scripts/test.sh (Debian package prometheus)"
    return subprocess.run([binary, *args], capture_output=True, text=True, check=False, cwd=ROOT)


def alert_names() -> list[str]:
    """Every rule's name: alerts and recording rules."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule.get("alert") or rule["record"] for group in groups for rule in group["rules"]]


def test_rules_are_valid_and_their_unit_tests_pass() -> None:
    check = promtool("check", "rules", str(RULES))
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in check.stdout
    # every alert and every recording rule has unit tests
    tests = RULE_TESTS.read_text()
    for name in alert_names():
        assert f"alertname: {name}" in tests or f"expr: {name}" in tests, name
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_rule_unit_tests_can_fail(tmp_path: Path) -> None:
    # The same tests against rules whose thresholds moved must fail.
    (tmp_path / "deploy" / "prometheus").mkdir(parents=True)
    (tmp_path / "tests" / "rules").mkdir(parents=True)
    broken = (
        RULES.read_text()
        .replace("> 1.2", "> 2")
        .replace("for: 2h", "for: 4h")
        .replace("vgpu_agent_blind_gpus > 0", "vgpu_agent_blind_gpus > 1")
    )
    (tmp_path / "deploy" / "prometheus" / RULES.name).write_text(broken)
    (tmp_path / "tests" / "rules" / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    tested = promtool("test", "rules", str(tmp_path / "tests" / "rules" / RULE_TESTS.name))
    assert tested.returncode != 0
    for name in ("VGPUPodOverSMShare", "VGPUAllocationIdle", "VGPUAgentBlind"):
        assert name in tested.stdout + tested.stderr, name


def test_prometheus_scrapes_the_agent_over_http_and_over_tls_with_auth(
    tmp_path: Path, scenario_file: Path, ratio_file: Path
) -> None:
    certs = make_certs(tmp_path / "pki")
    users = tmp_path / "users"
    users.write_text(f"prometheus:sha256:{hashlib.sha256(b'scrape-secret').hexdigest()}\n")
    common = ["--simulate", str(scenario_file), "--allocation-file", str(ratio_file)]
    secure = ["--tls-cert-file", str(certs.cert), "--tls-key-file", str(certs.key), "--basic-auth-file", str(users)]
    with running_agent(*common) as plain, running_agent(*common, *secure, https_ca=certs.ca) as tls:
        plain_target = plain.url.removeprefix("http://")
        tls_target = tls.url.removeprefix("http://")
        scrape_configs = [
            {"job_name": "otel-vgpu", "honor_labels": True, "static_configs": [{"targets": [plain_target]}]},
            {
                "job_name": "otel-vgpu-tls",
                "honor_labels": True,
                "scheme": "https",
                "tls_config": {"ca_file": str(certs.ca)},
                "basic_auth": {"username": "prometheus", "password": "scrape-secret"},
                "static_configs": [{"targets": [tls_target]}],
            },
        ]
        with running_prometheus(tmp_path, scrape_configs, [RULES]) as prometheus:
            for job in ("otel-vgpu", "otel-vgpu-tls"):
                result = prometheus.wait_for(
                    f'vgpu_pod_memory_used_bytes{{job="{job}",namespace="ml",pod="trainer",gpu_id="0"}}'
                )
                assert float(result[0]["value"][1]) == 12 * GIB
                assert result[0]["metric"]["gpu_uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
                # up is per scrape: one late scrape on a loaded machine reads 0,
                # so what is asserted is that the target is scraped successfully.
                assert prometheus.wait_for(f'up{{job="{job}"}} == 1')
            idle = prometheus.query(
                'vgpu_pod_memory_allocated_bytes{job="otel-vgpu"} > 0 and on (namespace, pod, gpu_id) '
                'vgpu_pod_processes{job="otel-vgpu"} == 0'
            )
            assert [r["metric"]["pod"] for r in idle] == ["idle"]
            unattributed = prometheus.query('vgpu_gpu_memory_unattributed_bytes{job="otel-vgpu",gpu_id="0"}')
            assert float(unattributed[0]["value"][1]) == 512 * 1024**2
            target = prometheus.query('target_info{job="otel-vgpu"}')
            assert target[0]["metric"]["service_name"] == "otel-vgpu"

            def loaded_rules() -> list[dict[str, str]]:
                return [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]

            # A rule's health is "unknown" until its first evaluation.
            loaded = wait_until(
                lambda: (rules := loaded_rules()) and all(r["health"] != "unknown" for r in rules) and rules,
                what="every rule evaluated",
            )
            assert sorted(rule["name"] for rule in loaded) == sorted(alert_names()), loaded
            unhealthy = [(r["name"], r["health"], r.get("lastError")) for r in loaded if r["health"] != "ok"]
            assert unhealthy == []

            for query in dashboard_queries():
                # Prometheus rejects invalid PromQL with an error status.
                prometheus.query(as_promql(query))
            # the dashboard's panels find data on a live agent
            assert prometheus.wait_for(as_promql(dashboard_queries()[0]))
            # and the usage row finds every namespace whose pods ran (two scrapes make a rate)
            # (a pod the agent cannot name has no namespace label: its own series, not a namespace's)
            ran = prometheus.query('vgpu_pod_sm_utilization_ratio{job="otel-vgpu"} > 0')
            running = {r["metric"]["namespace"] for r in ran if "namespace" in r["metric"]}
            for title in (
                "GPUs busy by namespace",
                "Power by namespace",
                "GPU-hours and kWh by namespace over the time range",
            ):
                query = panel_query(title)

                def covers(query: str = query) -> list[dict[str, Any]]:
                    # Every running namespace, each with a figure above 0: a rate over two
                    # scrapes of one sweep is 0 until a later sweep moves the counters.
                    found = prometheus.query(query)
                    moved = {r["metric"].get("namespace") for r in found if float(r["value"][1]) > 0}
                    return found if moved >= running else []

                # The counters settle a period up to 17 s after it (docs/chargeback.md: a
                # process that ran waits a figure's window for its next sample), so on a loaded
                # machine a rate may move later than the usual 15 s.
                rows = wait_until(covers, timeout=60, what=f"every running namespace in {title!r}")
                assert running and all(
                    float(r["value"][1]) > 0 for r in rows if r["metric"].get("namespace") in running
                )
        plain.stop()
        tls.stop()


def test_the_namespace_chargeback_gives_each_kai_fraction_s_namespace_its_fraction(tmp_path: Path) -> None:
    # KAI Scheduler's node (tests/data/sharing/kai.yaml): its BindRequests give team-a half of GPU 0,
    # team-b a quarter and 0.20 of it; team-c holds GPU 1 whole, and nothing for the pod that wrote
    # gpu-fraction "1" itself; KAI's reservation pod, holding GPU 0, is in no namespace's bill.
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("auto\n")
    kai = ROOT / "tests" / "data" / "sharing" / "kai.yaml"
    expected = {"team-a": 0.5, "team-b": 0.45, "team-c": 1.0}
    with running_agent("--simulate", str(kai), "--allocation-file", str(ratio), "--no-kubernetes") as agent:
        target = agent.url.removeprefix("http://")
        scrape = [{"job_name": "otel-vgpu", "honor_labels": True, "static_configs": [{"targets": [target]}]}]
        with running_prometheus(tmp_path, scrape, [RULES]) as prometheus:

            def held() -> dict[str, float]:
                found = prometheus.query("namespace:vgpu_allocated:gpus")
                by_namespace = {r["metric"]["namespace"]: float(r["value"][1]) for r in found}
                return by_namespace if expected.keys() <= by_namespace.keys() else {}

            allocated = wait_until(held, what="every namespace's GPUs allocated", timeout=30)
            busy = {r["metric"]["namespace"] for r in prometheus.query("namespace:vgpu_sm_busy:gpus")}
        agent.stop()
    assert allocated == pytest.approx(expected)
    assert "kai-resource-reservation" not in busy


def test_dashboard_names_only_families_the_agent_serves() -> None:
    served = {
        "vgpu_pod_memory_used_bytes",
        "vgpu_pod_memory_allocated_bytes",
        "vgpu_pod_sm_utilization_ratio",
        "vgpu_pod_vgpu_utilization_ratio",
        "vgpu_pod_processes",
        "vgpu_gpu_memory_total_bytes",
        "vgpu_gpu_memory_used_bytes",
        "vgpu_gpu_sm_utilization_ratio",
        "vgpu_gpu_vgpus",
        "vgpu_gpu_memory_unattributed_bytes",
        "vgpu_pod_sm_busy_seconds_total",
        "vgpu_pod_energy_joules_total",
        "vgpu_gpu_energy_unattributed_joules_total",
        "vgpu_gpu_memory_copy_utilization_ratio",
        "vgpu_pod_decoder_utilization_ratio",
        "vgpu_pod_encoder_utilization_ratio",
        "vgpu_pod_jpeg_utilization_ratio",
        "vgpu_pod_optical_flow_utilization_ratio",
        "vgpu_agent_collection_errors_total",
        "vgpu_agent_collection_duration_seconds_bucket",
        "vgpu_gpu_temperature_celsius",
        "vgpu_gpu_memory_temperature_celsius",
        "vgpu_gpu_power_watts",
        "vgpu_gpu_power_limit_watts",
        "vgpu_gpu_xid_errors_total",
        "vgpu_gpu_power_violation_seconds_total",
        "vgpu_gpu_thermal_violation_seconds_total",
        "vgpu_gpu_tensor_active_ratio",
        "vgpu_gpu_dram_active_ratio",
        "vgpu_pod_tensor_active_ratio",
        "process_resident_memory_bytes",
        "up",
    }
    named = set()
    for query in dashboard_queries():
        named |= set(re.findall(r"\b(vgpu_\w+|process_\w+|up)\b(?=\s*[{)\[]|\s*$|\s*[/>=])", query))
    assert named and named <= served, named - served
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {"Idle allocations", "Unattributed GPU memory", "SM use against the pod's share"} <= titles
    assert {"Usage and energy by namespace", "GPUs busy by namespace", "Power by namespace"} <= titles
    assert {"GPU health", "XID errors by code", "Efficiency (GPM, Hopper and newer)"} <= titles


def test_the_dashboard_follows_the_fleet() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    assert variables == ["datasource", "cluster", "node", "namespace", "pod"]
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            # Legends name nodes and pods, never a pod IP:port.
            assert "{{instance}}" not in target.get("legendFormat", ""), panel["title"]
            if "vgpu_pod_" in target["expr"]:
                assert 'pod=~"$pod"' in target["expr"] and 'node=~"$node"' in target["expr"], panel["title"]
    top = next(p for p in dashboard["panels"] if p["title"].startswith("Top 20 pods"))
    assert {t["refId"] for t in top["targets"]} == {"used", "allocated", "of_allocation"}


def test_the_operators_scrape_leaves_tenants_labels_their_own(
    tmp_path: Path, scenario_file: Path, ratio_file: Path
) -> None:
    """The prometheus-operator overlay's PodMonitor, rendered as the operator
    renders it, scraped by the real Prometheus: no series gets the agent's
    own container, pod or namespace; a control job without the overlay's
    relabelings shows the defect it prevents."""
    podmonitor = yaml.safe_load(PODMONITOR.read_text())
    common = ["--simulate", str(scenario_file), "--allocation-file", str(ratio_file)]
    with running_agent(*common) as plain, running_agent(*common, "--by-container") as per_container:
        nodes = {plain.url.removeprefix("http://"): "node-a", per_container.url.removeprefix("http://"): "node-b"}
        scrape_configs = [
            podmonitor_scrape_config(podmonitor, nodes),
            podmonitor_scrape_config(podmonitor, nodes, with_own=False),
        ]
        with running_prometheus(tmp_path, scrape_configs, []) as prometheus:
            fixed = 'job="otel-vgpu/otel-vgpu"'
            prometheus.wait_for(f'vgpu_pod_memory_used_bytes{{{fixed},node="node-a",pod="trainer"}}')
            prometheus.wait_for(f'vgpu_pod_memory_used_bytes{{{fixed},node="node-b",pod="trainer"}}')
            # Tenants keep their own pod and namespace, and have no container label without --by-container.
            tenants = prometheus.query(f'vgpu_pod_memory_used_bytes{{{fixed},node="node-a"}}')
            assert {(r["metric"].get("namespace"), r["metric"]["pod"]) for r in tenants} >= {("ml", "trainer")}
            assert [r["metric"] for r in tenants if "container" in r["metric"]] == []
            # A pod the API does not know keeps an empty namespace, not the agent's.
            assert [r["metric"] for r in tenants if r["metric"].get("namespace") == "otel-vgpu"] == []
            # With --by-container, the containers are the tenants' own.
            containers = {
                r["metric"].get("container") for r in prometheus.query(f'vgpu_pod_processes{{{fixed},node="node-b"}}')
            }
            assert "otel-vgpu" not in containers and "main" in containers
            # GPU and agent series carry no pod: they are the node's, told apart by node and instance.
            for family in ("vgpu_gpu_memory_total_bytes", "vgpu_agent_blind_gpus"):
                series = prometheus.query(f"{family}{{{fixed}}}")
                assert series and all("pod" not in r["metric"] and r["metric"]["node"] for r in series), family
            # The dashboard's per-node panels and its top-pods table find the nodes.
            top = next(p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"].startswith("Top 20"))
            rows = prometheus.wait_for(as_promql(top["targets"][0]["expr"]))
            assert {r["metric"].get("node") for r in rows if r["metric"].get("node")} >= {"node-a"}
            # The control: the operator's labels alone put the agent's container on every tenant.
            plain_address = plain.url.removeprefix("http://")
            bare = prometheus.wait_for(
                f'vgpu_pod_memory_used_bytes{{job="without-its-relabelings",instance="{plain_address}"}}'
            )
            assert {r["metric"].get("container") for r in bare} == {"otel-vgpu"}
        plain.stop()
        per_container.stop()


def test_on_openshift_the_platform_prometheus_keeps_tenants_namespaces_and_user_workload_would_not(
    tmp_path: Path, scenario_file: Path, ratio_file: Path
) -> None:
    """The openshift overlay's PodMonitor as the operator renders it for the
    platform Prometheus (as written) and for the user-workload one
    (overrideHonorLabels, enforcedNamespaceLabel: namespace), scraped by the
    real Prometheus: only the platform keeps a tenant's namespace in
    `namespace`, which is why the overlay is scraped there."""
    podmonitor = one(render("openshift"), "PodMonitor", "otel-vgpu")
    common = ["--simulate", str(scenario_file), "--allocation-file", str(ratio_file)]
    with running_agent(*common) as agent:
        nodes = {agent.url.removeprefix("http://"): "node-a"}
        platform = podmonitor_scrape_config(podmonitor, nodes)
        user_workload = podmonitor_scrape_config(podmonitor, nodes, enforced_namespace="otel-vgpu")
        user_workload["job_name"] += "-user-workload"
        user_workload["relabel_configs"].insert(-1, {"target_label": "job", "replacement": "user-workload"})
        with running_prometheus(tmp_path, [platform, user_workload], []) as prometheus:
            kept = prometheus.wait_for('vgpu_pod_memory_used_bytes{job="otel-vgpu/otel-vgpu",pod="trainer"}')
            assert {r["metric"].get("namespace") for r in kept} == {"ml"}
            assert all("exported_namespace" not in r["metric"] for r in kept)
            taken = prometheus.wait_for('vgpu_pod_memory_used_bytes{job="user-workload",pod="trainer"}')
            assert {r["metric"]["namespace"] for r in taken} == {"otel-vgpu"}, "every tenant in the agent's namespace"
            assert {r["metric"].get("exported_namespace") for r in taken} == {"ml"}
        agent.stop()


# The chart's monitor in each endpoint mode, put into the real Prometheus's scrape config as
# the Prometheus Operator puts it (testkit/prometheus.py endpoint_http_config, with its source),
# scraping an agent started with the same certificates and users: the monitor reaches it.
MODES = {
    "tls": (["--set", "tls.enabled=true"], []),
    "mutual-tls": (
        ["--set", "tls.enabled=true", "--set", "tls.clientCA=true", "--set", "tls.scraperSecretName=prometheus-client"],
        ["--tls-client-ca-file"],
    ),
    "basic-auth": (
        [
            "--set",
            "tls.enabled=true",
            "--set",
            "basicAuth.enabled=true",
            "--set",
            "basicAuth.scraperSecretName=scraper",
        ],
        ["--basic-auth-file"],
    ),
}


@pytest.mark.parametrize("mode", MODES)
def test_the_charts_monitor_scrapes_the_agent_in_each_endpoint_mode(
    mode: str, tmp_path: Path, scenario_file: Path, ratio_file: Path
) -> None:
    values, flags = MODES[mode]
    # The test certificate names localhost: the value a user sets to the name theirs holds.
    chart = template(*values, "--set", "prometheus.podMonitor.enabled=true", "--set", "tls.serverName=localhost")
    (monitor,) = [d for d in documents(chart) if d["kind"] == "PodMonitor"]
    certs = make_certs(tmp_path / "pki")
    users = tmp_path / "users"
    users.write_text(f"prometheus:{bcrypt.hashpw(b'scrape-secret', bcrypt.gensalt(rounds=4)).decode()}\n")
    secrets = {
        ("otel-vgpu-tls", "ca.crt"): certs.ca.read_bytes(),
        ("prometheus-client", "tls.crt"): certs.client_cert.read_bytes(),
        ("prometheus-client", "tls.key"): certs.client_key.read_bytes(),
        ("scraper", "username"): b"prometheus",
        ("scraper", "password"): b"scrape-secret",
    }
    agent_args = ["--tls-cert-file", str(certs.cert), "--tls-key-file", str(certs.key)]
    agent_args += [*(["--tls-client-ca-file", str(certs.ca)] if "--tls-client-ca-file" in flags else [])]
    agent_args += [*(["--basic-auth-file", str(users)] if "--basic-auth-file" in flags else [])]
    assets = tmp_path / "certs"
    assets.mkdir()
    client = certs if "--tls-client-ca-file" in flags else None
    with running_agent(
        "--simulate", str(scenario_file), "--allocation-file", str(ratio_file), *agent_args,
        https_ca=certs.ca, https_client=client,
    ) as agent:  # fmt: skip
        nodes = {agent.url.removeprefix("http://"): "node-a"}
        through_monitor = podmonitor_scrape_config(monitor, nodes, secrets=secrets, assets=assets)
        # A control: the same monitor as the chart rendered it before it carried the endpoint's
        # settings (scheme https alone), which reaches no agent that asks for more than HTTPS.
        bare = copy.deepcopy(monitor)
        for key in ("tlsConfig", "basicAuth", "authorization"):
            bare["spec"]["podMetricsEndpoints"][0].pop(key, None)
        control = podmonitor_scrape_config(bare, nodes, with_own=False)
        with running_prometheus(tmp_path, [through_monitor, control], []) as prometheus:
            job = f'job="{NAMESPACE}/{monitor["metadata"]["name"]}"'
            prometheus.wait_for(f"up{{{job}}} == 1")
            prometheus.wait_for(f'vgpu_pod_memory_used_bytes{{{job},pod="trainer"}}')
            down = prometheus.wait_for('up{job="without-its-relabelings"}')
            assert [r["value"][1] for r in down] == ["0"], "the control reached the agent"


def test_without_the_operator_the_annotations_and_the_notes_job_scrape_the_agent_keeping_tenants_labels(
    tmp_path: Path, scenario_file: Path, ratio_file: Path
) -> None:
    """A default install on a cluster without the Prometheus Operator: the pods' prometheus.io
    annotations, read by the prometheus-community chart's kubernetes-pods job, and the job the
    notes print, each scrape the agent with the tenants' namespace and pod kept; a control
    without honor_labels shows what the notes warn of."""
    common = ["--simulate", str(scenario_file), "--allocation-file", str(ratio_file)]
    with running_agent(*common) as agent:
        address = agent.url.removeprefix("http://")
        port = address.rpartition(":")[2]
        # The chart as installed with the agent's port, so that the annotations name it.
        rendered = documents(template("--set", f"service.port={port}", kinds=WITHOUT_OPERATOR))
        pod = one(rendered, "DaemonSet")["spec"]["template"]
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == port
        (agent_pod,) = pod_role_targets(pod, NAMESPACE, {address: "node-a"})
        # Another release's pod in the namespace, not annotated and not listening: scraped by neither.
        other = copy.deepcopy(pod)
        other["metadata"]["labels"]["app.kubernetes.io/instance"] = "another"
        other["metadata"]["annotations"] = {}
        (decoy,) = pod_role_targets(other, NAMESPACE, {"127.0.0.1:1": "node-b"})
        notes_job = notes_scrape_job(install_notes("--set", f"service.port={port}"))
        assert notes_job.pop("kubernetes_sd_configs") == [{"role": "pod", "namespaces": {"names": [NAMESPACE]}}]
        notes_job.update(scrape_interval="1s", scrape_timeout="1s", static_configs=[agent_pod, decoy])
        annotations_job = {
            "job_name": "kubernetes-pods",
            "honor_labels": True,
            "relabel_configs": KUBERNETES_PODS_RELABELINGS,
            "static_configs": [agent_pod, decoy],
        }
        control = {
            **annotations_job,
            "job_name": "without-honor-labels",
            "honor_labels": False,
            "static_configs": [agent_pod],
        }
        with running_prometheus(tmp_path, [notes_job, annotations_job, control], []) as prometheus:
            for job in ("otel-vgpu", "kubernetes-pods"):
                kept = prometheus.wait_for(
                    f'vgpu_pod_memory_used_bytes{{job="{job}",namespace="ml",pod="trainer",node="node-a"}}'
                )
                assert all("exported_namespace" not in r["metric"] for r in kept), job
                assert [r["metric"]["instance"] for r in prometheus.query(f'up{{job="{job}"}}')] == [address], job
            # The notes' job, as the monitors: GPU series are the node's, with no pod of the agent's.
            gpus = prometheus.query('vgpu_gpu_memory_total_bytes{job="otel-vgpu"}')
            assert gpus and all("pod" not in r["metric"] and r["metric"]["node"] == "node-a" for r in gpus)
            # Without honor_labels the agent's namespace takes the tenants' place.
            taken = prometheus.wait_for('vgpu_pod_memory_used_bytes{job="without-honor-labels",exported_pod="trainer"}')
            assert {r["metric"]["namespace"] for r in taken} == {NAMESPACE}
            assert {r["metric"]["exported_namespace"] for r in taken} == {"ml"}
        agent.stop()
