"""Validate the agent on a real NVIDIA GPU against NVML's own per-process figures.

Run as root on a Linux node with an NVIDIA GPU, cgroup v2, CUDA and PyTorch,
from the repository root:

    python3 bench/gpu_validate.py [--out results.md]

It starts CUDA workloads with PyTorch (one busy with matrix products, others
idle but holding memory), creates cgroups shaped like a kubelet's (systemd and
cgroupfs layouts) and moves each workload into its pod's cgroup, leaving one
outside every pod (bench/gpu_workloads.py). The pods' names come from a
Kubernetes API double and their vGPU shares from a kubelet pod-resources
double (the test doubles: the API's JSON over HTTP, the real gRPC proto on a
Unix socket), so the agent's production clients run. Then it runs the agent
on the real NVML, scrapes it, and checks:

- each pod's memory equals the sum of usedGpuMemory NVML reports for its PIDs;
- the busy pod's SM utilization is above 0.5 and the idle pods' below 0.05;
- the workload outside every pod is unattributed;
- allocated memory is shares x total / ratio, for the shares the kubelet gave;
- a pod with a share and no process shows as an idle allocation.

It prints a table and exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_workloads import (
    CGROUP_ROOT,
    Cluster,
    Pod,
    Report,
    free_port,
    scrape,
    start_agent,
    start_pods,
    start_workload,
    stop_agent,
    stop_pods,
)

GIB = 1024**3
NODE = "gpu-node-1"


def nvml_truth() -> tuple[dict[int, int], int, str, str, str]:
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    used = {p.pid: p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
    name = pynvml.nvmlDeviceGetName(handle)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    driver = pynvml.nvmlSystemGetDriverVersion()
    pynvml.nvmlShutdown()
    return used, total, name, uuid, driver


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the report (Markdown) here")
    parser.add_argument("--ratio", type=float, default=2.0)
    parser.add_argument("--settle", type=float, default=6.0, help="seconds of load before the measured scrape")
    args = parser.parse_args()

    pods = [
        Pod("ml", "trainer-0", "systemd", "burstable", workloads=[("busy", 6.0)], shares=2),
        Pod("web", "cache-0", "cgroupfs", "besteffort", workloads=[("idle", 4.0)]),
        Pod("inference", "server-0", "systemd", "guaranteed", workloads=[("idle", 2.0), ("idle", 3.0)]),
        Pod("inference", "standby-0", "systemd", "burstable", workloads=[]),  # holds a share, runs nothing
    ]
    report = Report()
    lines, check = report.lines, report.check

    tmp = Path(tempfile.mkdtemp(prefix="gpu-validate-"))
    outside = None
    agent = None
    cluster = Cluster(tmp, NODE)
    try:
        start_pods(pods)
        outside = start_workload("idle", 1.0)
        _, total, model, gpu_uuid, driver = nvml_truth()
        replica = 0
        for pod in pods:
            devices = [f"{gpu_uuid}::{replica + i}" for i in range(pod.shares)]
            replica += pod.shares
            cluster.add(pod, {"main": devices})
        port = free_port()
        agent = start_agent(cluster, port, args.ratio)
        url = f"http://127.0.0.1:{port}/metrics"
        time.sleep(args.settle)
        metrics = scrape(url)
        used, *_ = nvml_truth()

        def pod_value(family: str, pod: Pod) -> float | None:
            for labels, value in metrics.get(family, []):
                if (labels.get("namespace"), labels.get("pod")) == (pod.namespace, pod.name):
                    return float(value)
            return None

        lines += [
            f"GPU: {model}, driver {driver}, {total / GIB:.1f} GiB; ratio {args.ratio:g}",
            "",
            "| pod | cgroup | processes | memory (agent) | memory (NVML) | SM | vGPU util | shares | allocated |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for pod in pods:
            truth = sum(used.get(p.pid, 0) for p in pod.processes)
            where = pod.containers[0][1].relative_to(CGROUP_ROOT).parent if pod.containers else "(no process)"
            lines.append(
                f"| {pod.namespace}/{pod.name} | {where} | {pod_value('vgpu_pod_processes', pod)} | "
                f"{(pod_value('vgpu_pod_memory_used_bytes', pod) or 0) / GIB:.3f} GiB | {truth / GIB:.3f} GiB | "
                f"{pod_value('vgpu_pod_sm_utilization', pod)} | {pod_value('vgpu_pod_vgpu_utilization', pod)} | "
                f"{pod.shares} | {(pod_value('vgpu_pod_memory_allocated_bytes', pod) or 0) / GIB:.1f} GiB |"
            )
        lines += ["", "| check | what |", "|---|---|"]
        for pod in pods:
            label = f"{pod.namespace}/{pod.name}"
            truth = sum(used.get(p.pid, 0) for p in pod.processes)
            memory = pod_value("vgpu_pod_memory_used_bytes", pod)
            check(memory == truth, f"{label}: memory {memory} == NVML sum {truth} (name from the API double)")
            check(
                pod_value("vgpu_pod_processes", pod) == len(pod.processes), f"{label}: {len(pod.processes)} processes"
            )
            sm = pod_value("vgpu_pod_sm_utilization", pod)
            if pod.busy:
                check(sm is not None and sm > 0.5, f"{label}: busy SM {sm} > 0.5")
            else:
                check(sm is not None and sm < 0.05, f"{label}: idle SM {sm} < 0.05")
            allocated = pod_value("vgpu_pod_memory_allocated_bytes", pod)
            expected = int(pod.shares * total / args.ratio)
            check(allocated == expected, f"{label}: allocated {allocated} == {pod.shares} shares x total / ratio")
        unattributed = [
            v for labels, v in metrics.get("vgpu_gpu_memory_unattributed_bytes", []) if labels["gpu_id"] == "0"
        ]
        in_pods = {p.pid for pod in pods for p in pod.processes}
        truth_outside = sum(v for pid, v in used.items() if pid not in in_pods)
        check(unattributed == [truth_outside], f"unattributed {unattributed} == NVML outside pods {truth_outside}")
        count = next(iter(v for _, v in metrics.get("vgpu_agent_collection_duration_seconds_count", [])), 0)
        total_s = next(iter(v for _, v in metrics.get("vgpu_agent_collection_duration_seconds_sum", [])), 0)
        if count:
            lines += ["", f"agent sweep time: mean {total_s / count * 1000:.2f} ms over {count:g} sweeps"]
    finally:
        stop_agent(agent)
        stop_pods(pods, [outside] if outside else [])
        cluster.stop()

    return report.finish("Real-GPU validation", args.out)


if __name__ == "__main__":
    raise SystemExit(main())
