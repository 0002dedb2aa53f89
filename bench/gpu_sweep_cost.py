"""What the agent's own sweeps cost on a real GPU, against nvitop-exporter at the same cadence.

Each exporter collects on its own clock: the agent every `--sweep-interval`,
nvitop-exporter every `--interval`. Both are scraped every 15 s, as Prometheus
would, while three CUDA processes (busy, bursty, idle) run on GPU 0; the CPU
each uses (utime + stime from /proc/<pid>/stat) over `--seconds` of wall time
is its cost at that cadence. nvitop-exporter runs if it is installed. Then
the CPU of each NVML call a sweep makes, 50 calls each, in this process:
where a sweep's time goes.

Run as root (or any user who can use NVML), with PyTorch and CUDA, from the
repository root:

    python3 bench/gpu_sweep_cost.py [--seconds 20] [--cadences 1 2] [--out results.md]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import free_port
from testkit.cuda_workloads import require_gpu, start_workload
from testkit.gpu_node import bare_agent_command, nvitop_exporter_command, wait_for_metrics
from testkit.nvml_call_costs import call_costs
from testkit.procstat import rss_mib
from testkit.report import cpu_while_scraped, publish

SCRAPE_EVERY_S = 15.0


def cost(command: list[str], url: str, seconds: float) -> tuple[float, float]:
    """CPU % and RSS (MiB) of an exporter collecting on its own clock, scraped every 15 s."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_metrics(url, process)
        time.sleep(2)
        return cpu_while_scraped(process.pid, url, seconds, SCRAPE_EVERY_S), rss_mib(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--cadences", type=float, nargs="+", default=[2.0, 1.0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_gpu()
    import pynvml  # noqa: PLC0415

    workloads = [start_workload("busy", 1.0), start_workload("bursty", 1.0), start_workload("idle", 1.0)]
    tmp = Path(tempfile.mkdtemp(prefix="gpu-sweep-cost-"))
    ratio_file = tmp / "gpu_allocation.txt"
    ratio_file.write_text("2\n")
    nvitop_command = nvitop_exporter_command()
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        model, driver = pynvml.nvmlDeviceGetName(handle), pynvml.nvmlSystemGetDriverVersion()
        count = pynvml.nvmlDeviceGetCount()
        costs = call_costs(pynvml)
        pynvml.nvmlShutdown()
        lines = [
            f"GPU: {model} x{count}, driver {driver}; 3 CUDA processes (busy, bursty, idle) on GPU 0; "
            f"each exporter collecting on its own clock for {args.seconds:g} s, scraped every {SCRAPE_EVERY_S:g} s",
            "",
            "| exporter | cadence | CPU | resident memory |",
            "|---|---|---|---|",
        ]
        for cadence in args.cadences:
            port = free_port()
            agent = [*bare_agent_command(port, ratio_file, "1"), "--sweep-interval", f"{cadence:g}"]
            cpu, rss = cost(agent, f"http://127.0.0.1:{port}/metrics", args.seconds)
            lines.append(f"| otel-vgpu (--sweep-interval {cadence:g}) | {cadence:g} s | {cpu:.2f} % | {rss:.1f} MiB |")
            if nvitop_command is not None:
                port = free_port()
                command = [*nvitop_command, "--bind-address", "127.0.0.1", "--port", str(port)]
                command += ["--interval", f"{cadence:g}"]
                cpu, rss = cost(command, f"http://127.0.0.1:{port}/metrics", args.seconds)
                lines.append(
                    f"| nvitop-exporter (--interval {cadence:g}) | {cadence:g} s | {cpu:.2f} % | {rss:.1f} MiB |"
                )
        if nvitop_command is None:
            lines.append("| nvitop-exporter | not installed | | |")
        lines += costs
    finally:
        for process in workloads:
            process.kill()
    publish("Sweep cost on a real GPU, against nvitop-exporter", lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
