"""The agent's cost on a real NVIDIA GPU, against its floor and against nvitop-exporter.

Run as root on a node with an NVIDIA GPU, cgroup v2, CUDA and PyTorch, from
the repository root:

    python3 bench/gpu_bench.py [--out results.md]

With CUDA workloads running in kubelet-shaped cgroups (testkit/host_pods.py):

1. Sweep time against the floor. The floor is the raw NVML and /proc calls one
   collection makes, timed in a loop with nothing around them (device count,
   memory, utilization, UUID, name, MIG mode, compute and graphics processes,
   process utilization; /proc/<pid>/stat of each process). The agent's sweep is
   Sampler.snapshot with the real NVML backend, in the same process.
2. The agent as a process: CPU per collection and resident memory over
   sequential scrapes with `--min-interval 0`.
3. Side by side with nvitop-exporter, if it is installed, both at a 1 s
   interval and scraped once a second: CPU %, resident memory, scrape latency.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.cuda_workloads import require_gpu
from testkit.gpu_node import bare_agent_command, nvitop_exporter_command, wait_for_metrics
from testkit.host_pods import HostPod, start_pods, stop_pods
from testkit.procstat import cpu_seconds, rss_mib
from testkit.raw_sweep import raw_collection
from testkit.report import publish


def timed(function: Any, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return samples


def ms(samples: list[float], q: float = 0.5) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def scrape(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        response.read()
    return time.perf_counter() - started


def at_one_hertz(command: list[str], url: str, seconds: float) -> tuple[float, float, float]:
    """CPU %, RSS (MiB) and median scrape latency (ms) of an exporter scraped once a second."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_metrics(url, process)
        time.sleep(2)
        cpu_before, started = cpu_seconds(process.pid), time.monotonic()
        latencies = []
        while time.monotonic() - started < seconds:
            latencies.append(scrape(url))
            time.sleep(max(0.0, 1.0 - latencies[-1]))
        cpu = cpu_seconds(process.pid) - cpu_before
        wall = time.monotonic() - started
        return 100 * cpu / wall, rss_mib(process.pid), statistics.median(latencies) * 1000
    finally:
        process.terminate()
        process.wait(timeout=15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each side-by-side run")
    args = parser.parse_args()
    require_gpu()

    import pynvml  # noqa: PLC0415

    from otel_vgpu.allocation.ratio import RatioSource  # noqa: PLC0415
    from otel_vgpu.allocation.shares import UnknownAllocation  # noqa: PLC0415
    from otel_vgpu.collect.sampler import Sampler  # noqa: PLC0415
    from otel_vgpu.gpu.nvml import NvmlBackend  # noqa: PLC0415
    from otel_vgpu.pods.attribution import Attributor, ProcReader  # noqa: PLC0415
    from otel_vgpu.pods.directory import UnresolvedDirectory  # noqa: PLC0415

    pods = [
        HostPod(
            "ml",
            f"worker-{i}",
            ("systemd", "cgroupfs")[i % 2],
            "burstable",
            workloads=[("busy" if i == 0 else "idle", 1.0), ("idle", 0.5)],
        )
        for i in range(6)
    ]
    lines = []
    tmp = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    ratio_file = tmp / "gpu_allocation.txt"
    ratio_file.write_text("2\n")
    try:
        start_pods(pods)
        processes = sum(len(p.processes) for p in pods)
        time.sleep(3)

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        model = pynvml.nvmlDeviceGetName(handles[0])
        driver = pynvml.nvmlSystemGetDriverVersion()
        since = [time.time_ns() // 1000 - 1_000_000 for _ in handles]
        sampler = Sampler(
            NvmlBackend(pynvml),
            attributor=Attributor(ProcReader(Path("/proc"))),
            directory=UnresolvedDirectory(),
            allocation=UnknownAllocation(),
            ratio=RatioSource(ratio_file),
        )
        floor: list[float] = []
        sweep: list[float] = []
        for _ in range(args.runs // 50):  # interleaved, so drift hits both alike
            floor += timed(lambda: raw_collection(pynvml, handles, since), 50)
            sweep += timed(lambda: sampler.snapshot(0.0), 50)
        snapshot = sampler.snapshot(0.0)
        lines += [
            f"GPU: {model} x{len(handles)}, driver {driver}; {len(pods)} pods, {processes} CUDA processes "
            f"({len(snapshot.pods)} pod rows)",
            "",
            "| per collection | median | p90 |",
            "|---|---|---|",
            f"| raw NVML + /proc calls (floor) | {ms(floor):.2f} ms | {ms(floor, 0.9):.2f} ms |",
            f"| agent sweep (Sampler.snapshot) | {ms(sweep):.2f} ms | {ms(sweep, 0.9):.2f} ms |",
            f"| agent / floor | {ms(sweep) / ms(floor):.2f}x | |",
            "",
        ]

        port = 18181
        url = f"http://127.0.0.1:{port}/metrics"
        agent = subprocess.Popen(
            bare_agent_command(port, ratio_file, min_interval="0"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_metrics(url, agent)
            for _ in range(20):
                scrape(url)
            cpu_before = cpu_seconds(agent.pid)
            latencies = [scrape(url) for _ in range(200)]
            cpu_per = (cpu_seconds(agent.pid) - cpu_before) / 200
            lines += [
                "| agent process, 200 sequential scrapes, each a sweep | |",
                "|---|---|",
                f"| scrape latency median / p99 | {ms(latencies):.2f} ms / {ms(latencies, 0.99):.2f} ms |",
                f"| CPU per collection | {cpu_per * 1000:.2f} ms |",
                f"| resident memory | {rss_mib(agent.pid):.1f} MiB |",
                "",
            ]
        finally:
            agent.terminate()
            agent.wait(timeout=15)

        rows = [
            (
                "otel-vgpu (--min-interval 1)",
                *at_one_hertz(bare_agent_command(port, ratio_file, "1"), url, args.seconds),
            )
        ]
        nvitop = nvitop_exporter_command()
        if nvitop is not None:
            command = [*nvitop, "--bind-address", "127.0.0.1", "--port", str(port + 1), "--interval", "1.0"]
            rows.append(
                (
                    "nvitop-exporter (--interval 1.0)",
                    *at_one_hertz(command, f"http://127.0.0.1:{port + 1}/metrics", args.seconds),
                )
            )
        lines += [
            f"| scraped once a second for {args.seconds:g} s | CPU | resident memory | scrape latency median |",
            "|---|---|---|---|",
        ]
        lines += [f"| {name} | {cpu:.2f} % | {rss:.1f} MiB | {latency:.2f} ms |" for name, cpu, rss, latency in rows]
        if len(rows) == 1:
            lines.append("| nvitop-exporter | not installed | | |")
    finally:
        stop_pods(pods)
    publish("Agent cost on a real GPU", lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
