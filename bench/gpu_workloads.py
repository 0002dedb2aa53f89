"""CUDA workloads in kubelet-shaped cgroups, for the real-GPU scripts.

Run as root on a node with cgroup v2 mounted at /sys/fs/cgroup. Each pod gets
a cgroup shaped like the kubelet's, systemd-style
(`kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice/cri-containerd-<id>.scope`)
or cgroupfs-style (`kubepods/<qos>/pod<uid>/<id>`), and each workload (a
PyTorch process: busy with matrix products, or idle holding memory) is moved
into its container's cgroup.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.agent import free_port, wait_serving
from testkit.procstat import cpu_seconds

__all__ = [
    "CGROUP_ROOT",
    "Check",
    "Cluster",
    "Pod",
    "Report",
    "Samples",
    "cpu_while_scraped",
    "free_port",
    "place",
    "pod_harness",
    "require_gpu",
    "scrape",
    "start_agent",
    "start_pods",
    "start_workload",
    "start_workloads",
    "stop_agent",
    "stop_pods",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
WORKLOAD = r"""
import os, sys, time, torch
mode, gib = sys.argv[1], float(sys.argv[2])
burst_s = float(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.1
work_file = os.environ.get("WORK_FILE")
if os.environ.get("COMM"):  # the name /proc/<pid>/stat shows: prctl(PR_SET_NAME), as any process may
    import ctypes
    ctypes.CDLL(None).prctl(15, os.environ["COMM"].encode(), 0, 0, 0)
hold = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

def step():
    global a
    a = (a @ a).clamp_(-1, 1)

# The GPU time one step takes alone: the fastest of a few timed batches (a batch
# that shared the GPU with another process only runs slower).
solo = float("inf")
for _ in range(8):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    solo = min(solo, (time.perf_counter() - t) / 10)
steps, noted = 0, 0.0

def note():
    # GPU seconds of work done so far (steps x their solo time): what the process
    # ran, counted by itself, however time-slicing stretched its wall time.
    global noted
    if work_file and time.monotonic() - noted >= 0.5:
        noted = time.monotonic()
        with open(work_file + ".tmp", "w") as f:
            f.write(f"{time.time()} {steps * solo}\n")
        os.replace(work_file + ".tmp", work_file)

print("ready", flush=True)
while True:
    if mode == "busy":
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        steps += 20
    elif mode in ("bursty", "steady"):  # kernels for burst_s of each second, or that share of every 100 ms
        period = 1.0 if mode == "bursty" else 0.1
        on = burst_s * period
        start = time.monotonic()
        while time.monotonic() - start < on:
            step()
            torch.cuda.synchronize()
            steps += 1
        time.sleep(max(0.0, period - (time.monotonic() - start)))
    elif mode == "copy":  # memory-bound: device-to-device copies of 2 GiB, SMs nearly idle
        if "src" not in globals():
            src = torch.empty(2**31, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
        for _ in range(10):
            dst.copy_(src)
        torch.cuda.synchronize()
        steps += 10
    elif mode == "jpeg":  # JPEG decoding on the GPU (nvJPEG), 32 frames of 1080p a batch
        if "frames" not in globals():
            import torchvision
            frame = (torch.rand(3, 1080, 1920) * 255).to(torch.uint8)
            frames = [torchvision.io.encode_jpeg(frame)] * 32
        torchvision.io.decode_jpeg(frames, device="cuda")
        torch.cuda.synchronize()
        steps += 1
    else:
        time.sleep(0.5)
    note()
"""


@dataclass
class Pod:
    namespace: str
    name: str
    driver: str  # systemd or cgroupfs
    qos: str
    workloads: list[tuple[str, float]] = field(default_factory=list)  # (busy|idle, GiB)
    visible: list[str | None] = field(default_factory=list)  # CUDA_VISIBLE_DEVICES per workload
    shares: int = 1
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    processes: list[subprocess.Popen[str]] = field(default_factory=list)
    containers: list[tuple[str, Path]] = field(default_factory=list)  # (container ID, cgroup)

    @property
    def busy(self) -> bool:
        return any(mode == "busy" for mode, _ in self.workloads)


def cgroup_dir(pod: Pod, container_id: str) -> Path:
    if pod.driver == "systemd":
        uid = pod.uid.replace("-", "_")
        if pod.qos == "guaranteed":
            parent = Path("kubepods.slice") / f"kubepods-pod{uid}.slice"
        else:
            parent = Path("kubepods.slice") / f"kubepods-{pod.qos}.slice" / f"kubepods-{pod.qos}-pod{uid}.slice"
        return CGROUP_ROOT / parent / f"cri-containerd-{container_id}.scope"
    qos = "" if pod.qos == "guaranteed" else pod.qos
    return CGROUP_ROOT / "kubepods" / qos / f"pod{pod.uid}" / container_id


def require_gpu() -> None:
    """Stop with one line, not a traceback, where there is no NVIDIA GPU to run on."""
    try:
        import pynvml  # noqa: PLC0415
    except ImportError:
        raise SystemExit("nvidia-ml-py is not installed: the GPU scripts need it (bench/README.md)") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise SystemExit(
            f"no NVIDIA GPU to run on: NVML says {error} (libnvidia-ml.so.1 and a loaded driver are needed); "
            "the GPU scripts run on a GPU node, bench/README.md says what they need"
        ) from None
    pynvml.nvmlShutdown()


def start_workload(
    mode: str, gib: float, env: dict[str, str] | None = None, burst_ms: float = 100.0
) -> subprocess.Popen[str]:
    """A PyTorch process on the GPU `env`'s CUDA_VISIBLE_DEVICES names (default: CUDA's first):
    `busy` (bf16 matrix products), `copy` (device-to-device copies of 2 GiB: memory-bound),
    `bursty` (kernels for `burst_ms` of each second), `steady` (that share of every 100 ms),
    `jpeg` (JPEG decoding with nvJPEG) or idle, holding `gib` GiB. With WORK_FILE in `env`, it
    writes there, twice a second, "<unix time> <GPU seconds of work done>" (steps times one
    step's solo time)."""
    return start_workloads([mode], gib, env, burst_ms)[0]


def start_workloads(
    modes: list[str], gib: float, env: dict[str, str] | None = None, burst_ms: float = 100.0
) -> list[subprocess.Popen[str]]:
    """`start_workload` for each of `modes`, started together (a PyTorch start takes seconds),
    each ready when returned."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKLOAD, mode, str(gib), str(burst_ms)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        for mode in modes
    ]
    for process, mode in zip(processes, modes, strict=True):
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise SystemExit(f"workload {mode} {gib} GiB did not start")
    return processes


def start_pods(pods: list[Pod]) -> None:
    """Start every pod's workloads and move each into its container's cgroup."""
    if os.geteuid() != 0:
        raise SystemExit("run as root: it creates cgroups and moves processes into them")
    for pod in pods:
        for index, (mode, gib) in enumerate(pod.workloads):
            visible = pod.visible[index] if index < len(pod.visible) else None
            place(pod, start_workload(mode, gib, {"CUDA_VISIBLE_DEVICES": visible} if visible else None))


def place(pod: Pod, process: subprocess.Popen[Any]) -> None:
    """Move a process into a new container cgroup of `pod`."""
    container_id = uuid.uuid4().hex + uuid.uuid4().hex
    directory = cgroup_dir(pod, container_id)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup.procs").write_text(str(process.pid))
    pod.processes.append(process)
    pod.containers.append((container_id, directory))


def stop_pods(pods: list[Pod], others: list[subprocess.Popen[str]] = ()) -> None:  # type: ignore[assignment]
    for process in [p for pod in pods for p in pod.processes] + list(others):
        process.kill()
        process.wait()
    for pod in pods:
        for _, directory in pod.containers:
            # innermost first; a parent goes once it is empty
            for path in [directory, *directory.parents]:
                if path == CGROUP_ROOT:
                    break
                try:
                    path.rmdir()
                except OSError:
                    break


Samples = dict[str, list[tuple[dict[str, str], float]]]
Check = Callable[[bool, str], None]


def scrape(url: str) -> Samples:
    """Every sample of a scrape, by name."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    result: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            result.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return result


class Cluster:
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

    def add(self, pod: Pod, devices: dict[str, list[str]]) -> None:
        """Publish the pod in the API and give its containers these device IDs."""
        from testkit.kube_api_double import pod_object  # noqa: PLC0415

        containers = {"main": pod.containers[0][0] if pod.containers else ""}
        self.api.put(pod_object(pod.namespace, pod.name, pod.uid, self.node, containers=containers))
        self.kubelet.assign(pod.namespace, pod.name, devices)

    def stop(self) -> None:
        self.kubelet.stop()
        self.api.stop()


def pod_harness(
    manifest: Path,
    directory: Path,
    cluster: Cluster,
    node: str,
    drop_host_pid: bool = False,
    code: Path | None = None,
    extra_args: tuple[str, ...] = (),
) -> Any:
    """testkit/pod_harness.py's agent for `manifest`, against `cluster`'s doubles, with this
    environment's packages and the repository on its path; with `code`, a directory holding
    another version's `otel_vgpu`, that version first; `extra_args` after the container's own."""
    from testkit.pod_harness import Cluster as HarnessCluster  # noqa: PLC0415
    from testkit.pod_harness import Pod as HarnessPod  # noqa: PLC0415
    from testkit.pod_harness import PodHarness  # noqa: PLC0415

    return PodHarness(
        manifest,
        directory,
        HarnessPod(node=node),
        HarnessCluster("127.0.0.1", cluster.api.port, cluster.token, cluster.ca_crt),
        python_path=(
            *([str(code.resolve())] if code is not None else []),
            *os.environ.get("PYTHONPATH", "").split(":"),
            str(Path(__file__).resolve().parents[1]),
        ),
        drop_host_pid=drop_host_pid,
        extra_args=extra_args,
    )


def start_agent(cluster: Cluster, port: int, ratio: float, *extra: str) -> subprocess.Popen[bytes]:
    """The agent on the real NVML, with the doubles for names and shares."""
    ratio_file = cluster.directory / "gpu_allocation.txt"
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
            cluster.node,
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--pod-resources-socket",
            str(cluster.socket),
            "--pod-resources-interval",
            "0.5",
            *extra,
        ],
        cwd=Path(__file__).resolve().parents[1],
    )
    wait_serving(f"http://127.0.0.1:{port}", agent)
    return agent


def cpu_while_scraped(pid: int, url: str, seconds: float, every: float = 15.0) -> float:
    """The CPU process `pid` uses over `seconds`, in percent of a core, while `url` is scraped
    every `every` seconds, as Prometheus would."""
    before, started = cpu_seconds(pid), time.monotonic()
    next_scrape = started
    while (now := time.monotonic()) - started < seconds:
        if now >= next_scrape:
            scrape(url)
            next_scrape += every
        time.sleep(0.2)
    return 100 * (cpu_seconds(pid) - before) / (time.monotonic() - started)


def publish(title: str, lines: list[str], out: Path | None) -> None:
    """Print a script's report, and write it to `out` as a Markdown page titled `title`."""
    text = "\n".join(lines)
    print(text)
    if out is not None:
        out.write_text(f"# {title}\n\n{text}\n")


@dataclass
class Report:
    """A validation's table and checks, printed and optionally written out."""

    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> None:
        self.lines.append(f"| {'ok' if ok else 'FAIL'} | {what} |")
        if not ok:
            self.failures.append(what)

    def finish(self, title: str, out: Path | None) -> int:
        """Print, write `out` if given; the exit status: 1 on any failed check."""
        publish(title, self.lines, out)
        print(f"\n{len(self.failures)} failed" if self.failures else "\nall checks passed")
        return 1 if self.failures else 0


def stop_agent(agent: subprocess.Popen[bytes] | None) -> None:
    if agent is not None:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)
