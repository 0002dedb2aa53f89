"""What the agent's own sweeps cost: CPU of an agent nobody scrapes, by --sweep-interval.

On the realistic simulated node (8 GPUs, 80 pods, 320 processes, as
bench/scrape_bench.py builds it), the agent runs for a while with each
interval and no scrape; its CPU time (utime + stime from /proc/<pid>/stat)
over that wall time is the cost of sweeping. `0` is the agent without sweeps
of its own (what it costs to sit idle).

    .venv/bin/python bench/sweep_cost.py [--seconds 20] [--intervals 0 1 2 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scrape_bench import scenario
from testkit.agent import clean_env, command, free_port, wait_serving


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--intervals", type=float, nargs="+", default=[0.0, 1.0, 2.0, 5.0])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        node = Path(directory) / "node.json"
        node.write_text(json.dumps(scenario(8, 80, 320)))
        ratio = Path(directory) / "gpu_allocation.txt"
        ratio.write_text("2\n")
        print(f"| --sweep-interval | CPU over {args.seconds:g} s, no scrape | per sweep |")
        print("|---|---|---|")
        for interval in args.intervals:
            port = free_port()
            argv = command("--simulate", str(node), "--allocation-file", str(ratio), "--port", str(port))
            process = subprocess.Popen(
                [*argv, "--address", "127.0.0.1", "--sweep-interval", f"{interval:g}", "--no-kubernetes"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=clean_env(),
            )
            try:
                wait_serving(f"http://127.0.0.1:{port}", process)
                time.sleep(2)  # past the start-up's own work
                cpu, wall = cpu_seconds(process.pid), time.monotonic()
                time.sleep(args.seconds)
                used = cpu_seconds(process.pid) - cpu
                share = used / (time.monotonic() - wall)
                sweeps = args.seconds / interval if interval else 0
                per_sweep = f"{used / sweeps * 1000:.1f} ms" if sweeps else "-"
                print(f"| {interval:g} s | {share * 100:.2f} % of a core | {per_sweep} |")
            finally:
                process.terminate()
                process.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
