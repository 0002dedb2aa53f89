"""Validate the agent on a real NVIDIA GPU against NVML's own per-process figures.

Run as root on a Linux node with an NVIDIA GPU, cgroup v2, CUDA and PyTorch:

    python3 bench/gpu_validate.py [--out results.md]

It starts CUDA workloads with PyTorch (one busy with matrix products, others
idle but holding memory), creates cgroups shaped like a kubelet's, both
systemd-style (`kubepods.slice/.../kubepods-<qos>-pod<uid_>.slice/cri-containerd-<id>.scope`)
and cgroupfs-style (`kubepods/besteffort/pod<uid>/<id>`), moves each workload
into its pod's cgroup, leaves one outside every pod, then runs the agent on the
real NVML and scrapes it. It checks:

- each pod's memory equals the sum of usedGpuMemory NVML reports for its PIDs;
- the busy pod's SM utilization is above 0.5 and the idle pods' below 0.05;
- the workload outside every pod is unattributed;
- allocated memory is total / ratio (no allocation source: one share).

It prints a table and exits non-zero on any mismatch. Pod names are not
resolved here (no Kubernetes API), so `pod` holds the pod UID.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GIB = 1024**3
WORKLOAD = r"""
import sys, time, torch
mode, gib = sys.argv[1], float(sys.argv[2])
hold = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    if mode == "busy":
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    else:
        time.sleep(0.5)
"""


@dataclass
class Pod:
    name: str
    driver: str  # systemd or cgroupfs
    qos: str
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    workloads: list[tuple[str, float]] = field(default_factory=list)  # (busy|idle, GiB)
    processes: list[subprocess.Popen[str]] = field(default_factory=list)
    cgroups: list[Path] = field(default_factory=list)


def cgroup_dir(pod: Pod, container_id: str) -> Path:
    if pod.driver == "systemd":
        uid = pod.uid.replace("-", "_")
        parent = Path("kubepods.slice")
        if pod.qos != "guaranteed":
            parent = parent / f"kubepods-{pod.qos}.slice" / f"kubepods-{pod.qos}-pod{uid}.slice"
        else:
            parent = parent / f"kubepods-pod{uid}.slice"
        return CGROUP_ROOT / parent / f"cri-containerd-{container_id}.scope"
    qos = "" if pod.qos == "guaranteed" else pod.qos
    return CGROUP_ROOT / "kubepods" / qos / f"pod{pod.uid}" / container_id


def start(mode: str, gib: float) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", WORKLOAD, mode, str(gib)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise SystemExit(f"workload {mode} {gib} GiB did not start")
    return process


def nvml_truth() -> tuple[dict[int, int], int, str, str]:
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    used = {p.pid: p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
    name = pynvml.nvmlDeviceGetName(handle)
    driver = pynvml.nvmlSystemGetDriverVersion()
    pynvml.nvmlShutdown()
    return used, total, name, driver


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    result: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            result.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the report (Markdown) here")
    parser.add_argument("--ratio", type=float, default=2.0)
    parser.add_argument("--settle", type=float, default=6.0, help="seconds of load before the measured scrape")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: it creates cgroups and moves processes into them")

    pods = [
        Pod("busy-systemd", "systemd", "burstable", workloads=[("busy", 6.0)]),
        Pod("idle-cgroupfs", "cgroupfs", "besteffort", workloads=[("idle", 4.0)]),
        Pod("idle-two-procs", "systemd", "guaranteed", workloads=[("idle", 2.0), ("idle", 3.0)]),
    ]
    outside: subprocess.Popen[str] | None = None
    agent: subprocess.Popen[bytes] | None = None
    lines: list[str] = []
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        lines.append(f"| {'ok' if ok else 'FAIL'} | {what} |")
        if not ok:
            failures.append(what)

    tmp = Path(tempfile.mkdtemp(prefix="gpu-validate-"))
    try:
        for pod in pods:
            for mode, gib in pod.workloads:
                process = start(mode, gib)
                container = uuid.uuid4().hex + uuid.uuid4().hex
                directory = cgroup_dir(pod, container)
                directory.mkdir(parents=True, exist_ok=True)
                (directory / "cgroup.procs").write_text(str(process.pid))
                pod.processes.append(process)
                pod.cgroups.append(directory)
        outside = start("idle", 1.0)

        ratio_file = tmp / "gpu_allocation.txt"
        ratio_file.write_text(f"{args.ratio}\n")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
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
            ],
            cwd=Path(__file__).resolve().parents[1],
        )
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape(url)
                break
            except OSError:
                if time.monotonic() > deadline or agent.poll() is not None:
                    raise SystemExit("the agent did not start") from None
                time.sleep(0.2)
        time.sleep(args.settle)
        metrics = scrape(url)
        used, total, model, driver = nvml_truth()

        def pod_value(family: str, pod: Pod) -> float | None:
            for labels, value in metrics.get(family, []):
                if labels.get("pod") == pod.uid:
                    return value
            return None

        lines += [
            f"GPU: {model}, driver {driver}, {total / GIB:.1f} GiB; ratio {args.ratio:g}",
            "",
            "| pod | cgroup | processes | memory (agent) | memory (NVML) | SM | vGPU util | allocated |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for pod in pods:
            truth = sum(used.get(p.pid, 0) for p in pod.processes)
            memory = pod_value("vgpu_pod_memory_used_bytes", pod)
            sm = pod_value("vgpu_pod_sm_utilization", pod)
            vgpu = pod_value("vgpu_pod_vgpu_utilization", pod)
            allocated = pod_value("vgpu_pod_memory_allocated_bytes", pod)
            count = pod_value("vgpu_pod_processes", pod)
            lines.append(
                f"| {pod.name} | {pod.cgroups[0].relative_to(CGROUP_ROOT).parent} | {count} | "
                f"{(memory or 0) / GIB:.3f} GiB | {truth / GIB:.3f} GiB | {sm} | {vgpu} | "
                f"{(allocated or 0) / GIB:.1f} GiB |"
            )
        lines += ["", "| check | what |", "|---|---|"]
        for pod in pods:
            truth = sum(used.get(p.pid, 0) for p in pod.processes)
            memory = pod_value("vgpu_pod_memory_used_bytes", pod)
            check(memory == truth, f"{pod.name}: memory {memory} == NVML sum {truth}")
            check(pod_value("vgpu_pod_processes", pod) == len(pod.processes), f"{pod.name}: process count")
            sm = pod_value("vgpu_pod_sm_utilization", pod)
            busy = any(mode == "busy" for mode, _ in pod.workloads)
            if busy:
                check(sm is not None and sm > 0.5, f"{pod.name}: busy SM {sm} > 0.5")
            else:
                check(sm is not None and sm < 0.05, f"{pod.name}: idle SM {sm} < 0.05")
            allocated = pod_value("vgpu_pod_memory_allocated_bytes", pod)
            check(allocated == int(total / args.ratio), f"{pod.name}: allocated {allocated} == total / ratio")
        unattributed = [
            v for labels, v in metrics.get("vgpu_gpu_memory_unattributed_bytes", []) if labels["gpu_id"] == "0"
        ]
        in_pods = {p.pid for pod in pods for p in pod.processes}
        truth_outside = sum(v for pid, v in used.items() if pid not in in_pods)
        check(unattributed == [truth_outside], f"unattributed {unattributed} == NVML outside pods {truth_outside}")
        durations = {
            n: v
            for n, samples in metrics.items()
            for labels, v in samples
            if n.startswith("vgpu_agent_collection_duration_seconds_")
        }
        count = durations.get("vgpu_agent_collection_duration_seconds_count", 0)
        if count:
            lines.append("")
            mean_ms = durations["vgpu_agent_collection_duration_seconds_sum"] / count * 1000
            lines.append(f"agent sweep time: mean {mean_ms:.2f} ms over {count:g} sweeps")
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=10)
        for process in [p for pod in pods for p in pod.processes] + ([outside] if outside else []):
            process.kill()
            process.wait()
        for pod in pods:
            for directory in pod.cgroups:
                # innermost first; parents only if empty
                for path in [directory, *directory.parents]:
                    if path == CGROUP_ROOT:
                        break
                    try:
                        path.rmdir()
                    except OSError:
                        break
        shutil.rmtree(tmp, ignore_errors=True)

    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(f"# Real-GPU validation\n\n{report}\n")
    print(f"\n{len(failures)} failed" if failures else "\nall checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
