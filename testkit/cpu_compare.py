"""The CPU of two versions of the agent on one loaded GPU, measured in one run: the GPU
scripts' "before and after" (bench/gpu_validate_engines.py, bench/gpu_validate_health.py).

Both agents run as the rendered manifest asks (the pod harness), one at a time, alternately,
over the same CUDA processes, so that the load, the clocks and the machine are the same for
both; a figure from another day would compare machines, not versions."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

from testkit.agent import wait_serving
from testkit.cuda_workloads import nvml_truth, start_workloads
from testkit.gpu_node import AGENT_PORT, NODE, Doubles, pod_harness
from testkit.host_pods import HostPod, place, stop_pods
from testkit.report import Report, cpu_while_scraped

SCRAPE_EVERY_S = 15.0
PER_POD = 4
# Past the agent's first engine and GPM windows (10 s), whose closing reads more than a sweep.
SETTLE_S = 12.0
BOUND = 0.10
"""How much more CPU "now" may cost than "before"."""


def add_arguments(parser: argparse.ArgumentParser, *, seconds: float) -> None:
    """The options of `before_and_now`, on a GPU script's command line."""
    parser.add_argument("--before", type=Path, help="for the cost: the directory of the earlier otel_vgpu")
    parser.add_argument("--processes", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cost-seconds", type=float, default=seconds)


def load_gpu(cluster: Doubles, processes: int, gpu_uuid: str) -> tuple[list[HostPod], list[subprocess.Popen[str]]]:
    """`processes` CUDA processes on GPU 0 (a third compute-bound, a third memory-bound, a
    third idle), PER_POD to a pod, each pod granted its replica of the GPU by the kubelet
    double: the load of the cost runs. Started before any agent, so moved into their pods'
    cgroups once ready (`place`); `stop_pods` ends them."""
    pods = [HostPod("load", f"load-{n}", "systemd", "burstable") for n in range(max(1, processes // PER_POD))]
    cluster.kubelet.allocatable = {"nvidia.com/gpu": [f"{gpu_uuid}::{n}" for n in range(len(pods))]}
    try:
        # Copies of 256 MiB: sixteen memory-bound processes copying 2 GiB each (4 GiB held
        # apiece) left an 80 GB H100 out of memory (bench/results/h100-cost-side-by-side-2026-12-06.md).
        started = start_workloads(
            [("busy", "copy", "idle")[n % 3] for n in range(len(pods) * PER_POD)], 0.25, {"COPY_GIB": "0.25"}
        )
        for n, process in enumerate(started):
            place(pods[n // PER_POD], process)
    except BaseException:
        stop_pods(pods)
        raise
    for n, pod in enumerate(pods):
        cluster.add(pod, {"main": [f"{gpu_uuid}::{n}"]})
    return pods, started


def before_and_now(args: argparse.Namespace, cluster: Doubles, tmp: Path, *, deployed_as: str) -> Report:
    """The CPU of the agent in `args.before` (a directory holding its `otel_vgpu`) and of this
    checkout's, each as `args.pod` runs it, with `args.processes` CUDA processes in pods on
    GPU 0 (a third compute-bound, a third memory-bound, a third idle), each scraped every
    15 s, `args.rounds` times each over `args.cost_seconds`; checked against `BOUND`."""
    manifest, before = args.pod, args.before
    rounds, seconds = args.rounds, args.cost_seconds
    report = Report()
    _, _, model, gpu_uuid, driver = nvml_truth()
    url = f"http://127.0.0.1:{AGENT_PORT}"
    pods: list[HostPod] = []
    try:
        pods, started = load_gpu(cluster, args.processes, gpu_uuid)
        figures: dict[str, list[float]] = {"before": [], "now": []}
        versions = [("before", before), ("now", None)]
        for round_ in range(rounds):
            # Before, now; then now, before: a drift over the run (the workloads', the
            # machine's) falls on both alike instead of on whichever always runs second.
            for label, code in versions if round_ % 2 == 0 else versions[::-1]:
                agent = pod_harness(manifest, tmp / f"{label}-{round_}", cluster, NODE, code=code)
                try:
                    wait_serving(url, agent.start(), agent.log.read_text, timeout=60)
                    time.sleep(SETTLE_S)
                    cpu = cpu_while_scraped(
                        agent.agent_pid(), f"{url}/metrics", seconds, SCRAPE_EVERY_S, cpu=agent.cpu_seconds
                    )
                    figures[label].append(cpu)
                finally:
                    agent.stop()
    finally:
        stop_pods(pods)
    report.lines += [
        f"GPU: {model}, driver {driver}; {len(started)} CUDA processes in {len(pods)} pods on GPU 0 "
        f"(a third compute-bound, a third memory-bound, a third idle); each agent as {deployed_as} runs it "
        f"(pod harness, sweeps every 2 s), scraped every {SCRAPE_EVERY_S:g} s; {rounds} rounds of "
        f"{seconds:g} s each, alternately (before first in odd rounds, now first in even ones); CPU from the "
        f"pod's cgroup (cpu.stat usage_usec)",
        "",
        "| agent | CPU of a core, each round | mean |",
        "|---|---|---|",
    ]
    for label, values in figures.items():
        each = ", ".join(f"{v:.2f} %" for v in values)
        report.lines.append(f"| {label} | {each} | {statistics.mean(values):.2f} % |")
    change = statistics.mean(figures["now"]) / statistics.mean(figures["before"]) - 1
    report.lines.append("")
    report.check(change <= BOUND, f"now against before: {change:+.1%} (at most {BOUND:+.0%})")
    return report
