"""The shipped manifests, run as deployed, on the simulated node.

testkit/pod_harness.py gives the rendered DaemonSet's agent the isolation its
pod spec asks for (PID, mount and cgroup namespaces, user, no capabilities,
read-only root, volumes, service account); the Kubernetes API double answers
over HTTPS to the service account, and the kubelet double serves
pod-resources in a root-owned 0750 directory, as a kubelet does. What a
manifest change breaks for a real pod, these tests see. Run as root (CI is).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.agent import ROOT, free_port, get, wait_serving
from testkit.certs import make_certs
from testkit.helm import flavour_args, packaged, template
from testkit.kube_api_double import KubeApiDouble
from testkit.kube_node import NODE, SCENARIO, U0, U1, populate
from testkit.kubelet_double import KubeletDouble
from testkit.manifests import KUBELET_ROOTS, rendered_text
from testkit.pod_harness import Cluster as HarnessCluster
from testkit.pod_harness import Pod, PodHarness
from testkit.procstat import cpu_seconds
from testkit.promtext import Exposition, parse

POD_RESOURCES = "/var/lib/kubelet/pod-resources"
# What a time-slicing config of 4 replicas makes the device plugin advertise:
# with the base's ratio `auto`, each GPU's ratio is 4.
REPLICAS = 4


def interpreter() -> tuple[str, tuple[str, ...]]:
    """A Python every uid may run, with this environment's packages on its path.

    The image's interpreter is world-readable; a virtual environment's may
    point into a private home (pyenv under /root). The system's Python of the
    same version runs the same wheels."""
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    python = str(system) if system.exists() else sys.executable
    return python, (str(ROOT), sysconfig.get_paths()["purelib"])


@dataclass
class PodRun:
    ready: tuple[int, str]
    metrics: Exposition
    log: str
    evidence: dict[str, str]
    pod: Pod
    cpu: tuple[float, float]
    """The CPU seconds of the pod's cgroup and of the agent's process (in clock ticks), as it served."""

    def pods(self) -> set[tuple[str, str]]:
        return {(ns, pod) for ns, pod in self.metrics.by("vgpu_pod_memory_allocated_bytes", "namespace", "pod")}


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Not under /tmp: the pod's emptyDir covers /tmp.
    path = Path(tempfile.mkdtemp(prefix="otel-vgpu-pod-", dir="/var/tmp"))
    path.chmod(0o755)  # the volumes in it are the kubelet's, readable by a non-root pod
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def doubles(workdir: Path) -> Iterator[tuple[KubeApiDouble, KubeletDouble, Path]]:
    socket_dir = workdir / "kubelet" / "pod-resources"
    socket_dir.mkdir(parents=True)
    os.chown(socket_dir, 0, 0)
    socket_dir.chmod(0o750)  # as setupDataDirs in the kubelet makes it
    certs = make_certs(workdir / "pki")
    api = KubeApiDouble(certs, NODE).start()
    kubelet = KubeletDouble(socket_dir / "kubelet.sock").start()
    populate(api, kubelet)
    kubelet.allocatable = {"nvidia.com/gpu": [f"{gpu}::{n}" for gpu in (U0, U1) for n in range(REPLICAS)]}
    yield api, kubelet, certs.ca
    kubelet.stop()
    api.stop()


def manifest_text(target: str) -> str:
    """A kustomize target's render; for `chart:<flavour>` the chart's with that flavour's values;
    for `package:<platform>` the packaged chart's with `platform` set, as from a chart repository."""
    if target.startswith("package:"):
        return template("--set", f"platform={target.removeprefix('package:')}", chart=packaged())
    if target.startswith("chart:"):
        return template(*flavour_args(target.removeprefix("chart:")))
    return rendered_text(target)


def run_pod(
    target: str, workdir: Path, doubles: tuple[KubeApiDouble, KubeletDouble, Path], drop_host_pid: bool = False
) -> PodRun:
    assert os.geteuid() == 0, "the pod harness makes namespaces and mounts: run as root (CI does)"
    api, kubelet, ca = doubles
    manifest = workdir / f"{target.replace(':', '-')}.yaml"
    manifest.write_text(manifest_text(target))
    scenario = workdir / "node.yaml"
    scenario.write_text(SCENARIO)
    port = free_port()
    pod = Pod(node=NODE)
    harness = PodHarness(
        manifest,
        workdir / "pod",
        pod,
        HarnessCluster("127.0.0.1", api.port, api.state.token, ca.read_bytes()),
        python=interpreter()[0],
        python_path=interpreter()[1],
        drop_host_pid=drop_host_pid,
        # The kubelet double's socket, wherever the overlay says the kubelet's root is.
        host_paths={
            f"{root}/pod-resources": kubelet.socket_path.parent
            for root in ("/var/lib/kubelet", *KUBELET_ROOTS.values())
        },
        extra_args=("--simulate", str(scenario), "--port", str(port), "--pod-resources-interval", "0.2"),
    )
    url = f"http://127.0.0.1:{port}"
    process = harness.start()
    try:
        wait_serving(url, process, harness.stop)
        # The agent asks the kubelet once before it serves: the answer, or
        # its failure, is in the first scrape.
        evidence = harness.evidence()
        status, body, _ = get(f"{url}/readyz")
        _, metrics, _ = get(f"{url}/metrics")
        agent = cpu_seconds(harness.agent_pid())
        cpu = (harness.cpu_seconds(), agent)
    finally:
        log = harness.stop()
    return PodRun((status, body.decode()), parse(metrics.decode()), log, evidence, pod, cpu)


def no_capabilities(evidence: dict[str, str]) -> bool:
    return set(re.findall(r"[0-9a-f]{16}", evidence["CapEff / CapPrm / CapBnd / CapAmb"])) == {"0" * 16}


def test_base_as_deployed_sees_every_pod_with_the_kubelets_shares(
    workdir: Path, doubles: tuple[KubeApiDouble, KubeletDouble, Path]
) -> None:
    run = run_pod("base", workdir, doubles)
    evidence = run.evidence
    assert evidence["uid (real, effective, saved, fs)"] == "0 0 0 0" and no_capabilities(evidence)
    assert evidence["NoNewPrivs"] == "1" and evidence["root mount options"].startswith("ro")
    agent_ns, host_ns = evidence["PID namespace: agent / harness (host)"].split(" / ")
    assert agent_ns == host_ns, "hostPID"
    assert run.ready[0] == 200, run.ready
    assert run.metrics.series("vgpu_agent_blind_gpus") == {frozenset(): 0}
    # names from the API over the service account, shares from the kubelet's socket
    assert {("ml", "trainer-7f9c"), ("web", "api-0"), ("web", "idle-0")} <= run.pods()
    # ratio auto: the replicas the kubelet advertises for each GPU
    assert run.metrics.by("vgpu_gpu_vgpus", "gpu_id") == {("0",): REPLICAS, ("1",): REPLICAS}
    allocated = run.metrics.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id")
    assert allocated[("trainer-7f9c", "0")] == 2 * 80 * 1024**3 / REPLICAS  # two replicas of GPU 0
    assert run.metrics.by("vgpu_pod_memory_used_bytes", "pod", "gpu_id")[("idle-0", "0")] == 0  # idle allocation
    assert run.metrics.by("vgpu_agent_pod_resources_up") == {(): 1}
    errors = run.metrics.by("vgpu_agent_collection_errors_total", "stage")
    assert errors[("pod_resources",)] == 0 and errors[("attribution",)] == 0, run.log
    # The agent's identity from the downward API, as the OTLP path needs it.
    (identity,) = run.metrics.series("target_info")
    labels = dict(identity)
    pod = run.pod
    assert labels["service_instance_id"] == labels["k8s_pod_uid"] == pod.uid
    assert labels["k8s_pod_name"] == pod.name
    assert labels["k8s_node_name"] == labels["host_name"] == NODE
    # The cost scripts' CPU (testkit/cpu_compare.py): the pod's cgroup counts the agent, read
    # after it to the microsecond, where the process's own figure counts whole clock ticks.
    cgroup, agent = run.cpu
    assert agent > 0 and cgroup >= agent - 0.01, run.cpu


def test_base_without_host_pid_is_blind_and_says_so(
    workdir: Path, doubles: tuple[KubeApiDouble, KubeletDouble, Path]
) -> None:
    run = run_pod("base", workdir, doubles, drop_host_pid=True)
    agent_ns, host_ns = run.evidence["PID namespace: agent / harness (host)"].split(" / ")
    assert agent_ns != host_ns
    assert run.metrics.series("vgpu_agent_blind_gpus") == {frozenset(): 2}
    assert run.metrics.series("vgpu_pod_memory_used_bytes") == {}
    status, body = run.ready
    assert status == 503 and "hostPID: true" in body
    assert [line for line in run.log.splitlines() if " ERROR " in line and "hostPID: true" in line], run.log


def test_non_root_overlay_loses_the_kubelets_shares_as_documented(
    workdir: Path, doubles: tuple[KubeApiDouble, KubeletDouble, Path]
) -> None:
    run = run_pod("non-root", workdir, doubles)
    assert run.evidence["uid (real, effective, saved, fs)"] == "65532 65532 65532 65532"
    assert no_capabilities(run.evidence)
    assert run.ready[0] == 200
    errors = run.metrics.by("vgpu_agent_collection_errors_total", "stage")
    assert errors[("pod_resources",)] >= 1
    assert "ermission denied" in run.log, run.log
    # shares from the limits: the trainer's 3 GPUs over the 2 it runs on; the idle pod unseen;
    # ratio auto without the kubelet's counts is 1, as the overlay says
    assert run.metrics.by("vgpu_gpu_vgpus", "gpu_id") == {("0",): 1, ("1",): 1}
    assert run.metrics.by("vgpu_agent_pod_resources_up") == {(): 0}
    allocated = run.metrics.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id")
    assert allocated[("trainer-7f9c", "0")] == 1.5 * 80 * 1024**3
    assert ("web", "idle-0") not in run.pods()


# The overlays for clusters, each as the pod it renders, and the chart with its
# defaults and flavours' values: what differs in the pod spec (node choice,
# runtime, annotations, the kubelet's root, SCC) must not cost the agent its
# isolation or its view. The node choice and the runtime are the scheduler's and
# the runtime's business: here, that nothing else changed.
@pytest.mark.parametrize(
    "target",
    [
        *("gpu-operator", "eks", "aks", "hami", "k0s", "microk8s", "openshift-nri"),
        *("chart:defaults", "chart:gpu-operator", "chart:eks", "chart:k0s", "chart:openshift-nri"),
        *("package:eks", "package:openshift"),
    ],
)
def test_cluster_overlays_as_deployed_see_every_pod_with_the_kubelets_shares(
    target: str, workdir: Path, doubles: tuple[KubeApiDouble, KubeletDouble, Path]
) -> None:
    run = run_pod(target, workdir, doubles)
    evidence = run.evidence
    assert evidence["uid (real, effective, saved, fs)"] == "0 0 0 0" and no_capabilities(evidence)
    assert evidence["root mount options"].startswith("ro")
    agent_ns, host_ns = evidence["PID namespace: agent / harness (host)"].split(" / ")
    assert agent_ns == host_ns, "hostPID"
    assert run.ready[0] == 200, run.ready
    assert {("ml", "trainer-7f9c"), ("web", "api-0"), ("web", "idle-0")} <= run.pods()
    assert run.metrics.by("vgpu_agent_pod_resources_up") == {(): 1}, run.log
    assert run.metrics.by("vgpu_gpu_vgpus", "gpu_id") == {("0",): REPLICAS, ("1",): REPLICAS}
