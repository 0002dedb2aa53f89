"""Busy seconds on a real GPU: does rate() of the agent's counter give what a pod ran?

Run as root on a GPU node from the repository root, with the rendered manifest
(bench/README.md says what the GPU scripts need):

    kubectl kustomize kustomize/base > base.yaml
    python3 bench/gpu_validate_usage.py --pod base.yaml [--seconds 120] [--out results.md]

Five pods, as the agent sees them through the pod harness (testkit/pod_harness.py)
with its own sweeps every --sweep-interval (the base's default): one running
kernels for `--burst-ms` of every second (bursty), one running kernels for
`--steady-share` of every 100 ms (steady), one idle holding memory and a
share, one holding a share and running nothing, and one the kubelet lists
with no device that runs kernels `--rogue-ms` of every second (use without an
allocation, as an MPS control daemon's pod). The agent first sweeps the GPU
idle for `--idle-s` seconds, so it learns the idle power, then the busy
workloads start. What each ran is counted by the workload itself: the steps
it completed times one step's time alone on the GPU (time-slicing stretches
a process's wall time, not its work). It is scraped every `--every` seconds,
as Prometheus would; the check is that each pod's busy-seconds counter, over
the run, rises at the rate its workload ran (within 0.05), that the GPU's
rises at least as fast as the pods' sum, that on every scrape the pods' SM
gauges add up to no more than the GPU's, and that the counters never go
back; that the pod without a device holds nothing
(allocated memory 0) while the others hold their share; that the GPU's
joules follow NVML's own counter (read here as root) within 1 %, the pods'
and the unattributed adding up to them; and that the idle power learned went
to the pods by shares held (the share holders running nothing got energy).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otel_vgpu.config import ENERGY_EVERY_S
from testkit.agent import wait_serving
from testkit.cuda_workloads import nvml_truth, require_gpu, start_workload
from testkit.gpu_node import AGENT_PORT, NODE, POD_RESOURCES_DIR, REPLICAS, Doubles, pod_harness
from testkit.host_pods import HostPod, place, stop_pods
from testkit.report import Report, scrape

TOLERANCE = 0.05


def energy(url: str) -> tuple[float, float, float]:
    """GPU 0's joules, the pods' joules on it together, and its unattributed joules."""
    samples = scrape(f"{url}/metrics")

    def on_gpu0(name: str) -> float:
        return sum(v for labels, v in samples.get(name, []) if labels.get("gpu_id") == "0")

    return (
        on_gpu0("vgpu_gpu_energy_joules_total"),
        on_gpu0("vgpu_pod_energy_joules_total"),
        on_gpu0("vgpu_gpu_energy_unattributed_joules_total"),
    )


def nvml_energy_j() -> float:
    """NVML's own energy counter of GPU 0, read here as root."""
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    try:
        return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(0))) / 1000
    finally:
        pynvml.nvmlShutdown()


def by_pod(url: str, family: str) -> dict[str, float]:
    """A pod family's value on GPU 0, by pod."""
    return {
        labels["pod"]: value
        for labels, value in scrape(f"{url}/metrics").get(family, [])
        if labels.get("gpu_id") == "0"
    }


@dataclass
class Reading:
    at: float
    busy: dict[str, float]
    """Each pod's busy seconds on GPU 0."""
    gpu_busy: float
    sm: dict[str, float]
    """Each pod's SM gauge on GPU 0."""
    gpu_sm: float
    work: dict[str, float]
    """GPU seconds of work each workload counted itself."""


def read(url: str, work_files: dict[str, Path]) -> Reading:
    """One scrape of GPU 0's counters and gauges, and the workloads' own counts."""
    at = time.monotonic()
    samples = scrape(f"{url}/metrics")

    def pods(name: str) -> dict[str, float]:
        return {labels["pod"]: value for labels, value in samples.get(name, []) if labels.get("gpu_id") == "0"}

    def gpu(name: str) -> float:
        return next((v for labels, v in samples.get(name, []) if labels["gpu_id"] == "0"), 0.0)

    work = {name: float(path.read_text().split()[1]) for name, path in work_files.items() if path.exists()}
    return Reading(
        at,
        pods("vgpu_pod_sm_busy_seconds_total"),
        gpu("vgpu_gpu_sm_busy_seconds_total"),
        pods("vgpu_pod_sm_utilization_ratio"),
        gpu("vgpu_gpu_sm_utilization_ratio"),
        work,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pod", type=Path, required=True, metavar="MANIFEST")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--every", type=float, default=15.0, help="seconds between scrapes")
    parser.add_argument("--burst-ms", type=float, default=300.0)
    parser.add_argument("--steady-share", type=float, default=0.3, help="the steady pod's share of every 100 ms")
    parser.add_argument("--rogue-ms", type=float, default=100.0, help="the device-less pod's kernels a second")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle sweeps before the workloads start")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_gpu()
    report = Report()
    lines, check = report.lines, report.check
    bursty = HostPod("ml", "bursty-0", "systemd", "burstable")
    steady = HostPod("ml", "steady-0", "systemd", "guaranteed")
    idle = HostPod("ml", "idle-0", "cgroupfs", "besteffort")
    standby = HostPod("web", "standby-0", "systemd", "burstable")  # a share, no process
    rogue = HostPod("tools", "nodevice-0", "cgroupfs", "besteffort")  # listed with no device
    pods = [bursty, steady, idle, standby, rogue]
    tmp = Path(tempfile.mkdtemp(prefix="gpu-usage-", dir="/var/tmp"))
    cluster = Doubles(tmp, NODE, pki=True, socket_dir=POD_RESOURCES_DIR)
    harness = None
    try:
        place(idle, start_workload("idle", 2.0))
        _, _, model, gpu_uuid, driver = nvml_truth()
        cluster.kubelet.allocatable = {"nvidia.com/gpu": [f"{gpu_uuid}::{n}" for n in range(REPLICAS)]}
        for n, pod in enumerate([bursty, steady, idle, standby]):
            cluster.add(pod, {"main": [f"{gpu_uuid}::{n}"]})
        cluster.add(rogue, {})  # the kubelet lists every pod: this one with no device
        harness = pod_harness(args.pod, tmp / "pod", cluster, NODE)
        url = f"http://127.0.0.1:{AGENT_PORT}"
        wait_serving(url, harness.start(), harness.log.read_text, timeout=60)
        agent_up = time.monotonic()
        time.sleep(args.idle_s)  # sweeps of an idle GPU: the idle power is learned
        work_files = {p.name: tmp / f"{p.name}.work" for p in (bursty, steady, rogue)}
        runs = [
            (bursty, "bursty", 2.0, args.burst_ms),
            (steady, "steady", 2.0, args.steady_share * 1000),
            (rogue, "bursty", 1.0, args.rogue_ms),
        ]
        for pod, mode, gib, ms in runs:
            place(pod, start_workload(mode, gib, {"WORK_FILE": str(work_files[pod.name])}, burst_ms=ms))
        time.sleep(5)  # the workloads' first samples
        readings: list[Reading] = []
        joules_before, nvml_before = energy(url), nvml_energy_j()
        started = time.monotonic()
        while True:
            readings.append(read(url, work_files))
            if readings[-1].at - started >= args.seconds:
                break
            time.sleep(args.every)
        lines += [
            f"GPU: {model}, driver {driver}; {len(readings)} scrapes {args.every:g} s apart over "
            f"{readings[-1].at - readings[0].at:.0f} s; bursty-0 runs kernels {args.burst_ms:g} ms a second, "
            f"steady-0 {args.steady_share:.0%} of every 100 ms, nodevice-0 {args.rogue_ms:g} ms a second",
            "",
            "Busy seconds on each scrape, then the SM gauges: each pod's, their sum, the GPU's.",
            "",
            "| scrape | s | "
            + " | ".join(p.name for p in pods)
            + " | GPU | SM: "
            + " | ".join(p.name for p in pods)
            + " | pods' sum | GPU |",
            "|---" * (2 * len(pods) + 5) + "|",
        ]
        for i, r in enumerate(readings):
            busy = " | ".join(f"{r.busy.get(p.name, float('nan')):.2f}" for p in pods)
            sm = " | ".join(f"{r.sm.get(p.name, float('nan')):.3f}" for p in pods)
            lines.append(
                f"| {i} | {r.at - readings[0].at:.0f} | {busy} | {r.gpu_busy:.2f} | {sm} | "
                f"{sum(r.sm.values()):.3f} | {r.gpu_sm:.3f} |"
            )
        lines.append("")
        first, last = readings[0], readings[-1]
        seconds = last.at - first.at

        def rate(name: str) -> float:
            return (last.busy.get(name, 0.0) - first.busy.get(name, 0.0)) / seconds

        def ran(name: str) -> float:
            return (last.work.get(name, 0.0) - first.work.get(name, 0.0)) / seconds

        for pod in pods:
            got, truth = rate(pod.name), ran(pod.name)
            check(abs(got - truth) <= TOLERANCE, f"{pod.name}: rate of busy seconds {got:.3f}, ran {truth:.3f}")
        pods_rate = sum(rate(p.name) for p in pods)
        gpu_rate = (last.gpu_busy - first.gpu_busy) / seconds
        check(gpu_rate >= pods_rate - 0.01, f"GPU's rate {gpu_rate:.3f} >= the pods' sum {pods_rate:.3f}")
        lines += ["", f"The workloads ran {sum(ran(p.name) for p in pods):.3f} of the GPU together.", ""]
        over = [
            (i, sum(r.sm.values()), r.gpu_sm) for i, r in enumerate(readings) if sum(r.sm.values()) > r.gpu_sm + 0.01
        ]
        check(not over, f"on every scrape the pods' SM gauges add up to no more than the GPU's (over on {over})")
        monotonic = all(
            later.busy.get(p.name, 0.0) >= earlier.busy.get(p.name, 0.0) and later.gpu_busy >= earlier.gpu_busy
            for earlier, later in itertools.pairwise(readings)
            for p in pods
        )
        check(monotonic, "no counter went back between scrapes")
        allocated = by_pod(url, "vgpu_pod_memory_allocated_bytes")
        lines += ["", f"Allocated memory on GPU 0 by pod (bytes): {dict(sorted(allocated.items()))}", ""]
        check(allocated.get(rogue.name) == 0, f"{rogue.name}, listed with no device, holds nothing")
        check(
            all((allocated.get(p.name) or 0) > 0 for p in (bursty, steady, idle, standby)),
            "the four pods given a replica hold it",
        )
        joules_after, nvml_after = energy(url), nvml_energy_j()
        gpu_j = joules_after[0] - joules_before[0]
        nvml_j = nvml_after - nvml_before
        parts_j = (joules_after[1] + joules_after[2]) - (joules_before[1] + joules_before[2])
        lines += [
            "",
            f"Energy over the run: the agent's GPU counter {gpu_j:.0f} J ({gpu_j / seconds:.0f} W), NVML's own "
            f"{nvml_j:.0f} J; the pods' {joules_after[1] - joules_before[1]:.0f} J and the unattributed "
            f"{joules_after[2] - joules_before[2]:.0f} J",
            "",
        ]
        # The agent's counter is as of its last read of NVML's (every ENERGY_EVERY_S, 10 s;
        # every sweep when h200-usage*.md were run): two such intervals' energy of slack, on
        # top of 1 %.
        slack = 0.01 * nvml_j + 2 * ENERGY_EVERY_S * nvml_j / seconds
        check(
            abs(gpu_j - nvml_j) <= slack, f"the GPU's joules {gpu_j:.0f} match NVML's {nvml_j:.0f} (within {slack:.0f})"
        )
        check(abs(parts_j - gpu_j) <= 0.01 * gpu_j, f"pods + unattributed {parts_j:.0f} J == the GPU's {gpu_j:.0f} J")
        pod_joules = by_pod(url, "vgpu_pod_energy_joules_total")
        lines += [
            "",
            f"Joules by pod since the agent started: { {k: round(v) for k, v in sorted(pod_joules.items())} }",
            "",
        ]
        # A share holder running nothing gets idle power x its share (1 of the ratio's REPLICAS).
        standby_w = pod_joules.get(standby.name, 0.0) / (time.monotonic() - agent_up)
        check(
            pod_joules.get(standby.name, 0.0) > 0,
            f"idle power learned and billed by shares: {standby.name} (a share, no process) got "
            f"{pod_joules.get(standby.name, 0.0):.0f} J, about {standby_w * REPLICAS:.0f} W of idle power for the GPU",
        )
        check(pod_joules.get(rogue.name, 0.0) > 0, f"{rogue.name} is billed its SM share of the active energy")
    finally:
        if harness is not None:
            harness.stop()
        stop_pods(pods)
        cluster.stop()
    return report.finish("Busy seconds on a real GPU", args.out)


if __name__ == "__main__":
    raise SystemExit(main())
