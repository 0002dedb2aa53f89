"""A real Prometheus server (Debian's `prometheus` package) for the end-to-end tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testkit.agent import free_port


@dataclass
class Prometheus:
    url: str
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for(self, expr: str, timeout: float = 30) -> list[dict[str, Any]]:
        """Poll until `expr` returns something (the first scrape takes seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = self.query(expr)
            except OSError:
                result = []
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"no result for {expr} after {timeout} s; log:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)


@contextmanager
def running_prometheus(
    tmp_path: Path, scrape_configs: list[dict[str, Any]], rule_files: list[Path]
) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is installed by scripts/test.sh (Debian package prometheus)"
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": scrape_configs,
    }
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    prometheus = Prometheus(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("prometheus did not start:\n" + log.read_text()[-3000:])
            time.sleep(0.2)
        yield prometheus
    finally:
        process.terminate()
        process.wait(timeout=15)


# What the Prometheus Operator generates for a PodMonitor endpoint
# (prometheus-operator pkg/prometheus/promcfg.go, generatePodMonitorConfig):
# the job kept in a temporary label, the selector and port kept, namespace,
# container and pod from the pod, job and endpoint, then the endpoint's own
# relabelings.
def podmonitor_scrape_config(
    podmonitor: dict[str, Any],
    targets: dict[str, str],
    with_own: bool = True,
    enforced_namespace: str | None = None,
    secrets: Mapping[tuple[str, str], bytes] | None = None,
    assets: Path | None = None,
) -> dict[str, Any]:
    """A scrape config as the operator renders the PodMonitor's first
    endpoint, for agents' pods at `targets` (address -> node; the pods'
    discovery labels set by hand, as kubernetes_sd would).

    `enforced_namespace`: as for a Prometheus with `overrideHonorLabels: true`
    and `enforcedNamespaceLabel: namespace` (OpenShift's user-workload
    monitoring): honor_labels false (promcfg.go, "if OverrideHonorLabels is
    true then honor_labels is always false"), and namespace=<the PodMonitor's
    namespace> appended last to the relabelings and the metric relabelings
    (pkg/namespacelabeler, GetRelabelingConfigs).

    `secrets`: the monitor's namespace's Secrets, (name, key) -> value, for the endpoint's
    scheme, tlsConfig, basicAuth and authorization (`endpoint_http_config`); `assets`: the
    directory the operator mounts its TLS assets at."""
    meta = podmonitor["metadata"]
    spec = podmonitor["spec"]
    endpoint = spec["podMetricsEndpoints"][0]
    relabel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    discovered = {
        "__meta_kubernetes_namespace": "otel-vgpu",
        "__meta_kubernetes_pod_container_name": "otel-vgpu",
        "__meta_kubernetes_pod_container_port_name": endpoint["port"],
    }
    for key, value in spec["selector"]["matchLabels"].items():
        name = "".join(c if c.isalnum() else "_" for c in key)
        discovered[f"__meta_kubernetes_pod_label_{name}"] = value
        discovered[f"__meta_kubernetes_pod_labelpresent_{name}"] = "true"
        relabel.append(
            {
                "action": "keep",
                "source_labels": [f"__meta_kubernetes_pod_label_{name}", f"__meta_kubernetes_pod_labelpresent_{name}"],
                "regex": f"({value});true",
            }
        )
    relabel += [
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"]},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{meta.get('namespace', 'otel-vgpu')}/{meta['name']}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    if not with_own:
        # A control: its series told apart from the real job's.
        relabel.append({"target_label": "job", "replacement": "without-its-relabelings"})
    if with_own:
        for rule in endpoint.get("relabelings", []):
            relabel.append(
                {
                    {"sourceLabels": "source_labels", "targetLabel": "target_label"}.get(key, key): value
                    for key, value in rule.items()
                }
            )
    enforced: list[dict[str, Any]] = []
    if enforced_namespace is not None:
        enforced = [{"target_label": "namespace", "replacement": enforced_namespace}]
        relabel += enforced
    return {
        **endpoint_http_config(endpoint, meta.get("namespace", "otel-vgpu"), secrets or {}, assets),
        "job_name": f"podMonitor/otel-vgpu/{meta['name']}/0{'' if with_own else '-without-its-relabelings'}",
        "honor_labels": bool(endpoint.get("honorLabels")) and enforced_namespace is None,
        **({"metric_relabel_configs": enforced} if enforced else {}),
        "metrics_path": endpoint.get("path", "/metrics"),
        "static_configs": [
            {
                "targets": [address],
                "labels": {
                    **discovered,
                    "__meta_kubernetes_pod_name": f"otel-vgpu-{node}",
                    "__meta_kubernetes_pod_node_name": node,
                },
            }
            for address, node in targets.items()
        ],
        "relabel_configs": relabel,
    }


# How the Prometheus Operator writes an endpoint's HTTP settings (prometheus-operator
# 6adcebc5076c34f4f55f8f5f7b1e528929373ac7): pkg/prometheus/promcfg.go
# generatePodMonitorConfig (scheme lowercased by Scheme.String, never defaulted),
# addSafeTLStoYaml (ca_file, cert_file and key_file under the TLS assets directory,
# /etc/prometheus/certs in pkg/prometheus/common.go, each named by pkg/assets/tls.go's
# tlsAssetKey "<0 for a Secret>_<namespace>_<name>_<key>"; server_name and
# insecure_skip_verify as given), addBasicAuthToYaml (username and password inline, read
# from the Secrets) and addSafeAuthorizationToYaml (type, Bearer where empty, and
# credentials inline). The Secrets are the monitor's own namespace's.
def endpoint_http_config(
    endpoint: Mapping[str, Any], namespace: str, secrets: Mapping[tuple[str, str], bytes], assets: Path | None
) -> dict[str, Any]:
    def value(selector: Mapping[str, str]) -> bytes:
        found = secrets.get((selector["name"], selector["key"]))
        assert found is not None, (
            f"no Secret {namespace}/{selector['name']} key {selector['key']}: the operator drops the monitor"
        )
        return found

    def asset(selector: Mapping[str, str]) -> str:
        assert assets is not None, "a tlsConfig needs the TLS assets directory"
        path = assets / f"0_{namespace}_{selector['name']}_{selector['key']}"
        path.write_bytes(value(selector))
        return str(path)

    out: dict[str, Any] = {}
    if "scheme" in endpoint:
        out["scheme"] = str(endpoint["scheme"]).lower()
    tls = endpoint.get("tlsConfig")
    if tls:
        config: dict[str, Any] = {}
        if "secret" in tls.get("ca", {}):
            config["ca_file"] = asset(tls["ca"]["secret"])
        if "secret" in tls.get("cert", {}):
            config["cert_file"] = asset(tls["cert"]["secret"])
        if "keySecret" in tls:
            config["key_file"] = asset(tls["keySecret"])
        if tls.get("serverName"):
            config["server_name"] = tls["serverName"]
        if "insecureSkipVerify" in tls:
            config["insecure_skip_verify"] = tls["insecureSkipVerify"]
        out["tls_config"] = config
    if "basicAuth" in endpoint:
        basic = endpoint["basicAuth"]
        out["basic_auth"] = {
            "username": value(basic["username"]).decode(),
            "password": value(basic["password"]).decode(),
        }
    if "authorization" in endpoint:
        authorization = endpoint["authorization"]
        out["authorization"] = {
            "type": (authorization.get("type") or "Bearer").strip(),
            "credentials": value(authorization["credentials"]).decode(),
        }
    return out


def label_name(key: str) -> str:
    """A Kubernetes label or annotation key as service discovery names it in a meta label
    (Prometheus' strutil.SanitizeLabelName: every other character than [a-zA-Z0-9_] is _)."""
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in key)


def _relabeling(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A monitor's relabeling (camelCase) as the operator writes it in the scrape config
    (generateRelabelConfig: snake_case, the action lowercased)."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    out = {keys.get(key, key): value for key, value in rule.items()}
    if "action" in out:
        out["action"] = str(out["action"]).lower()
    return out


# What the Prometheus Operator generates for a ServiceMonitor endpoint (prometheus-operator
# 6adcebc5076c34f4f55f8f5f7b1e528929373ac7, pkg/prometheus/promcfg.go,
# generateServiceMonitorConfig; its output for one in pkg/prometheus/testdata/
# ServiceMonitorObjectWithMatchLabelSelector.golden): honor_labels as the endpoint says
# (AddHonorLabels, false unless set), the role endpoints, the job kept in a temporary
# label (initRelabelings), the Service's labels and the endpoint's port kept, node or pod
# from the endpoint's target, namespace, service, pod and container, pods not Failed or
# Succeeded (generateRunningFilter), job from the Service's name, endpoint from the port
# name, then the endpoint's own relabelings, then the shard's (appendShardingRelabelingWithLabel,
# $(SHARD) being 0 for one shard). `instance` is left to Prometheus: the target's address. The
# endpoint's interval and timeout are left out: the test's Prometheus scrapes every second.
def servicemonitor_scrape_config(
    servicemonitor: dict[str, Any], service: dict[str, Any], targets: dict[str, str]
) -> dict[str, Any]:
    """A scrape config as the operator renders the ServiceMonitor's first endpoint for
    `service`'s endpoints at `targets` (address -> node; each a pod of the agent, its
    discovery labels set by hand, as kubernetes_sd's endpoints role would)."""
    meta = servicemonitor["metadata"]
    endpoint = servicemonitor["spec"]["endpoints"][0]
    namespace = service["metadata"]["namespace"]
    relabel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key, value in sorted(servicemonitor["spec"]["selector"]["matchLabels"].items()):
        name = label_name(key)
        relabel.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_service_label_{name}",
                    f"__meta_kubernetes_service_labelpresent_{name}",
                ],
                "regex": f"({value});true",
            }
        )
    target = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"]
    relabel += [
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": endpoint["port"]},
        {
            "source_labels": target,
            "separator": ";",
            "regex": "Node;(.*)",
            "replacement": "${1}",
            "target_label": "node",
        },
        {"source_labels": target, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
        *(_relabeling(rule) for rule in endpoint.get("relabelings", [])),
        {
            "source_labels": ["__address__", "__tmp_hash"],
            "target_label": "__tmp_hash",
            "regex": "(.+);",
            "replacement": "$1",
            "action": "replace",
        },
        {"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
        {"source_labels": ["__tmp_hash", "__tmp_disable_sharding"], "regex": "0;|.+;.+", "action": "keep"},
    ]
    discovered = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_service_name": service["metadata"]["name"],
        "__meta_kubernetes_endpoint_port_name": endpoint["port"],
        "__meta_kubernetes_endpoint_ready": "true",
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_pod_container_name": "otel-vgpu",
        "__meta_kubernetes_pod_phase": "Running",
    }
    for key, value in service["metadata"].get("labels", {}).items():
        discovered[f"__meta_kubernetes_service_label_{label_name(key)}"] = value
        discovered[f"__meta_kubernetes_service_labelpresent_{label_name(key)}"] = "true"
    return {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/0",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "static_configs": [
            {
                "targets": [address],
                "labels": {
                    **discovered,
                    "__meta_kubernetes_endpoint_address_target_name": f"otel-vgpu-{node}",
                    "__meta_kubernetes_pod_name": f"otel-vgpu-{node}",
                    "__meta_kubernetes_pod_node_name": node,
                },
            }
            for address, node in targets.items()
        ],
        "relabel_configs": relabel,
    }


# The job that scrapes annotated pods, as prometheus-community/helm-charts writes it
# (cf408a290aec489277a94450bb3511432477a53a, charts/prometheus/values.yaml,
# scrapeConfigs.kubernetes-pods; chart 29.27.0): pods annotated prometheus.io/scrape "true",
# scheme, path and port from their annotations, every pod label a target label, then
# namespace, pod and node from the pod; honor_labels true. The relabelings as written there.
KUBERNETES_PODS_RELABELINGS: list[dict[str, Any]] = yaml.safe_load(r"""
- source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape]
  action: keep
  regex: true
- source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape_slow]
  action: drop
  regex: true
- source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scheme]
  action: replace
  regex: (https?)
  target_label: __scheme__
- source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_path]
  action: replace
  target_label: __metrics_path__
  regex: (.+)
- source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_port, __meta_kubernetes_pod_ip]
  action: replace
  regex: (\d+);(([A-Fa-f0-9]{1,4}::?){1,7}[A-Fa-f0-9]{1,4})
  replacement: '[$2]:$1'
  target_label: __address__
- source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_port, __meta_kubernetes_pod_ip]
  action: replace
  regex: (\d+);((([0-9]+?)(\.|$)){4})
  replacement: $2:$1
  target_label: __address__
- action: labelmap
  regex: __meta_kubernetes_pod_annotation_prometheus_io_param_(.+)
  replacement: __param_$1
- action: labelmap
  regex: __meta_kubernetes_pod_label_(.+)
- source_labels: [__meta_kubernetes_namespace]
  action: replace
  target_label: namespace
- source_labels: [__meta_kubernetes_pod_name]
  action: replace
  target_label: pod
- source_labels: [__meta_kubernetes_pod_phase]
  regex: Pending|Succeeded|Failed|Completed
  action: drop
- source_labels: [__meta_kubernetes_pod_node_name]
  action: replace
  target_label: node
""")


def pod_role_targets(pod_template: dict[str, Any], namespace: str, targets: dict[str, str]) -> list[dict[str, Any]]:
    """Static targets as kubernetes_sd's pod role gives the metrics port of each agent's pod made
    from `pod_template` (a DaemonSet's), at `targets` (address -> node): the pod's labels and
    annotations, its IP, node and phase, the container and its port. The agents listen on free
    ports here, not on the template's: the port number, and a prometheus.io/port annotation
    where the pod has one, are the agent's."""
    (container,) = pod_template["spec"]["containers"]
    (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
    metadata = pod_template["metadata"]
    discovered = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_container_name": container["name"],
        "__meta_kubernetes_pod_container_port_name": port["name"],
    }
    for kind, values in (("label", metadata.get("labels", {})), ("annotation", metadata.get("annotations", {}))):
        for key, value in values.items():
            discovered[f"__meta_kubernetes_pod_{kind}_{label_name(key)}"] = value
            discovered[f"__meta_kubernetes_pod_{kind}present_{label_name(key)}"] = "true"

    def pod(address: str, node: str) -> dict[str, str]:
        ip, number = address.rsplit(":", 1)
        annotated = "__meta_kubernetes_pod_annotation_prometheus_io_port" in discovered
        return {
            **discovered,
            **({"__meta_kubernetes_pod_annotation_prometheus_io_port": number} if annotated else {}),
            "__meta_kubernetes_pod_container_port_number": number,
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_name": f"otel-vgpu-{node}",
            "__meta_kubernetes_pod_node_name": node,
        }

    return [{"targets": [address], "labels": pod(address, node)} for address, node in targets.items()]


def annotation_scrape_config(
    pod_template: dict[str, Any],
    namespace: str,
    targets: dict[str, str],
    job_name: str = "kubernetes-pods",
    honor_labels: bool = True,
) -> dict[str, Any]:
    """The kubernetes-pods job over the agent's pods (`pod_role_targets`)."""
    annotations = pod_template["metadata"].get("annotations", {})
    assert annotations.get("prometheus.io/scrape") == "true", "the pods are not annotated for scraping"
    return {
        "job_name": job_name,
        "honor_labels": honor_labels,
        "static_configs": pod_role_targets(pod_template, namespace, targets),
        "relabel_configs": KUBERNETES_PODS_RELABELINGS,
    }
