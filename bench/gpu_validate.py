"""Validate the agent on a real NVIDIA GPU against NVML's own per-process figures.

Run as root on a Linux node with an NVIDIA GPU, cgroup v2, CUDA and PyTorch,
from the repository root:

    kubectl kustomize kustomize/base > base.yaml      # where kubectl is
    python3 bench/gpu_validate.py --pod base.yaml [--out results.md]
    python3 bench/gpu_validate.py --pod base.yaml --drop-host-pid [--out blind.md]

With `--pod` the agent runs as the rendered DaemonSet runs it
(testkit/pod_harness.py: its PID, mount and cgroup namespaces, uid and gid, no
capabilities, read-only root, its volumes, its service account against an
HTTPS API double, the kubelet double's socket in a root-owned 0750
directory); without, as root in the host's namespaces, which proves nothing
about a pod. `--drop-host-pid` removes `hostPID` from the pod spec and checks
that the agent says it is blind instead.

It starts CUDA workloads with PyTorch (one busy with matrix products, others
idle but holding memory), creates cgroups shaped like a kubelet's (systemd and
cgroupfs layouts) and moves each workload into its pod's cgroup, leaving one
outside every pod (testkit/host_pods.py). The pods' names come from a
Kubernetes API double and their vGPU shares from a kubelet pod-resources
double (the test doubles: the API's JSON over HTTP, the real gRPC proto on a
Unix socket), so the agent's production clients run. Then it runs the agent
on the real NVML, scrapes it, and checks:

- each pod's memory equals the sum of usedGpuMemory NVML reports for its PIDs;
- the busy pod's SM utilization is above 0.5 and the idle pods' below 0.05;
- the workload outside every pod is unattributed;
- allocated memory is shares x total / ratio, for the shares the kubelet gave;
- a pod with a share and no process shows as an idle allocation.

With `--drop-host-pid` it checks instead that the agent reports no pod, sets
vgpu_agent_blind_gpus, fails /readyz with a reason that names hostPID, and
logs that once.

With `--pod` (and hostPID) it then plays the GPU Operator's driver manager on
the node's labels (testkit/driver_manager.py, through the API double) and
checks that the agent closes every NVIDIA device file it holds (what lets the
kernel unload the driver: /proc/<pid>/fd, /sys/module/nvidia/refcnt) within
the bound docs/kubernetes.md states, says so in /readyz and
vgpu_agent_driver_paused, and reports every pod again once the labels are
lifted. The driver itself is not touched.

It prints a table and exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otel_vgpu.allocation.ratio import parse_ratio
from testkit.agent import free_port, get, wait_serving
from testkit.cuda_workloads import nvml_truth, require_gpu, start_workload
from testkit.driver_manager import DriverManager
from testkit.gpu_node import (
    AGENT_PORT,
    NODE,
    POD_RESOURCES_DIR,
    REPLICAS,
    Doubles,
    pod_harness,
    start_agent,
    stop_agent,
)
from testkit.host_pods import CGROUP_ROOT, HostPod, start_pods, stop_pods
from testkit.report import Check, Report, Samples, scrape

GIB = 1024**3


def nvml_idle() -> str:
    """GPU 0's memory figures before any workload: what an idle GPU holds."""
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    processes = len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    utilization = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
    try:
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        reserved = f", v2 used {v2.used / GIB:.3f} GiB + reserved {v2.reserved / GIB:.3f} GiB"
    except (pynvml.NVMLError, AttributeError, TypeError):
        reserved = ""
    pynvml.nvmlShutdown()
    return (
        f"idle GPU 0 before the workloads: {processes} processes, {utilization} % busy, "
        f"memory used (v1) {v1.used / GIB:.3f} GiB{reserved}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the report (Markdown) here")
    parser.add_argument("--ratio", type=float, default=2.0, help="without --pod; with it, the manifest's ConfigMap's")
    parser.add_argument("--settle", type=float, default=6.0, help="seconds of load before the measured scrape")
    parser.add_argument("--pod", type=Path, metavar="MANIFEST", help="run the agent as this rendered DaemonSet does")
    parser.add_argument("--drop-host-pid", action="store_true", help="with --pod: remove hostPID, expect blindness")
    args = parser.parse_args()
    require_gpu()
    if args.drop_host_pid and args.pod is None:
        parser.error("--drop-host-pid needs --pod")

    pods = [
        HostPod("ml", "trainer-0", "systemd", "burstable", workloads=[("busy", 6.0)], shares=2),
        HostPod("web", "cache-0", "cgroupfs", "besteffort", workloads=[("idle", 4.0)]),
        HostPod("inference", "server-0", "systemd", "guaranteed", workloads=[("idle", 2.0), ("idle", 3.0)]),
        HostPod("inference", "standby-0", "systemd", "burstable", workloads=[]),  # holds a share, runs nothing
    ]
    report = Report()
    lines, check = report.lines, report.check

    tmp = Path(tempfile.mkdtemp(prefix="gpu-validate-", dir="/var/tmp"))
    outside = None
    agent = None
    harness = None
    idle = nvml_idle()
    cluster = Doubles(tmp, NODE, pki=args.pod is not None, socket_dir=POD_RESOURCES_DIR if args.pod else None)
    try:
        start_pods(pods)
        outside = start_workload("idle", 1.0)
        _, total, model, gpu_uuid, driver = nvml_truth()
        # GPU 0 shared by time-slicing into REPLICAS replicas, as the device plugin advertises them
        # (GetAllocatableResources), the pods holding some of them.
        cluster.kubelet.allocatable = {"nvidia.com/gpu": [f"{gpu_uuid}::{n}" for n in range(REPLICAS)]}
        replica = 0
        for pod in pods:
            devices = [f"{gpu_uuid}::{replica + i}" for i in range(pod.shares)]
            replica += pod.shares
            cluster.add(pod, {"main": devices})
        if args.pod is not None:
            # The node as the GPU Operator labels it, for the driver upgrade played below.
            DriverManager(cluster.api, NODE).label_as_the_operator_does()
            harness = pod_harness(args.pod, tmp / "pod", cluster, NODE, drop_host_pid=args.drop_host_pid)
            # `auto`: the replicas the kubelet double advertises, as a time-slicing config of that many would.
            ratio = parse_ratio(next(iter(harness.configmaps.values()))["gpu_allocation.txt"]) or float(REPLICAS)
            url = f"http://127.0.0.1:{AGENT_PORT}"
            wait_serving(url, harness.start(), harness.log.read_text, timeout=60)
            lines += [
                f"Agent run by testkit/pod_harness.py from {args.pod.name}"
                f"{' with hostPID removed' if args.drop_host_pid else ''}; what the kernel says of it:",
                "",
                "| | |",
                "|---|---|",
                *(f"| {k} | `{v}` |" for k, v in harness.evidence(pods[0].processes[0].pid).items()),
                "",
            ]
        else:
            ratio = args.ratio
            port = free_port()
            agent = start_agent(cluster, port, ratio)
            url = f"http://127.0.0.1:{port}"
        time.sleep(args.settle)
        metrics = scrape(f"{url}/metrics")
        status, body, _ = get(f"{url}/readyz", timeout=30)
        ready = (status, body.decode())
        used, *_ = nvml_truth()
        lines += [f"GPU: {model}, driver {driver}, {total / GIB:.1f} GiB; ratio {ratio:g}", "", idle, ""]
        if args.drop_host_pid:
            log = harness.stop() if harness is not None else ""
            blind_checks(check, metrics, ready, log, used)
        else:
            pod_checks(lines, check, metrics, pods, used, total, ratio)
            if harness is not None:
                driver_upgrade_checks(lines, check, DriverManager(cluster.api, NODE), harness.agent_pid(), url)
    finally:
        stop_agent(agent)
        if harness is not None:
            harness.stop()
        stop_pods(pods, [outside] if outside else [])
        cluster.stop()

    return report.finish("Real-GPU validation", args.out)


# How soon the agent must close the driver's files once the labels say paused
# (docs/kubernetes.md, "GPU driver upgrades"; tests/system/test_driver_upgrade.py).
RELEASE_WITHIN_S = 10.0


def nvidia_files(pid: int) -> list[str]:
    """The NVIDIA device files the process holds open. The pod's root is a
    bind of the host's in a mount namespace of its own, so the link may name
    /dev/nvidiactl under that root: the path's end is what counts."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if re.search(r"/dev/nvidia[^/]*$", target):
            held.append(target.rsplit("/dev/", 1)[1])
    return sorted(held)


def module_users() -> int | None:
    """References to the nvidia kernel module: each open device file holds one, and the
    module unloads only at 0 (what the driver manager's rmmod meets). None where
    /sys/module does not show the module (a machine that is itself a container)."""
    try:
        return int(Path("/sys/module/nvidia/refcnt").read_text())
    except OSError:
        return None


def driver_upgrade_checks(lines: list[str], check: Check, manager: DriverManager, agent: int, url: str) -> None:
    held = nvidia_files(agent)
    users_before = module_users()
    manager.pause()
    paused_at = time.monotonic()
    while nvidia_files(agent) and time.monotonic() - paused_at < 3 * RELEASE_WITHIN_S:
        time.sleep(0.02)
    released_s = time.monotonic() - paused_at
    users_after = module_users()
    left = nvidia_files(agent)
    status, body, _ = get(f"{url}/readyz", timeout=30)
    during = scrape(f"{url}/metrics")
    manager.reschedule()
    resumed_at = time.monotonic()
    back = None
    while time.monotonic() - resumed_at < 60:
        back = scrape(f"{url}/metrics")
        if back.get("vgpu_gpu_memory_total_bytes"):
            break
        time.sleep(0.2)
    back_s = time.monotonic() - resumed_at
    ready_after = get(f"{url}/readyz", timeout=30)[0]
    lines += [
        "Driver upgrade, played as the GPU Operator's driver manager plays it on the node's labels:",
        "",
        f"- before: the agent held {len(held)} NVIDIA device files ({', '.join(sorted(set(held)))}); "
        f"nvidia module references {users_before}",
        f"- labels paused: the agent held {len(left)} after {released_s * 1000:.0f} ms; "
        f"module references {users_after}; /readyz {status} `{body.decode().strip()}`",
        f"- labels lifted: GPU series back after {back_s:.1f} s; /readyz {ready_after}",
        "",
    ]
    paused = [value for _, value in during.get("vgpu_agent_driver_paused", [])]
    if not held:
        descriptors = sorted(os.readlink(f"/proc/{agent}/fd/{fd}") for fd in os.listdir(f"/proc/{agent}/fd"))
        lines.append(f"(the agent's descriptors: {descriptors})")
    check(bool(held), f"the agent held NVIDIA device files while running ({len(held)})")
    check(
        not left and released_s < RELEASE_WITHIN_S,
        f"every NVIDIA device file closed within {RELEASE_WITHIN_S:g} s of the pause "
        f"({len(left)} left after {released_s:.2f} s)",
    )
    if users_before is not None and users_after is not None:
        check(
            users_after <= users_before - len(held),
            f"the nvidia module lost the agent's references ({users_before} -> {users_after}, it held {len(held)})",
        )
    check(
        status == 503 and b"paused-for-driver-upgrade" in body,
        f"/readyz says the driver is being upgraded, naming the label ({status})",
    )
    check(
        not during.get("vgpu_gpu_memory_total_bytes")
        and not during.get("vgpu_pod_memory_used_bytes")
        and paused == [1],
        f"no GPU or pod series while paused; vgpu_agent_driver_paused {paused}",
    )
    check(
        back is not None and bool(back.get("vgpu_pod_memory_used_bytes")) and ready_after == 200,
        f"every pod reported again and ready once the labels are lifted (after {back_s:.1f} s, /readyz {ready_after})",
    )


def pod_checks(
    lines: list[str],
    check: Check,
    metrics: Samples,
    pods: list[HostPod],
    used: dict[int, int],
    total: int,
    ratio: float,
) -> None:
    """Every pod's figures against NVML's."""

    def pod_value(family: str, pod: HostPod) -> float | None:
        for labels, value in metrics.get(family, []):
            if (labels.get("namespace"), labels.get("pod")) == (pod.namespace, pod.name):
                return float(value)
        return None

    lines += [
        "| pod | cgroup | processes | memory (agent) | memory (NVML) | SM | vGPU util | shares | allocated |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pod in pods:
        truth = sum(used.get(p.pid, 0) for p in pod.processes)
        where = pod.containers[0][1].relative_to(CGROUP_ROOT).parent if pod.containers else "(no process)"
        lines.append(
            f"| {pod.namespace}/{pod.name} | {where} | {pod_value('vgpu_pod_processes', pod)} | "
            f"{(pod_value('vgpu_pod_memory_used_bytes', pod) or 0) / GIB:.3f} GiB | {truth / GIB:.3f} GiB | "
            f"{pod_value('vgpu_pod_sm_utilization_ratio', pod)} | "
            f"{pod_value('vgpu_pod_vgpu_utilization_ratio', pod)} | "
            f"{pod.shares} | {(pod_value('vgpu_pod_memory_allocated_bytes', pod) or 0) / GIB:.1f} GiB |"
        )
    lines += ["", "| check | what |", "|---|---|"]
    for pod in pods:
        label = f"{pod.namespace}/{pod.name}"
        truth = sum(used.get(p.pid, 0) for p in pod.processes)
        memory = pod_value("vgpu_pod_memory_used_bytes", pod)
        check(memory == truth, f"{label}: memory {memory} == NVML sum {truth} (name from the API double)")
        check(pod_value("vgpu_pod_processes", pod) == len(pod.processes), f"{label}: {len(pod.processes)} processes")
        sm = pod_value("vgpu_pod_sm_utilization_ratio", pod)
        if pod.busy:
            check(sm is not None and sm > 0.5, f"{label}: busy SM {sm} > 0.5")
        else:
            check(sm is not None and sm < 0.05, f"{label}: idle SM {sm} < 0.05")
        allocated = pod_value("vgpu_pod_memory_allocated_bytes", pod)
        expected = int(pod.shares * total / ratio)
        check(allocated == expected, f"{label}: allocated {allocated} == {pod.shares} shares x total / ratio")
    unattributed = [v for labels, v in metrics.get("vgpu_gpu_memory_unattributed_bytes", []) if labels["gpu_id"] == "0"]
    in_pods = {p.pid for pod in pods for p in pod.processes}
    truth_outside = sum(v for pid, v in used.items() if pid not in in_pods)
    check(unattributed == [truth_outside], f"unattributed {unattributed} == NVML outside pods {truth_outside}")
    blind = [v for _, v in metrics.get("vgpu_agent_blind_gpus", [])]
    check(blind == [0], f"vgpu_agent_blind_gpus {blind} == [0]")
    # The pods' SM and the GPU's describe the same moments: the pods never add up to more
    # (NVML's process and device figures are separate counters: 0.02 of slack).
    gpu_sm = [v for labels, v in metrics.get("vgpu_gpu_sm_utilization_ratio", []) if labels["gpu_id"] == "0"]
    pods_sm = sum(pod_value("vgpu_pod_sm_utilization_ratio", pod) or 0.0 for pod in pods)
    check(
        len(gpu_sm) == 1 and gpu_sm[0] > 0.5 and gpu_sm[0] >= pods_sm - 0.02,
        f"GPU 0 SM {gpu_sm} > 0.5 and >= the pods' sum {pods_sm:.2f}",
    )
    count = next(iter(v for _, v in metrics.get("vgpu_agent_collection_duration_seconds_count", [])), 0)
    total_s = next(iter(v for _, v in metrics.get("vgpu_agent_collection_duration_seconds_sum", [])), 0)
    if count:
        lines += ["", f"agent sweep time: mean {total_s / count * 1000:.2f} ms over {count:g} sweeps"]


def blind_checks(check: Check, metrics: Samples, ready: tuple[int, str], log: str, used: dict[int, int]) -> None:
    """An agent outside the host's PID namespace: no pod, and it says why."""
    check(bool(used), f"NVML in the host's namespace lists {len(used)} processes on GPU 0")
    pod_series = sum(len(v) for k, v in metrics.items() if k.startswith("vgpu_pod_"))
    check(pod_series == 0, f"no vgpu_pod_* series ({pod_series}): the driver lists no process to the agent")
    memory = [v for labels, v in metrics.get("vgpu_gpu_memory_used_bytes", []) if labels["gpu_id"] == "0"]
    check(bool(memory) and memory[0] > 10 * GIB, f"the device still reports {memory} bytes in use")
    blind = [v for _, v in metrics.get("vgpu_agent_blind_gpus", [])]
    check(blind == [1], f"vgpu_agent_blind_gpus {blind} == [1]")
    status, body = ready
    check(status == 503 and "hostPID: true" in body, f"/readyz {status}: `{body.strip()}`")
    errors = [line for line in log.splitlines() if " ERROR " in line]
    check(
        len(errors) == 1 and "hostPID: true" in errors[0],
        f"one error line in the log: `{errors[0] if errors else '(none)'}`",
    )


if __name__ == "__main__":
    raise SystemExit(main())
