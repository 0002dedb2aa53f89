"""The agent on a real GPU node, for the real-GPU scripts (bench/gpu_*.py): against the
Kubernetes API and kubelet doubles, as root or as the rendered DaemonSet runs it
(testkit/pod_harness.py), and the node's names they share."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.agent import wait_serving
from testkit.host_pods import HostPod

ROOT = Path(__file__).resolve().parents[1]
# Where the kubelet serves pod-resources, and so where the manifest mounts it from.
POD_RESOURCES_DIR = Path("/var/lib/kubelet/pod-resources")
NODE = "gpu-node-1"
AGENT_PORT = 8080  # the DaemonSet's containerPort, the agent's default
REPLICAS = 8
"""Time-slicing replicas per GPU the scripts' device plugin double advertises."""


class Doubles:
    """The test doubles standing in for the Kubernetes API (the API's JSON;
    HTTPS with a service account when `pki` is given, else plain HTTP with a
    kubeconfig) and the kubelet (pod-resources gRPC on a Unix socket, in
    `socket_dir`: a root-owned 0750 directory, as the kubelet makes it)."""

    def __init__(self, directory: Path, node: str, pki: bool = False, socket_dir: Path | None = None) -> None:
        from testkit.kube_api_double import KubeApiDouble  # noqa: PLC0415
        from testkit.kubelet_double import KubeletDouble  # noqa: PLC0415

        self.directory = directory
        self.node = node
        self.ca_crt = b""
        certs = None
        if pki:
            from testkit.certs import make_certs  # noqa: PLC0415

            certs = make_certs(directory / "pki")
            self.ca_crt = certs.ca.read_bytes()
        self.api = KubeApiDouble(certs, node).start()
        self.token = self.api.state.token
        if socket_dir is not None:
            socket_dir.mkdir(parents=True, exist_ok=True)
            os.chown(socket_dir, 0, 0)
            socket_dir.chmod(0o750)
        self.socket = (socket_dir or directory) / "kubelet.sock"
        self.socket.unlink(missing_ok=True)
        self.kubelet = KubeletDouble(self.socket).start()
        self.kubeconfig = directory / "kubeconfig"
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{self.api.port}'}}}}]\n"
            "users: [{name: u, user: {token: test-token}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
        )

    def add(self, pod: HostPod, devices: dict[str, list[str]]) -> None:
        """Publish the pod in the API and give its containers these device IDs."""
        from testkit.kube_api_double import pod_object  # noqa: PLC0415

        containers = {"main": pod.containers[0][0] if pod.containers else ""}
        self.api.put(pod_object(pod.namespace, pod.name, pod.uid, self.node, containers=containers))
        self.kubelet.assign(pod.namespace, pod.name, devices)

    def stop(self) -> None:
        self.kubelet.stop()
        self.api.stop()


@dataclass
class GpuNode:
    """GPU 0 as NVML names it, and the doubles a GPU script's agent runs against."""

    model: str
    gpu_uuid: str
    driver: str
    directory: Path
    cluster: Doubles


def gpu_node(prefix: str) -> GpuNode:
    """GPU 0's names, a fresh directory under /var/tmp (outside the pod's /tmp) and the doubles
    in it, with the kubelet's socket where the manifest mounts it from."""
    from testkit.cuda_workloads import nvml_truth, require_gpu  # noqa: PLC0415

    require_gpu()
    _, _, model, gpu_uuid, driver = nvml_truth()
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    return GpuNode(model, gpu_uuid, driver, directory, Doubles(directory, NODE, pki=True, socket_dir=POD_RESOURCES_DIR))


def pod_harness(
    manifest: Path,
    directory: Path,
    doubles: Doubles,
    node: str,
    drop_host_pid: bool = False,
    code: Path | None = None,
    extra_args: tuple[str, ...] = (),
) -> Any:
    """testkit/pod_harness.py's agent for `manifest`, against `doubles`, with this
    environment's packages and the repository on its path; with `code`, a directory holding
    another version's `otel_vgpu`, that version first; `extra_args` after the container's own."""
    from testkit.pod_harness import Cluster as HarnessCluster  # noqa: PLC0415
    from testkit.pod_harness import Pod as HarnessPod  # noqa: PLC0415
    from testkit.pod_harness import PodHarness  # noqa: PLC0415

    return PodHarness(
        manifest,
        directory,
        HarnessPod(node=node),
        HarnessCluster("127.0.0.1", doubles.api.port, doubles.token, doubles.ca_crt),
        python_path=(
            *([str(code.resolve())] if code is not None else []),
            *os.environ.get("PYTHONPATH", "").split(":"),
            str(ROOT),
        ),
        drop_host_pid=drop_host_pid,
        extra_args=extra_args,
    )


def start_agent(doubles: Doubles, port: int, ratio: float, *extra: str) -> subprocess.Popen[bytes]:
    """The agent on the real NVML, with the doubles for names and shares."""
    ratio_file = doubles.directory / "gpu_allocation.txt"
    ratio_file.write_text(f"{ratio}\n")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "otel_vgpu",
            "--address",
            "127.0.0.1",
            "--port",
            str(port),
            "--allocation-file",
            str(ratio_file),
            "--min-interval",
            "1",
            "--node-name",
            doubles.node,
            "--kubeconfig",
            str(doubles.kubeconfig),
            "--pod-resources-socket",
            str(doubles.socket),
            "--pod-resources-interval",
            "0.5",
            *extra,
        ],
        cwd=ROOT,
    )
    wait_serving(f"http://127.0.0.1:{port}", agent)
    return agent


def stop_agent(agent: subprocess.Popen[bytes] | None) -> None:
    if agent is not None:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)


def bare_agent_command(port: int, ratio_file: Path, min_interval: str) -> list[str]:
    """The agent on the real NVML, outside any cluster."""
    return [
        sys.executable, "-m", "otel_vgpu", "--address", "127.0.0.1", "--port", str(port),
        "--allocation-file", str(ratio_file), "--min-interval", min_interval, "--no-kubernetes",
        "--log-level", "warning",
    ]  # fmt: skip


def nvitop_exporter_command() -> list[str] | None:
    """How to start nvitop-exporter, the peer the GPU scripts compare the agent with: its
    script on PATH or beside this interpreter (a virtual environment's bin/), else its module;
    None where it is not installed."""
    beside = Path(sys.executable).parent / "nvitop-exporter"
    script = shutil.which("nvitop-exporter") or (str(beside) if beside.exists() else None)
    if script:
        return [script]
    importable = subprocess.run([sys.executable, "-c", "import nvitop_exporter"], check=False, capture_output=True)
    return [sys.executable, "-m", "nvitop_exporter"] if importable.returncode == 0 else None


def wait_for_metrics(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url, timeout=30).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{url} did not come up") from None
            time.sleep(0.2)
