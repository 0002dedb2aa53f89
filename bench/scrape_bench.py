"""Scrape cost of the agent on a simulated node.

Starts `otel-vgpu --simulate` on a generated node (default 8 GPUs, 80 pods,
320 processes), scrapes /metrics sequentially, and prints scrape latency
(median, p99), CPU time per collection, resident memory and series count.
Every scrape runs a full sweep (`--min-interval 0`), so CPU per scrape is CPU
per collection. Then the same for the floor (bench/floor_server.py): plain
prometheus_client rendering the same series from a snapshot taken once.

    python bench/scrape_bench.py                     # realistic scale
    python bench/scrape_bench.py --pods 384 --processes 1536   # stress scale
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.procstat import cpu_seconds, rss_mib

LAYOUTS = [
    {"version": 2, "driver": "systemd", "runtime": "containerd"},
    {"version": 1, "driver": "cgroupfs", "runtime": "docker"},
    {"version": 2, "driver": "systemd", "runtime": "crio"},
    {"version": 1, "driver": "systemd", "runtime": "containerd"},
]


def scenario(gpus: int, pods: int, processes: int) -> dict[str, object]:
    per_pod, extra = divmod(processes, pods)
    pod_list = []
    for p in range(pods):
        count = per_pod + (1 if p < extra else 0)
        pod_list.append(
            {
                "namespace": f"team-{p % 8}",
                "name": f"workload-{p}",
                "cgroup": LAYOUTS[p % len(LAYOUTS)],
                "shares": {p % gpus: 1},
                "processes": [
                    {
                        "gpu": (p + i) % gpus,
                        "memory": f"{256 + 64 * (i % 8)}MiB",
                        "sm": {"mean": 0.02, "amplitude": 0.01, "period_s": 30 + p % 10},
                    }
                    for i in range(count)
                ],
            }
        )
    return {"gpus": [{"memory": "80GiB"} for _ in range(gpus)], "pods": pod_list}


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
        return body


@dataclass
class Figures:
    median_ms: float
    p99_ms: float
    cpu_ms: float
    rss_mib: float
    series: int
    size_kib: float


def wait_until_serving(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            scrape(url)
            return
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"{url} did not start") from None
            time.sleep(0.1)


def measure(command: list[str], url: str, scrapes: int, warmup: int) -> Figures:
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        wait_until_serving(url, process)
        for _ in range(warmup):
            scrape(url)
        latencies = []
        cpu_before = cpu_seconds(process.pid)
        for _ in range(scrapes):
            started = time.perf_counter()
            body = scrape(url)
            latencies.append(time.perf_counter() - started)
        cpu = cpu_seconds(process.pid) - cpu_before
        rss = rss_mib(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=10)
    latencies.sort()
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    return Figures(
        median_ms=statistics.median(latencies) * 1000,
        p99_ms=latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000,
        cpu_ms=cpu / scrapes * 1000,
        rss_mib=rss,
        series=series,
        size_kib=len(body) / 1024,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=80)
    parser.add_argument("--processes", type=int, default=320)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--port", type=int, default=18099)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        scenario_path = Path(tmp) / "node.yaml"
        scenario_path.write_text(yaml.safe_dump(scenario(args.gpus, args.pods, args.processes)))
        ratio = Path(tmp) / "gpu_allocation.txt"
        ratio.write_text("4\n")
        url = f"http://127.0.0.1:{args.port}/metrics"
        agent = measure(
            [
                sys.executable,
                "-m",
                "otel_vgpu",
                "--simulate",
                str(scenario_path),
                "--allocation-file",
                str(ratio),
                "--address",
                "127.0.0.1",
                "--port",
                str(args.port),
                "--min-interval",
                "0",
                "--log-level",
                "warning",
            ],
            url,
            args.scrapes,
            args.warmup,
        )
        floor = measure(
            [
                sys.executable,
                str(Path(__file__).with_name("floor_server.py")),
                str(scenario_path),
                str(ratio),
                str(args.port),
            ],
            url,
            args.scrapes,
            args.warmup,
        )

    print(f"node: {args.gpus} GPUs, {args.pods} pods, {args.processes} processes; {args.scrapes} scrapes each")
    print(f"{'':24} {'agent':>10} {'floor':>10} {'agent/floor':>12}")
    for label, attr, unit in (
        ("scrape latency median", "median_ms", "ms"),
        ("scrape latency p99", "p99_ms", "ms"),
        ("CPU per collection", "cpu_ms", "ms"),
        ("resident memory", "rss_mib", "MiB"),
        ("series per scrape", "series", ""),
        ("response size", "size_kib", "KiB"),
    ):
        a, f = getattr(agent, attr), getattr(floor, attr)
        ratio_text = f"{a / f:10.2f}x" if f else ""
        print(f"{label:24} {a:8.1f}{unit:>3} {f:8.1f}{unit:>3} {ratio_text:>12}")


if __name__ == "__main__":
    main()
