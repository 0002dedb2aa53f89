"""Memory bandwidth and the video engines per pod on a real GPU, through the pod harness,
and what they cost.

Run as root on a GPU node from the repository root, with the rendered manifest
(bench/README.md says what the GPU scripts need):

    kubectl kustomize kustomize/base > base.yaml
    python3 bench/gpu_validate_engines.py --pod base.yaml --part proof [--seconds 120] [--out results.md]
    python3 bench/gpu_validate_engines.py --pod base.yaml --part cost --before DIR [--out results.md]

`--part proof`: four pods as the agent sees them through the pod harness
(testkit/pod_harness.py): a compute-bound one (bf16 matrix products), a
memory-bound one (device-to-device copies of 2 GiB), an idle one holding
memory, and one decoding JPEG frames with nvJPEG. Once the first engine window
has closed, it is scraped every `--every` seconds for `--seconds`, as
Prometheus would, and NVML's own per-process figures are read beside it. The
checks: NVML's per-process memUtil against smUtil (why no per-pod memory-copy
family is published), none published; the GPU's memory copy high while the
copies run; the idle pod reads 0 on every engine published per pod; on every
scrape the pods' sum of each engine is at most the GPU's figure; where NVML
saw the JPEG engine busy, the JPEG pod's figure is above 0; each busy-seconds
counter's rate over the run is within 0.05 of the mean of its gauge; and an
engine the GPU lacks (the H200's encoder) has no family.

`--part cost`: the CPU of the agent before these families (`--before`: a
directory holding that version's `otel_vgpu` package) and now, each run as the
DaemonSet runs it, with `--processes` CUDA processes in pods on GPU 0 (a third
compute-bound, a third memory-bound, a third idle), each agent sweeping on its
own clock (the manifest's 2 s) and scraped every 15 s, alternately, `--rounds`
times each, over `--cost-seconds` each time.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otel_vgpu.gpu.backend import ENGINES
from testkit.agent import wait_serving
from testkit.cpu_compare import add_arguments as add_cost_arguments
from testkit.cpu_compare import before_and_now
from testkit.cuda_workloads import nvml_truth, require_gpu, start_workloads
from testkit.gpu_node import AGENT_PORT, NODE, POD_RESOURCES_DIR, Doubles, pod_harness
from testkit.host_pods import HostPod, place, stop_pods
from testkit.report import Report, scrape

TOLERANCE = 0.05
SCRAPE_EVERY_S = 15.0


@dataclass
class Reading:
    at: float
    pods: dict[str, dict[str, float]]
    """Each engine's gauge on GPU 0, by engine, then pod."""
    pod_busy: dict[str, dict[str, float]]
    gpu: dict[str, float]
    gpu_busy: dict[str, float]
    families: set[str]


def read(url: str) -> Reading:
    at = time.monotonic()
    samples = scrape(f"{url}/metrics")

    def pods(name: str) -> dict[str, float]:
        return {labels["pod"]: value for labels, value in samples.get(name, []) if labels.get("gpu_id") == "0"}

    def gpu(name: str) -> float | None:
        return next((v for labels, v in samples.get(name, []) if labels.get("gpu_id") == "0"), None)

    gauges = {e: pods(f"vgpu_pod_{e}_utilization_ratio") for e in ENGINES}
    busy = {e: pods(f"vgpu_pod_{e}_busy_seconds_total") for e in ENGINES}
    gpu_gauges = {e: v for e in ENGINES if (v := gpu(f"vgpu_gpu_{e}_utilization_ratio")) is not None}
    gpu_busy = {e: v for e in ENGINES if (v := gpu(f"vgpu_gpu_{e}_busy_seconds_total")) is not None}
    return Reading(at, gauges, busy, gpu_gauges, gpu_busy, set(samples))


def nvml_per_process(pids: dict[int, str]) -> tuple[dict[str, dict[str, float]], float]:
    """NVML's own latest per-process figures of the last 2 s (smUtil, memUtil, jpgUtil; 0-1) for
    `pids`, by name, and the GPU's MEMORY samples' mean over them: read here as root, beside the agent."""
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        since = time.time_ns() // 1000 - 2_000_000
        try:
            samples = pynvml.nvmlDeviceGetProcessesUtilizationInfo(handle, since)
        except pynvml.NVMLError:
            samples = []
        figures = {
            pids[s.pid]: {"sm": s.smUtil / 100, "memory_copy": s.memUtil / 100, "jpeg": s.jpgUtil / 100}
            for s in samples
            if s.pid in pids
        }
        _, gpu = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_MEMORY_UTILIZATION_SAMPLES, since)
        memory = statistics.mean(g.sampleValue.uiVal / 100 for g in gpu) if gpu else 0.0
        return figures, memory
    finally:
        pynvml.nvmlShutdown()


def proof(args: argparse.Namespace, cluster: Doubles, tmp: Path) -> Report:
    report = Report()
    lines, check = report.lines, report.check
    compute = HostPod("ml", "compute-0", "systemd", "guaranteed")
    memory = HostPod("llm", "memory-0", "systemd", "burstable")
    idle = HostPod("ml", "idle-0", "cgroupfs", "besteffort")
    jpeg = HostPod("vision", "jpeg-0", "systemd", "burstable")
    pods = [compute, memory, idle, jpeg]
    _, _, model, gpu_uuid, driver = nvml_truth()
    cluster.kubelet.allocatable = {"nvidia.com/gpu": [f"{gpu_uuid}::{n}" for n in range(len(pods))]}
    agent = None
    try:
        for pod, process in zip(pods, start_workloads(["busy", "copy", "idle", "jpeg"], 2.0), strict=True):
            place(pod, process)
        for n, pod in enumerate(pods):
            cluster.add(pod, {"main": [f"{gpu_uuid}::{n}"]})
        pids = {pod.processes[0].pid: pod.name for pod in pods}
        agent = pod_harness(args.pod, tmp / "pod", cluster, NODE)
        url = f"http://127.0.0.1:{AGENT_PORT}"
        wait_serving(url, agent.start(), agent.log.read_text, timeout=60)
        deadline = time.monotonic() + 60
        while not read(url).pods["jpeg"].keys() >= {p.name for p in pods}:
            if time.monotonic() > deadline:
                raise SystemExit("no engine window closed within 60 s:\n" + agent.log.read_text()[-2000:])
            time.sleep(1)
        readings: list[Reading] = []
        nvml: list[tuple[dict[str, dict[str, float]], float]] = []
        started = time.monotonic()
        while True:
            readings.append(read(url))
            nvml.append(nvml_per_process(pids))
            if readings[-1].at - started >= args.seconds:
                break
            time.sleep(args.every)
        engines = sorted(readings[0].gpu)
        pod_engines = sorted(e for e in engines if readings[0].pods[e])
        lines += [
            f"GPU: {model}, driver {driver}; the agent as kustomize/base deploys it (pod harness); "
            f"{len(readings)} scrapes {args.every:g} s apart over {readings[-1].at - readings[0].at:.0f} s; "
            f"the GPU's engines: {', '.join(engines)}; published per pod: {', '.join(pod_engines)}",
            "",
        ]
        for engine in engines:
            shown = engine in pod_engines
            lines += [
                f"**{engine}**: "
                + (
                    "each pod's gauge, their sum, the GPU's gauge; then each pod's busy seconds."
                    if shown
                    else "the GPU's gauge and busy seconds."
                ),
                "",
                "| scrape | s | "
                + (
                    " | ".join(p.name for p in pods) + " | pods' sum | GPU | busy: " + " | ".join(p.name for p in pods)
                    if shown
                    else "GPU | busy"
                )
                + " |",
                "|---" * ((2 * len(pods) + 4) if shown else 4) + "|",
            ]
            for i, r in enumerate(readings):
                if shown:
                    gauges = " | ".join(f"{r.pods[engine].get(p.name, float('nan')):.3f}" for p in pods)
                    busy = " | ".join(f"{r.pod_busy[engine].get(p.name, float('nan')):.2f}" for p in pods)
                    lines.append(
                        f"| {i} | {r.at - readings[0].at:.0f} | {gauges} | {sum(r.pods[engine].values()):.3f} | "
                        f"{r.gpu.get(engine, float('nan')):.3f} | {busy} |"
                    )
                else:
                    lines.append(
                        f"| {i} | {r.at - readings[0].at:.0f} | {r.gpu[engine]:.3f} | {r.gpu_busy[engine]:.2f} |"
                    )
            lines.append("")
        lines += [
            "NVML's own per-process figures at each scrape (read here as root, latest sample of the last 2 s): "
            "smUtil and memUtil of each process, memUtil / smUtil, and the GPU's MEMORY samples' mean.",
            "",
            "| scrape | " + " | ".join(f"{p.name} sm, mem, mem/sm" for p in (compute, memory)) + " | GPU memory |",
            "|---|---|---|---|",
        ]
        ratios: list[tuple[float, float]] = []
        for i, (figures, gpu_memory) in enumerate(nvml):
            cells = []
            pair = []
            for pod in (compute, memory):
                f = figures.get(pod.name, {"sm": 0.0, "memory_copy": 0.0})
                ratio = f["memory_copy"] / f["sm"] if f["sm"] else float("nan")
                pair.append(ratio)
                cells.append(f"{f['sm']:.2f}, {f['memory_copy']:.2f}, {ratio:.2f}")
            ratios.append((pair[0], pair[1]))
            lines.append(f"| {i} | {' | '.join(cells)} | {gpu_memory:.2f} |")
        lines.append("")
        first, last = readings[0], readings[-1]
        seconds = last.at - first.at
        split = [(a, b) for a, b in ratios if not (math.isnan(a) or math.isnan(b))]
        lines.append(
            "NVML's per-process memUtil is the GPU's memory figure split by SM time when memUtil / smUtil is the "
            "same for the compute-bound and the memory-bound process: "
            + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in split)
        )
        lines.append("")
        check(
            "memory_copy" not in pod_engines and not any(f.startswith("vgpu_pod_memory_copy") for f in last.families),
            "no per-pod memory-copy family (NVML's per-process figure is the GPU's split by SM time)",
        )
        check(
            all(r.gpu["memory_copy"] >= 0.5 for r in readings),
            "the GPU's memory copy is at least 0.5 on every scrape, with the copies running ("
            + ", ".join(f"{r.gpu['memory_copy']:.2f}" for r in readings)
            + ")",
        )
        idle_figures = [r.pods[e].get(idle.name) for r in readings for e in pod_engines]
        check(
            all(v == 0 for v in idle_figures),
            f"the idle pod reads 0 on every engine published per pod, every scrape ({len(idle_figures)} figures)",
        )
        over = [
            (i, e, round(sum(r.pods[e].values()), 3), round(r.gpu[e], 3))
            for i, r in enumerate(readings)
            for e in pod_engines
            if sum(r.pods[e].values()) > r.gpu[e] + 1e-9
        ]
        check(not over, f"on every scrape the pods' sum of each engine is at most the GPU's (over: {over})")
        jpeg_seen = max((f.get(jpeg.name, {}).get("jpeg", 0.0) for f, _ in nvml), default=0.0)
        if jpeg_seen > 0:
            check(
                all(r.pods["jpeg"].get(jpeg.name, 0) > 0 for r in readings[1:]),
                f"NVML saw the JPEG engine busy for jpeg-0 (up to {jpeg_seen:.2f}): its pod's JPEG figure is above 0",
            )
        else:
            lines += [
                "nvJPEG as torchvision calls it did not use the JPEG engine here (NVML's jpgUtil stayed 0 for "
                "jpeg-0): it decodes on the SMs, so the per-pod video families read 0 throughout this run.",
                "",
            ]
        worst = 0.0
        for engine in engines:
            for pod in pods if engine in pod_engines else ():
                rate = (last.pod_busy[engine][pod.name] - first.pod_busy[engine][pod.name]) / seconds
                mean = statistics.mean(r.pods[engine][pod.name] for r in readings[1:])
                worst = max(worst, abs(rate - mean))
                lines.append(f"- {pod.name} {engine}: rate of busy seconds {rate:.3f}, mean of its gauge {mean:.3f}")
            rate = (last.gpu_busy[engine] - first.gpu_busy[engine]) / seconds
            mean = statistics.mean(r.gpu[engine] for r in readings[1:])
            worst = max(worst, abs(rate - mean))
            lines.append(f"- GPU {engine}: rate of busy seconds {rate:.3f}, mean of its gauge {mean:.3f}")
        lines.append("")
        check(worst <= TOLERANCE, f"every counter's rate is within {TOLERANCE} of its gauge's mean (worst {worst:.3f})")
        unused = [e for e in engines if e != "memory_copy" and not any(r.gpu[e] > 0 for r in readings)]
        check(
            bool(unused) and not any(r.pods[e] for r in readings for e in unused),
            f"no pod has a family of an engine nobody used on the GPU ({', '.join(unused)}); the GPU's reads 0",
        )
        lacking = [e for e in ENGINES if e not in engines]
        prefixes = tuple(f"vgpu_{kind}_{e}_" for kind in ("pod", "gpu") for e in lacking)
        present = [f for f in last.families if f.startswith(prefixes)] if prefixes else []
        check(
            bool(lacking) and not present,
            f"the engines this GPU lacks ({', '.join(lacking) or 'none'}) have no family (found: {present})",
        )
    finally:
        if agent is not None:
            agent.stop()
        stop_pods(pods)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pod", type=Path, required=True, metavar="MANIFEST")
    parser.add_argument("--part", choices=("proof", "cost"), required=True)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--every", type=float, default=15.0, help="seconds between scrapes")
    add_cost_arguments(parser, seconds=45.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.part == "cost" and (args.before is None or not (args.before / "otel_vgpu").is_dir()):
        parser.error("--part cost needs --before DIR, a directory holding the earlier otel_vgpu package")
    require_gpu()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-engines-", dir="/var/tmp"))
    cluster = Doubles(tmp, NODE, pki=True, socket_dir=POD_RESOURCES_DIR)
    try:
        report = (
            proof(args, cluster, tmp)
            if args.part == "proof"
            else before_and_now(args, cluster, tmp, deployed_as="kustomize/base")
        )
    finally:
        cluster.stop()
    title = "Memory copy and the video engines per pod" if args.part == "proof" else "What the engine families cost"
    return report.finish(f"{title}, on a real GPU", args.out)


if __name__ == "__main__":
    raise SystemExit(main())
