"""What a scrape takes while every GPU's health call is slow, against the same node with no
fault, in one run: the reference beside the figure (collect/device_health.py reads health
off the scrape's path; before, eight GPUs whose call took 1.5 s made each scrape take 12 s).

    .venv/bin/python bench/slow_health_scrape.py [--gpus 8] [--delay 1.5] [--scrapes 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import running_agent


def scrape_seconds(gpus: int, delay_s: float, scrapes: int) -> tuple[list[float], int]:
    """Each scrape's seconds, a second apart, on a node of `gpus` GPUs whose health call takes
    `delay_s` (0: no fault), and how many pods' series the last one had."""
    with tempfile.TemporaryDirectory() as directory:
        node = Path(directory) / "node.yaml"
        text = "gpus:\n" + "".join("  - {model: NVIDIA H100 80GB HBM3, memory: 80GiB}\n" for _ in range(gpus))
        text += "pods:\n" + "".join(
            f"  - {{name: p{n}, shares: {{{n}: 1}}, processes: [{{gpu: {n}, memory: 1GiB, sm: 0.4}}]}}\n"
            for n in range(gpus)
        )
        if delay_s > 0:
            text += "faults:\n" + "".join(f"  - {{call: health, gpu: {n}, delay_s: {delay_s}}}\n" for n in range(gpus))
        node.write_text(text)
        ratio = Path(directory) / "gpu_allocation.txt"
        ratio.write_text("2\n")
        with running_agent("--simulate", str(node), "--allocation-file", str(ratio)) as agent:
            took, pods = [], 0
            for _ in range(scrapes):
                started = time.monotonic()
                served = agent.scrape()
                took.append(time.monotonic() - started)
                pods = len(served.by("vgpu_pod_memory_used_bytes", "gpu_id"))
                time.sleep(1.0)
            agent.stop()
    return took, pods


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--delay", type=float, default=1.5)
    parser.add_argument("--scrapes", type=int, default=10)
    args = parser.parse_args()
    reference, _ = scrape_seconds(args.gpus, 0.0, args.scrapes)
    slow, pods = scrape_seconds(args.gpus, args.delay, args.scrapes)
    print(f"| {args.gpus} GPUs | median scrape | slowest | against no fault (median) |")
    print("|---|---|---|---|")
    print(f"| no fault | {statistics.median(reference) * 1000:.1f} ms | {max(reference) * 1000:.1f} ms | 1.00x |")
    print(
        f"| health call {args.delay:g} s each | {statistics.median(slow) * 1000:.1f} ms | {max(slow) * 1000:.1f} ms "
        f"| {statistics.median(slow) / statistics.median(reference):.2f}x ({pods} pods' series) |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
