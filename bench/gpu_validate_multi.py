"""Validate the agent on a node with two or more NVIDIA GPUs.

Run as root on a node with at least two NVIDIA GPUs, cgroup v2, CUDA and
PyTorch, from the repository root; with `--pod`, the agent runs as the
DaemonSet runs it (testkit/pod_harness.py, the rendered manifest, its ratio
`auto` from the kubelet double's replicas of each GPU):

    kubectl kustomize kustomize/base > base.yaml
    python3 bench/gpu_validate_multi.py --pod base.yaml [--out results.md]

What one GPU cannot show:

- `gpu_id` is the NVML index and `gpu_uuid` its UUID on every series, whatever
  order CUDA numbers the devices in: workloads are started with
  CUDA_VISIBLE_DEVICES naming the second GPU, by CUDA index and by UUID, and
  must land on the gpu_id where NVML sees their PIDs;
- a pod with processes on two GPUs gets one row per GPU, each with its own
  memory, utilization and allocation;
- each GPU keeps its own sampling window: a busy GPU next to an idle one reads
  busy and idle;
- each GPU's busy seconds and energy are its own: the busy GPU's counters
  rise faster than the idle one's;
- one GPU's NVML failure (injected at the backend, the NVML seam, in this
  process: a fault no GPU setting need change) leaves the other reported.

It prints a table and exits non-zero on any mismatch (2 when the node has
fewer than two GPUs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import free_port, wait_serving
from testkit.cuda_workloads import require_gpu
from testkit.gpu_node import AGENT_PORT, POD_RESOURCES_DIR, Doubles, pod_harness, start_agent, stop_agent
from testkit.host_pods import HostPod, start_pods, stop_pods
from testkit.report import Report, scrape

GIB = 1024**3
NODE = "gpu-node-2"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--ratio", type=float, default=4.0)
    parser.add_argument("--settle", type=float, default=6.0)
    parser.add_argument("--pod", type=Path, metavar="MANIFEST", help="run the agent as this rendered DaemonSet runs it")
    args = parser.parse_args()
    require_gpu()

    import pynvml  # noqa: PLC0415

    from otel_vgpu.allocation.ratio import RatioSource  # noqa: PLC0415
    from otel_vgpu.allocation.shares import UnknownAllocation  # noqa: PLC0415
    from otel_vgpu.collect.sampler import Sampler  # noqa: PLC0415
    from otel_vgpu.gpu.backend import Device, ErrorCode, GpuError, GpuProcess  # noqa: PLC0415
    from otel_vgpu.gpu.nvml import NvmlBackend  # noqa: PLC0415
    from otel_vgpu.pods.attribution import Attributor, ProcReader  # noqa: PLC0415
    from otel_vgpu.pods.directory import UnresolvedDirectory  # noqa: PLC0415

    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    if count < 2:
        print(f"this node has {count} GPU; the multi-GPU validation needs two or more")
        return 2
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    uuids = [pynvml.nvmlDeviceGetUUID(h) for h in handles]
    buses = [pynvml.nvmlDeviceGetPciInfo(h).busId for h in handles]
    model = pynvml.nvmlDeviceGetName(handles[0])
    driver = pynvml.nvmlSystemGetDriverVersion()
    total = [pynvml.nvmlDeviceGetMemoryInfo(h).total for h in handles]

    # GPU 1 (NVML) busy, GPU 0 idle. The spread pod has an idle process on
    # GPU 0 and a busy one on GPU 1, named by UUID; the by-index pod names
    # CUDA's device 1, which CUDA's own ordering decides.
    spread = HostPod(
        "ml", "spread-0", "systemd", "burstable", workloads=[("idle", 2.0), ("busy", 3.0)], visible=[uuids[0], uuids[1]]
    )
    by_index = HostPod("ml", "cuda-index-1", "cgroupfs", "besteffort", workloads=[("idle", 1.5)], visible=["1"])
    pods = [spread, by_index]
    report = Report()
    lines, check = report.lines, report.check

    tmp = Path(tempfile.mkdtemp(prefix="gpu-validate-multi-", dir="/var/tmp"))
    cluster = Doubles(tmp, NODE, pki=args.pod is not None, socket_dir=POD_RESOURCES_DIR if args.pod else None)
    agent = None
    harness = None
    try:
        start_pods(pods)
        cluster.add(spread, {"main": [f"{uuids[0]}::0", f"{uuids[1]}::0", f"{uuids[1]}::1"]})
        cluster.add(by_index, {"main": [f"{uuids[1]}::2"]})
        if args.pod is not None:
            # `auto`: each GPU's ratio is the replicas the kubelet double advertises for it.
            replicas = int(args.ratio)
            cluster.kubelet.allocatable = {"nvidia.com/gpu": [f"{u}::{n}" for u in uuids for n in range(replicas)]}
            harness = pod_harness(args.pod, tmp / "pod", cluster, NODE)
            url = f"http://127.0.0.1:{AGENT_PORT}"
            wait_serving(url, harness.start(), harness.log.read_text, timeout=60)
            lines += [f"Agent run by testkit/pod_harness.py from {args.pod.name} (ratio auto: {replicas} replicas)", ""]
        else:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            agent = start_agent(cluster, port, args.ratio)
        time.sleep(args.settle)
        first = scrape(f"{url}/metrics")
        first_at = time.monotonic()
        time.sleep(args.settle)
        metrics = scrape(f"{url}/metrics")
        seconds = time.monotonic() - first_at
        # Where NVML itself sees each PID: the truth for gpu_id.
        where: dict[int, int] = {}
        used: dict[tuple[int, int], int] = {}
        for index, handle in enumerate(handles):
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                where[process.pid] = index
                used[(index, process.pid)] = process.usedGpuMemory or 0

        def rows(family: str, pod: HostPod) -> dict[str, tuple[str, float]]:
            return {
                labels["gpu_id"]: (labels["gpu_uuid"], value)
                for labels, value in metrics.get(family, [])
                if (labels.get("namespace"), labels.get("pod")) == (pod.namespace, pod.name)
            }

        lines += [
            f"GPUs: {count} x {model}, driver {driver}; ratio {args.ratio:g}",
            "",
            "| NVML index | UUID | PCI bus |",
            "|---|---|---|",
            *[f"| {i} | {uuids[i]} | {buses[i]} |" for i in range(count)],
            "",
            "| pod | gpu_id | gpu_uuid | processes | memory (agent) | memory (NVML) | SM | allocated |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for pod in pods:
            memory = rows("vgpu_pod_memory_used_bytes", pod)
            for gpu_id, (gpu_uuid, value) in sorted(memory.items()):
                truth = sum(used.get((int(gpu_id), p.pid), 0) for p in pod.processes)
                lines.append(
                    f"| {pod.namespace}/{pod.name} | {gpu_id} | {gpu_uuid} | "
                    f"{rows('vgpu_pod_processes', pod).get(gpu_id, ('', None))[1]} | {value / GIB:.3f} GiB | "
                    f"{truth / GIB:.3f} GiB | "
                    f"{rows('vgpu_pod_sm_utilization_ratio', pod).get(gpu_id, ('', None))[1]} | "
                    f"{rows('vgpu_pod_memory_allocated_bytes', pod).get(gpu_id, ('', 0))[1] / GIB:.1f} GiB |"
                )
        lines += ["", "| check | what |", "|---|---|"]

        # gpu_id is the NVML index, gpu_uuid its UUID, whatever CUDA's order
        for pod in pods:
            expected = {str(where[p.pid]) for p in pod.processes}
            memory = rows("vgpu_pod_memory_used_bytes", pod)
            check(set(memory) == expected, f"{pod.name}: rows on gpu_id {sorted(memory)} == NVML's {sorted(expected)}")
            for gpu_id, (gpu_uuid, value) in memory.items():
                index = int(gpu_id)
                check(gpu_uuid == uuids[index], f"{pod.name}: gpu_id {gpu_id} carries the UUID of NVML index {index}")
                truth = sum(used.get((index, p.pid), 0) for p in pod.processes)
                check(value == truth, f"{pod.name} on GPU {gpu_id}: memory {value:.0f} == NVML {truth}")
        cuda_one = str(where[by_index.processes[0].pid])
        lines.append(f"| info | CUDA_VISIBLE_DEVICES=1 landed on NVML index {cuda_one} |")

        # one row per GPU for the spread pod, each with its own figures
        sm = rows("vgpu_pod_sm_utilization_ratio", spread)
        allocated = rows("vgpu_pod_memory_allocated_bytes", spread)
        check(set(sm) == {"0", "1"}, f"spread-0 has a row on each GPU: {sorted(sm)}")
        if set(sm) == {"0", "1"}:
            check(
                sm["1"][1] > 0.5 and sm["0"][1] < 0.05,
                f"spread-0: busy on GPU 1 ({sm['1'][1]}), idle on 0 ({sm['0'][1]})",
            )
            check(
                allocated["0"][1] == int(1 * total[0] / args.ratio)
                and allocated["1"][1] == int(2 * total[1] / args.ratio),
                f"spread-0: allocation per GPU from its device IDs (1 share on GPU 0, 2 on GPU 1): "
                f"{allocated['0'][1]:.0f}, {allocated['1'][1]:.0f}",
            )
        device_sm = {labels["gpu_id"]: value for labels, value in metrics.get("vgpu_gpu_sm_utilization_ratio", [])}
        check(
            device_sm.get("1", 0) > 0.5 and device_sm.get("0", 1) < 0.05, f"busy GPU 1 next to idle GPU 0: {device_sm}"
        )

        # each GPU's counters are its own: busy seconds and joules rise faster on the busy one
        def rate(family: str) -> dict[str, float]:
            before = {labels["gpu_id"]: value for labels, value in first.get(family, [])}
            after = {labels["gpu_id"]: value for labels, value in metrics.get(family, [])}
            return {gpu: (after[gpu] - before.get(gpu, 0.0)) / seconds for gpu in after}

        busy, watts = rate("vgpu_gpu_sm_busy_seconds_total"), rate("vgpu_gpu_energy_joules_total")
        lines.append(f"| info | busy seconds a second by GPU {busy}; watts by GPU {watts} |")
        check(busy.get("1", 0) > 0.5 and busy.get("0", 1) < 0.05, f"busy seconds: GPU 1 busy, GPU 0 idle: {busy}")
        if watts:
            check(watts.get("1", 0) > watts.get("0", 0), f"energy: GPU 1 draws more than idle GPU 0: {watts}")

        # one GPU failing in the backend leaves the other reported
        class FailingSecond(NvmlBackend):
            def __init__(self, call: str) -> None:
                super().__init__(pynvml)
                self.call = call

            def device(self, index: int) -> Device:
                if self.call == "device" and index == 1:
                    raise GpuError(ErrorCode.GPU_IS_LOST, "injected: GPU is lost")
                return super().device(index)

            def processes(self, index: int) -> list[GpuProcess]:
                if self.call == "processes" and index == 1:
                    raise GpuError(ErrorCode.UNKNOWN, "injected: unknown error")
                return super().processes(index)

        ratio_file = tmp / "ratio.txt"
        ratio_file.write_text(f"{args.ratio}\n")
        for call in ("device", "processes"):
            sampler = Sampler(
                FailingSecond(call),
                attributor=Attributor(ProcReader(Path("/proc"))),
                directory=UnresolvedDirectory(),
                allocation=UnknownAllocation(),
                ratio=RatioSource(ratio_file),
            )
            snapshot = sampler.snapshot(0.0)
            gpu0_pods = {p.pod for p in snapshot.pods if p.gpu_index == 0}
            check(
                snapshot.ok
                and 0 in [g.index for g in snapshot.gpus]
                and spread.uid in gpu0_pods
                and all(p.gpu_index != 1 for p in snapshot.pods)
                and [stage for stage, _ in snapshot.errors] == [call],
                f"GPU 1 failing its {call} call: GPU 0 and its pods reported, error counted as {call!r}",
            )
    finally:
        if harness is not None:
            harness.stop()
        stop_agent(agent)
        stop_pods(pods)
        cluster.stop()

    return report.finish("Multi-GPU validation", args.out)


if __name__ == "__main__":
    raise SystemExit(main())
