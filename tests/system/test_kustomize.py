"""The manifests: every overlay renders with kubectl kustomize, validates
against Kubernetes' schemas, and keeps the DaemonSet's invariants."""

from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_vgpu.config import parse_config
from testkit.agent import ROOT, running_agent
from testkit.crds import problems
from testkit.manifests import (
    COMPONENTS,
    KUBELET_ROOTS,
    KUSTOMIZE,
    OVERLAYS,
    POD_FIELDS,
    TARGETS,
    agent_container,
    cli_flags,
    container_environment,
    daemonset,
    flag_values,
    one,
    render,
    rendered_text,
    validate_strictly,
)
from testkit.scripts import load as load_script
from testkit.yamldocs import documents

# Overlays that knowingly differ from the base's security context, and why
# (each says so in its kustomization.yaml).
PRIVILEGED = {"gke"}  # opens host device nodes the device plugin did not assign
NON_ROOT = {"non-root"}  # gives up the root-only pod-resources socket
# NVML without the `nvidia` RuntimeClass: the node's default runtime (or CRI-O's
# OCI hook) injects it, the NRI plugin does on the pod's annotation, or GKE's
# driver is mounted.
NO_RUNTIME_CLASS = {"nvidia-default-runtime", "gke", "eks", "aks", "hami", "openshift-oci-hook", "openshift-nri"}
OPENSHIFT = {"openshift", "openshift-oci-hook", "openshift-nri"}
# The overlays with a Collector gateway, and the configuration each runs (collector-config/<it>).
GATEWAYS = {"otlp": "gateway", "otlp-semconv": "semconv"}
# The base's node-affinity terms, as the NVIDIA device plugin's chart has them,
# and what each cluster's overlay adds to them (ORed).
GPU_NODE_TERMS = {
    ("nvidia.com/gpu.present", "In", ("true",)),
    ("feature.node.kubernetes.io/pci-10de.present", "In", ("true",)),
    ("feature.node.kubernetes.io/cpu-model.vendor_id", "In", ("NVIDIA",)),
}
ADDED_TERMS: dict[str, set[tuple[str, str, tuple[str, ...]]]] = {
    "eks": {
        ("eks.amazonaws.com/instance-gpu-manufacturer", "In", ("nvidia",)),
        ("karpenter.k8s.aws/instance-gpu-manufacturer", "In", ("nvidia",)),
    },
    "aks": {("kubernetes.azure.com/accelerator", "In", ("nvidia",))},
    "gke": {("cloud.google.com/gke-accelerator", "Exists", ())},
    "gke-gpu-operator": {("cloud.google.com/gke-accelerator", "Exists", ())},
    "hami": {("gpu", "In", ("on",))},
}


def test_every_overlay_and_component_is_documented() -> None:
    readme = (KUSTOMIZE / "README.md").read_text()
    expected = {"prometheus-operator", "otlp", "nvidia-default-runtime", "non-root", "gke", "openshift", "seed-compat"}
    assert expected <= set(OVERLAYS)
    for name in (*OVERLAYS, *COMPONENTS):
        assert re.search(rf"^\| `{re.escape(name)}` \| .+\|$", readme, re.MULTILINE), name


@pytest.mark.parametrize("target", TARGETS)
def test_renders_and_validates_strictly(target: str, tmp_path: Path) -> None:
    validate_strictly(rendered_text(target), tmp_path / f"{target}.yaml")


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_component_applies_to_the_base_alone(component: str, tmp_path: Path) -> None:
    # One line in a kustomization of one's own: base plus this component renders and validates.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        "resources:\n"
        f"  - {os.path.relpath(KUSTOMIZE / 'base', mine)}\n"
        "components:\n"
        f"  - {os.path.relpath(KUSTOMIZE / 'components' / component, mine)}\n"
    )
    text = rendered_text(mine)
    assert text != rendered_text("base"), "the component changes nothing"
    validate_strictly(text, tmp_path / f"{component}.yaml")


def test_the_crd_check_refuses_what_the_api_server_would() -> None:
    scc = one(render("openshift"), "SecurityContextConstraints", "otel-vgpu")
    assert problems(scc) == []
    without_priority = {k: v for k, v in scc.items() if k != "priority"}
    assert problems(without_priority) == ["(root): 'priority' is a required property"]
    monitor = one(render("prometheus-operator"), "PodMonitor", "otel-vgpu")
    monitor["spec"]["podMetricsEndpoints"][0]["honourLabels"] = True
    assert problems(monitor) and "honourLabels" in problems(monitor)[0]


def terms_of(pod: dict[str, Any]) -> set[tuple[str, str, tuple[str, ...]]]:
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(len(term["matchExpressions"]) == 1 for term in terms), "one label each, ORed"
    return {(e["key"], e["operator"], tuple(e.get("values", ()))) for t in terms for e in t["matchExpressions"]}


@pytest.mark.parametrize("target", TARGETS)
def test_daemonset_invariants(target: str) -> None:
    ds = daemonset(target)
    pod = ds["spec"]["template"]["spec"]
    container = agent_container(target)
    flags = flag_values(container)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}

    # the host's PID namespace: NVML lists only the processes in the caller's
    assert pod["hostPID"] is True
    assert "--proc-root" not in flags, "with hostPID the container's own /proc is the host's"
    assert all(v.get("hostPath", {}).get("path") != "/proc" for v in volumes.values())
    # NVML from the NVIDIA runtime class, unless the overlay says otherwise
    if target in NO_RUNTIME_CLASS:
        assert "runtimeClassName" not in pod
    else:
        assert pod["runtimeClassName"] == "nvidia"
    # the node's name from the downward API
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # the kubelet's pod-resources socket, read-only, under the cluster's kubelet root
    root = KUBELET_ROOTS.get(target, "/var/lib/kubelet")
    socket_dir = next(
        m for m in mounts.values() if volumes[m["name"]].get("hostPath", {}).get("path") == f"{root}/pod-resources"
    )
    assert flags["--pod-resources-socket"].startswith(socket_dir["mountPath"] + "/")
    # NVML without taking a GPU
    if target != "gke":
        assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
        assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    if target == "openshift-nri":
        assert annotations["nvidia.cdi.k8s.io/container.otel-vgpu"] == "nvidia.com/gpu=all"
    else:
        assert not [key for key in annotations if key.startswith("nvidia.cdi.k8s.io/")]
    resources = container["resources"]
    assert "nvidia.com/gpu" not in str(resources) and "nvidia.com/gpu" not in str(pod.get("overhead", ""))
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
    # every mount read-only but the in-memory /tmp; every hostPath mounted read-only
    for name, mount in mounts.items():
        if "emptyDir" not in volumes[name]:
            assert mount.get("readOnly") is True, name
    # probes on the paths the agent serves
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"]["port"] in port_names
    # scheduling: every taint tolerated; the nodes chosen by ORed label terms,
    # the base's and the cluster's own; a nodeSelector only for the operator's
    # client label, which its driver manager looks for there
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert terms_of(pod) == GPU_NODE_TERMS | ADDED_TERMS.get(target, set())
    if target == "gpu-operator":
        assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.client": "true"}
    else:
        assert "nodeSelector" not in pod
    # nothing mounted over /etc/nvidia, where CDI hooks write (nvidia-container-toolkit #2026)
    assert not [m for m in container["volumeMounts"] if m["mountPath"].rstrip("/").startswith("/etc/nvidia")]
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    # security
    pod_security = pod["securityContext"]
    assert pod_security["seccompProfile"]["type"] == "RuntimeDefault"
    if target in NON_ROOT:
        assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] != 0
    else:
        # the kubelet's pod-resources directory is root's, 0750
        assert pod_security["runAsUser"] == 0 and pod_security["runAsGroup"] == 0
        assert pod_security["runAsNonRoot"] is False
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    if target in PRIVILEGED:
        assert security["privileged"] is True
    else:
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert "privileged" not in security and "add" not in security["capabilities"]


@pytest.mark.parametrize("target", TARGETS)
def test_flags_are_flags_the_agent_has(target: str) -> None:
    for arg in agent_container(target).get("args", []):
        assert arg.split("=", 1)[0] in cli_flags(), arg


@pytest.mark.parametrize("target", TARGETS)
def test_the_agent_takes_its_flags_and_environment(target: str) -> None:
    # As its own parsing reads them at start (the chart renders what these render: tests/system/test_chart.py).
    container = agent_container(target)
    config = parse_config(container.get("args", []), container_environment(container))
    assert config.node_name == POD_FIELDS["spec.nodeName"], "the Downward API's NODE_NAME"
    assert config.otlp_names == ("semconv" if target == "otlp-semconv" else "vgpu")


@pytest.mark.parametrize("target", TARGETS)
def test_ratio_configmap_reaches_the_allocation_file(target: str) -> None:
    docs = render(target)
    container = agent_container(target)
    allocation = Path(flag_values(container)["--allocation-file"])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(allocation.parent))
    assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates"
    volume = next(v for v in daemonset(target)["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    configmap = one(docs, "ConfigMap", volume["configMap"]["name"])
    assert allocation.name in configmap["data"]
    assert configmap["data"][allocation.name] == (KUSTOMIZE / "base" / "gpu_allocation.txt").read_text()


def test_a_new_cluster_gets_the_ratio_auto() -> None:
    # Each GPU as the device plugin advertises it: right on every node without editing.
    text = (KUSTOMIZE / "base" / "gpu_allocation.txt").read_text()
    assert [line for line in text.splitlines() if line.strip() and not line.startswith("#")] == ["auto"]


@pytest.mark.parametrize("target", TARGETS)
def test_rbac_is_get_list_watch_on_pods_nodes_and_kais_bind_requests(target: str) -> None:
    docs = render(target)
    role = one(docs, "ClusterRole", "otel-vgpu")
    # pods: names and containers; nodes: the driver-upgrade labels (otel_vgpu/kubernetes/driver_upgrade.py);
    # KAI Scheduler's BindRequests: the fractions it gives pods (otel_vgpu/kubernetes/bind_requests.py).
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["scheduling.run.ai"], "resources": ["bindrequests"], "verbs": ["get", "list", "watch"]},
    ]
    # and the agent reads them where it finds KAI's reservation pods, as it does by default
    assert not [arg for arg in daemonset(target)["spec"]["template"]["spec"]["containers"][0]["args"] if "--kai" in arg]
    binding = one(docs, "ClusterRoleBinding", "otel-vgpu")
    account = one(docs, "ServiceAccount", "otel-vgpu")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "otel-vgpu", "namespace": account["metadata"]["namespace"]}
    ]
    assert daemonset(target)["spec"]["template"]["spec"]["serviceAccountName"] == "otel-vgpu"
    other_roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role") and d["metadata"]["name"] != "otel-vgpu"]
    if target in OPENSHIFT:
        scc_role = one(docs, "ClusterRole", "otel-vgpu-scc")
        assert scc_role["rules"] == [
            {
                "apiGroups": ["security.openshift.io"],
                "resources": ["securitycontextconstraints"],
                "resourceNames": ["otel-vgpu"],
                "verbs": ["use"],
            }
        ]
        # the platform Prometheus reads the agents' pods, in the agents' namespace only
        prometheus = one(docs, "Role", "prometheus-k8s")
        assert prometheus["metadata"]["namespace"] == "otel-vgpu"
        assert all(set(rule["verbs"]) == {"get", "list", "watch"} for rule in prometheus["rules"])
        binding = one(docs, "RoleBinding", "prometheus-k8s")
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "openshift-monitoring"}
        ]
        assert len(other_roles) == 2
    elif target in GATEWAYS:
        # The gateway's k8s_attributes, for its own service account, reads only.
        assert [r["metadata"]["name"] for r in other_roles] == ["otel-vgpu-collector"]
        assert all(set(rule["verbs"]) == {"get", "list", "watch"} for rule in other_roles[0]["rules"])
    else:
        assert other_roles == []


def test_headless_service_selects_the_agents() -> None:
    docs = render("base")
    service = one(docs, "Service", "otel-vgpu")
    assert service["spec"]["clusterIP"] == "None"
    labels = daemonset("base")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


@pytest.mark.parametrize("target", ["prometheus-operator", *sorted(OPENSHIFT)])
def test_podmonitor_honors_labels_and_is_selected_by_kube_prometheus_stack(target: str) -> None:
    docs = render(target)
    monitor = one(docs, "PodMonitor", "otel-vgpu")
    labels = daemonset(target)["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["honorLabels"] is True and endpoint["port"] == "metrics"
    assert monitor["metadata"]["namespace"] == one(docs, "DaemonSet")["metadata"]["namespace"]
    # The agent's own namespace, pod and container would fill in tenants' series (see the e2e test).
    drops = [r for r in endpoint["relabelings"] if r.get("action") == "labeldrop"]
    assert drops and all(re.fullmatch(drops[0]["regex"], label) for label in ("namespace", "pod", "container"))
    # kube-prometheus-stack's default podMonitorSelector and ruleSelector: release=<its release name>
    for kind in ("PodMonitor", "PrometheusRule"):
        assert one(docs, kind, "otel-vgpu")["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_prometheus_operator_ships_the_tested_rules() -> None:
    generator = load_script("gen-prometheusrule.py")
    shipped = (KUSTOMIZE / "components" / "prometheus-operator" / "prometheusrule.yaml").read_text()
    assert shipped == generator.prometheus_rule(), "run scripts/gen-prometheusrule.py"
    rule = one(render("prometheus-operator"), "PrometheusRule", "otel-vgpu")
    tested = yaml.safe_load((ROOT / "deploy" / "prometheus" / "otel-vgpu-rules.yaml").read_text())["groups"]
    assert rule["spec"]["groups"] == tested
    assert rule["metadata"]["namespace"] == "otel-vgpu"


@pytest.mark.parametrize("target", sorted(GATEWAYS))
def test_otlp_overlay_pushes_to_its_collector(target: str) -> None:
    docs = render(target)
    env = {e["name"]: e.get("value") for e in agent_container(target)["env"]}
    service = one(docs, "Service", "otel-vgpu-collector")
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-vgpu-collector:4317"
    assert 4317 in [p["port"] for p in service["spec"]["ports"]]
    collector = one(docs, "Deployment", "otel-vgpu-collector")
    assert service["spec"]["selector"].items() <= collector["spec"]["template"]["metadata"]["labels"].items()
    config_volume = collector["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    config = one(docs, "ConfigMap", config_volume)["data"]["config.yaml"]
    assert config == (ROOT / "collector-config" / GATEWAYS[target] / "config.yaml").read_text()
    configs = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("otel-vgpu-collector")]
    assert len(configs) == 1, "one configuration: the overlay's replaces the one it builds on"
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] in ("Deployment", "Service", "DaemonSet")} == {
        "otel-vgpu"
    }
    # The names the push speaks: the default's, or the semantic conventions' that its gateway expects.
    assert env.get("OTEL_VGPU_OTLP_NAMES") == (None if target == "otlp" else "semconv")


def test_the_semconv_gateway_is_granted_what_collector_config_semconv_grants() -> None:
    role = one(render("otlp-semconv"), "ClusterRole", "otel-vgpu-collector")
    shipped = one(documents((ROOT / "collector-config" / "semconv" / "rbac.yaml").read_text()), "ClusterRole")
    assert role["rules"] == shipped["rules"]


def test_small_overlays_do_what_they_say() -> None:
    assert "--seed-metrics" in agent_container("seed-compat")["args"]
    tls = agent_container("tls")
    flags = flag_values(tls)
    assert {"--tls-cert-file", "--tls-key-file", "--basic-auth-file"} <= set(flags)
    assert tls["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


@pytest.mark.parametrize("target", TARGETS)
def test_namespace_admits_the_agent_under_pod_security(target: str) -> None:
    # hostPID and hostPath volumes are outside the baseline level
    namespace = one(render(target), "Namespace", "otel-vgpu")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert daemonset(target)["metadata"]["namespace"] == "otel-vgpu"


@pytest.mark.parametrize("target", ["gke", "gke-gpu-operator"])
def test_gke_quota_admits_system_node_critical_pods(target: str) -> None:
    # GKE's rule holds whichever driver the nodes run, Google's or the GPU Operator's.
    docs = render(target)
    pod = daemonset(target)["spec"]["template"]["spec"]
    quota = one(docs, "ResourceQuota")
    assert quota["metadata"]["namespace"] == daemonset(target)["metadata"]["namespace"]
    expressions = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert {"operator": "In", "scopeName": "PriorityClass", "values": [pod["priorityClassName"]]} in expressions
    assert int(quota["spec"]["hard"]["pods"]) >= 1000, "one pod per node, every node"
    # only GKE limits critical pods this way; elsewhere the quota would be noise
    assert [t for t in TARGETS if any(d["kind"] == "ResourceQuota" for d in render(t))] == ["gke", "gke-gpu-operator"]
    # the operator brings its own runtime class; Google's driver is mounted instead
    assert ("runtimeClassName" in pod) == (target == "gke-gpu-operator")


@pytest.mark.parametrize("target", sorted(OPENSHIFT))
def test_openshift_scc_admits_what_the_pod_asks_for(target: str) -> None:
    scc = one(render(target), "SecurityContextConstraints", "otel-vgpu")
    pod = daemonset(target)["spec"]["template"]["spec"]
    assert scc["allowHostPID"] is True and pod["hostPID"] is True
    assert scc["allowPrivilegedContainer"] is False and scc["allowPrivilegeEscalation"] is False
    assert scc["requiredDropCapabilities"] == ["ALL"] and scc["allowedCapabilities"] == []
    # uid 0 (and the non-root overlay's 65532) are admitted
    assert scc["runAsUser"]["type"] == "RunAsAny"
    # spc_t, which CRI-O gives a hostPID container anyway, stated by the pod
    assert pod["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    assert scc["seLinuxContext"]["type"] == "RunAsAny"
    assert scc["allowHostDirVolumePlugin"] is True and scc["readOnlyRootFilesystem"] is True
    hostpaths = {v["name"] for v in pod["volumes"] if "hostPath" in v}
    assert "hostPath" in scc["volumes"] and hostpaths
    assert "priority" in scc and scc["priority"] is None, "required by the CRD, nullable"
    # by operator version: the RuntimeClass (v25.10+ with CDI), CRI-O's OCI hook, or the NRI plugin's annotation
    assert ("runtimeClassName" in pod) == (target == "openshift")


@pytest.mark.parametrize("target", sorted(OPENSHIFT))
def test_openshift_is_scraped_by_the_platform_prometheus_only(target: str) -> None:
    docs = render(target)
    namespace = one(docs, "Namespace", "otel-vgpu")
    # prometheus-k8s selects PodMonitors and rules in namespaces labelled so
    assert namespace["metadata"]["labels"]["openshift.io/cluster-monitoring"] == "true"
    policy = one(docs, "NetworkPolicy", "otel-vgpu")
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openshift-monitoring"}}}
    ]
    ports = {p["name"] for p in agent_container(target)["ports"]}
    assert [p["port"] for p in rule["ports"]] == ["metrics"] and "metrics" in ports
    labels = daemonset(target)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"], "the push to a collector stays open"


def test_overlays_for_each_cluster_do_what_their_names_say() -> None:
    for target, root in KUBELET_ROOTS.items():
        volumes = daemonset(target)["spec"]["template"]["spec"]["volumes"]
        assert {
            "name": "pod-resources",
            "hostPath": {"path": f"{root}/pod-resources", "type": "DirectoryOrCreate"},
        } in volumes
    # only the openshift overlays restrict ingress by default: another scraper namespace is the user's to name
    assert [t for t in TARGETS if any(d["kind"] == "NetworkPolicy" for d in render(t))] == sorted(OPENSHIFT)


def test_agent_rereads_a_configmap_volume_swapped_like_the_kubelet_does(tmp_path: Path, scenario_file: Path) -> None:
    # The kubelet writes each ConfigMap version to a timestamped directory,
    # points ..data at it, and the key is a link through ..data.
    volume = tmp_path / "configmap"
    volume.mkdir()

    def publish(version: str, ratio: str) -> None:
        (volume / version).mkdir()
        (volume / version / "gpu_allocation.txt").write_text(ratio)
        (volume / "..data_tmp").symlink_to(version)
        os.replace(volume / "..data_tmp", volume / "..data")

    publish("..2026_11_29_10_00_00.1", "2\n")
    (volume / "gpu_allocation.txt").symlink_to("..data/gpu_allocation.txt")
    args = ["--simulate", str(scenario_file), "--allocation-file", str(volume / "gpu_allocation.txt")]
    with running_agent(*args) as agent:
        assert agent.scrape().by("vgpu_gpu_vgpus", "gpu_id")[("0",)] == 2
        publish("..2026_11_29_10_05_00.2", "4\n")
        deadline = time.monotonic() + 10
        while agent.scrape().by("vgpu_gpu_vgpus", "gpu_id")[("0",)] != 4:
            assert time.monotonic() < deadline, "the swapped file was not reread"
            time.sleep(0.2)
        agent.stop()


def test_readme_apply_command_names_a_real_kustomization() -> None:
    readme = (KUSTOMIZE / "README.md").read_text()
    for command in re.findall(r"kubectl apply -k (\S+)", readme):
        if command == "my-cluster":  # the README's own kustomization, rendered below
            continue
        target = ROOT / shlex.split(command)[0]
        assert (target / "kustomization.yaml").exists(), command


def test_the_readmes_own_kustomizations_render_the_image_built_and_a_cluster_with_features(tmp_path: Path) -> None:
    readme = (KUSTOMIZE / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(# my-cluster/kustomization.yaml.*?)```", readme, re.DOTALL)
    assert len(blocks) == 2, "the README's kustomizations of one's own: the image it builds, then features"
    (tmp_path / "kustomize").symlink_to(KUSTOMIZE)

    def rendered(block: str, name: str) -> list[dict[str, Any]]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "kustomization.yaml").write_text(block)
        return documents(rendered_text(tmp_path / name))

    # The first runs the image the README's opening commands build and push.
    built = {w for line in re.findall(r"(?m)^docker build .*$", readme) for w in line.split() if "example.com" in w}
    (container,) = one(rendered(blocks[0], "image"), "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert {container["image"]} == built
    docs = rendered(blocks[1], "features")
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "PodMonitor", "PrometheusRule", "NetworkPolicy"} <= kinds
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert ("kubernetes.azure.com/accelerator", "In", ("nvidia",)) in terms_of(pod)


def test_the_pods_announce_themselves_to_annotation_jobs_only_where_no_monitor_scrapes_them() -> None:
    # kustomize asks no cluster: the base annotates the pods (as the chart does without the
    # operator's API), and the component that adds the PodMonitor removes them, so that no
    # agent is scraped twice.
    for target in TARGETS:
        annotations = daemonset(target)["spec"]["template"]["metadata"]["annotations"]
        scrape = {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")}
        if any(d["kind"] == "PodMonitor" for d in render(target)):
            assert scrape == {}, target
        else:
            port = agent_container(target)["ports"][0]["containerPort"]
            scheme = "https" if "--tls-cert-file" in flag_values(agent_container(target)) else "http"
            assert scrape == {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(port),
                "prometheus.io/path": "/metrics",
                "prometheus.io/scheme": scheme,
            }, target
    assert {t for t in TARGETS if any(d["kind"] == "PodMonitor" for d in render(t))} == {
        "prometheus-operator",
        *OPENSHIFT,
    }


def test_strict_validation_refuses_what_the_api_would(tmp_path: Path) -> None:
    # A field the API does not know, and a value of the wrong type: each named with its object.
    unknown = rendered_text("base").replace("hostPID: true", "hostPID: true\n      hostPIDs: true", 1)
    with pytest.raises(AssertionError, match=r"DaemonSet .*hostPIDs"):
        validate_strictly(unknown, tmp_path / "unknown.yaml")
    wrong = rendered_text("base").replace("hostPID: true", "hostPID: yes-please", 1)
    with pytest.raises(AssertionError, match=r"DaemonSet .*yes-please"):
        validate_strictly(wrong, tmp_path / "wrong.yaml")


DCGM_SETS = load_script("gen-dcgm-rules.py")


@pytest.mark.parametrize("generation", DCGM_SETS.GENERATIONS, ids=lambda g: DCGM_SETS.chart_file(g).stem)
def test_each_dcgm_exporter_component_adds_its_generations_set_beside_the_agents_rules(
    tmp_path: Path, generation: Any
) -> None:
    component = DCGM_SETS.component(generation)
    for name, text in DCGM_SETS.component_files(generation).items():
        assert (component / name).read_text() == text, "regenerate: .venv/bin/python scripts/gen-dcgm-rules.py"
    # An overlay of the user's: the base, the prometheus-operator component and the generation's.
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    relative = [os.path.relpath(KUSTOMIZE / part, overlay) for part in ("base", "components/prometheus-operator")]
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [relative[0]],
                "components": [relative[1], os.path.relpath(component, overlay)],
            }
        )
    )
    docs = documents(rendered_text(overlay))
    rule = one(docs, "PrometheusRule", "otel-vgpu-dcgm-exporter-names")
    assert rule["spec"] == yaml.safe_load(generation.path.read_text())
    # Beside the agent's own rules, where the overlay puts them.
    assert rule["metadata"].get("namespace") == one(docs, "PrometheusRule", "otel-vgpu")["metadata"].get("namespace")
