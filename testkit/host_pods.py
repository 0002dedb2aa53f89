"""Pods made on a GPU node as a kubelet makes them, for the real-GPU scripts (bench/gpu_*.py).

Run as root on a node with cgroup v2 mounted at /sys/fs/cgroup. Each pod gets a cgroup shaped
like the kubelet's, systemd-style
(`kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice/cri-containerd-<id>.scope`)
or cgroupfs-style (`kubepods/<qos>/pod<uid>/<id>`), and each of its workloads (a PyTorch
process, testkit/cuda_workloads.py) is moved into its container's cgroup.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.cuda_workloads import start_workload, start_workloads

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class HostPod:
    """A pod made on this host as a kubelet would make it: a cgroup per container, shaped
    like the kubelet's, holding CUDA workloads (testkit/cuda_workloads.py)."""

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


def cgroup_dir(pod: HostPod, container_id: str) -> Path:
    if pod.driver == "systemd":
        uid = pod.uid.replace("-", "_")
        if pod.qos == "guaranteed":
            parent = Path("kubepods.slice") / f"kubepods-pod{uid}.slice"
        else:
            parent = Path("kubepods.slice") / f"kubepods-{pod.qos}.slice" / f"kubepods-{pod.qos}-pod{uid}.slice"
        return CGROUP_ROOT / parent / f"cri-containerd-{container_id}.scope"
    qos = "" if pod.qos == "guaranteed" else pod.qos
    return CGROUP_ROOT / "kubepods" / qos / f"pod{pod.uid}" / container_id


def start_pods(pods: list[HostPod]) -> None:
    """Start every pod's workloads and move each into its container's cgroup."""
    if os.geteuid() != 0:
        raise SystemExit("run as root: it creates cgroups and moves processes into them")
    for pod in pods:
        for index, (mode, gib) in enumerate(pod.workloads):
            visible = pod.visible[index] if index < len(pod.visible) else None
            place(pod, start_workload(mode, gib, {"CUDA_VISIBLE_DEVICES": visible} if visible else None))


def start_in(
    pod: HostPod, modes: list[str], gib: float, env: dict[str, str] | None = None, burst_ms: float = 100.0
) -> list[subprocess.Popen[str]]:
    """Workloads started in new container cgroups of `pod`, each there from its first
    instruction, as the container runtime starts them. Use it while an agent runs: a
    process moved in later (`place`) is on the GPU from its CUDA context on, seconds before
    it is ready, and an agent that sweeps in between reads it outside every pod, which it
    keeps for that process (pods/attribution.py caches by PID and start time: in a cluster
    a process never leaves the pod it was started in)."""
    processes = start_workloads(modes, gib, env, burst_ms, cgroups=[new_container(pod) for _ in modes])
    pod.processes += processes
    return processes


def place(pod: HostPod, process: subprocess.Popen[Any]) -> None:
    """Move a process into a new container cgroup of `pod`: for workloads started before
    the agent (while an agent runs, `start_in`)."""
    (new_container(pod) / "cgroup.procs").write_text(str(process.pid))
    pod.processes.append(process)


def new_container(pod: HostPod) -> Path:
    """A new container cgroup of `pod`, made and noted for `stop_pods` to remove."""
    container_id = uuid.uuid4().hex + uuid.uuid4().hex
    directory = cgroup_dir(pod, container_id)
    directory.mkdir(parents=True, exist_ok=True)
    pod.containers.append((container_id, directory))
    return directory


def stop_pods(pods: list[HostPod], others: list[subprocess.Popen[str]] = ()) -> None:  # type: ignore[assignment]
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
