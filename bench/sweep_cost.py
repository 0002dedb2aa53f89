"""What the agent's own sweeps cost: CPU of an agent nobody scrapes, by --sweep-interval.

On the realistic simulated node (8 GPUs, 80 pods, 320 processes, as
bench/scrape_bench.py builds it), the agent runs for a while with each
interval, scraped every `--scrape-every` seconds as Prometheus would; its CPU
time (utime + stime from /proc/<pid>/stat) over that wall time is the cost.
`0` is the old scrape-driven design: a sweep per scrape and none between, and the
reference each interval's cost is quoted against (run it first). Part of that is the simulated node
itself (its NVML, its kubelet, its proc tree), which a real node's driver
pays instead: the same calls, made alone in this process at each interval,
are its share; the rest is the agent's own.

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

from testkit.agent import clean_env, command, free_port, get, wait_serving
from testkit.procstat import compile_bytecode
from testkit.scrape_load import scenario


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def simulated_share_ms(node_file: Path, sweeps: int = 20) -> float:
    """CPU per sweep of the simulated node's calls alone, as a sweep makes them."""
    from otel_vgpu.config import ENERGY_EVERY_S  # noqa: PLC0415
    from otel_vgpu.sim.node import SimulatedNode  # noqa: PLC0415
    from otel_vgpu.sim.scenario_file import load_scenario  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as directory:
        node = SimulatedNode(load_scenario(str(node_file)), Path(directory) / "proc")
        try:
            used = 0.0
            for n in range(sweeps):
                started = time.process_time()
                devices = [node.device(i) for i in range(node.device_count())]
                since = node.now_us() - 2_000_000
                for device in devices:
                    if n % int(ENERGY_EVERY_S / 2) == 0:
                        node.energy(device.index)
                    node.processes(device.index)
                    node.utilization_samples(device.index, since)
                    node.gpu_utilization_samples(device.index, since)
                node.allocation(devices)
                used += time.process_time() - started
                time.sleep(0.05)  # the simulated driver's clock moves between sweeps
            return used / sweeps * 1000
        finally:
            node.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--intervals", type=float, nargs="+", default=[0.0, 1.0, 2.0, 5.0])
    parser.add_argument("--scrape-every", type=float, default=15.0)
    args = parser.parse_args()
    compile_bytecode()  # the figures are the agent's, not Python compiling its imports
    with tempfile.TemporaryDirectory() as directory:
        node = Path(directory) / "node.json"
        node.write_text(json.dumps(scenario(8, 80, 320)))
        ratio = Path(directory) / "gpu_allocation.txt"
        ratio.write_text("2\n")
        simulated = simulated_share_ms(node)
        print(
            f"| --sweep-interval | CPU over {args.seconds:g} s, scraped every {args.scrape_every:g} s "
            "| per sweep | the agent's own | its own, against the scrape-driven design's |"
        )
        print("|---|---|---|---|---|")
        reference: float | None = None  # the agent's own CPU share at interval 0, when it ran
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
                scrapes = 0
                while time.monotonic() - wall < args.seconds:
                    if time.monotonic() - wall >= scrapes * args.scrape_every:
                        get(f"http://127.0.0.1:{port}/metrics")
                        scrapes += 1
                    time.sleep(0.1)
                used = cpu_seconds(process.pid) - cpu
                share = used / (time.monotonic() - wall)
                sweeps = args.seconds / interval if interval else scrapes
                per_sweep = f"{used / sweeps * 1000:.1f} ms" if sweeps else "-"
                own = max(0.0, share - simulated / 1000 * sweeps / args.seconds)
                if interval == 0:
                    reference = own
                against = f"{own / reference:.2f}x" if reference else "-"
                print(
                    f"| {interval:g} s | {share * 100:.2f} % of a core | {per_sweep} | {own * 100:.2f} % of a core "
                    f"| {against} |"
                )
            finally:
                process.terminate()
                process.wait(timeout=10)
        print(
            f"\nOf each sweep, the simulated node's own calls (its NVML, kubelet and proc tree) took "
            f"{simulated:.1f} ms of CPU, made alone; the rest is the agent's own."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
