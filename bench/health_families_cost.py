"""What the health and GPM families cost the agent's own Python, on the simulated node.

The same agent twice, over the same simulated node (one GPU with GPM, 12 pods, 48 processes, as
the H200 cost run has them: a third busy, a third copying, a third idle), scraped every
`--scrape-every` seconds as Prometheus would: once with every family, once with the health and
GPM families turned off by the README's deny pattern (the reference, which reads nothing they
need). Alternately, `--rounds` times each over `--seconds`. The ratio says what the families
cost in the agent's own code: the rows, the families' callbacks, the render. The simulated
driver's calls are Python here where a real node's are the driver's (bench/gpu_health_calls.py
measures those on a GPU).

    .venv/bin/python bench/health_families_cost.py [--seconds 60] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import running_agent
from testkit.procstat import compile_bytecode
from testkit.report import cpu_while_scraped

# The README's upgrade note: every health and GPM family off.
DENY = (
    "vgpu_gpu_(sm_clock|memory_clock|temperature|memory_temperature|power|power_limit|pcie|clock_event|"
    "power_violation|thermal_violation|ecc|remapped|xid|graphics|sm_active|sm_occupancy|tensor|dram|fp64|fp32|"
    "fp16|nvlink|gpm).*,vgpu_pod_(graphics|sm_active|sm_occupancy|tensor|dram|fp64|fp32|fp16|pcie).*"
)


def node() -> str:
    pods = [
        {
            "namespace": "load",
            "name": f"load-{n}",
            "shares": {0: 1},
            "processes": [
                {"gpu": 0, "memory": "256MiB", "sm": (0.3, 0.0, 0.0)[k % 3], "dram": (0.1, 0.3, 0.0)[k % 3]}
                for k in range(4)
            ],
        }
        for n in range(12)
    ]
    return yaml.safe_dump({"node": "gpu-node-1", "gpus": [{"model": "NVIDIA H200", "memory": "141GiB"}], "pods": pods})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scrape-every", type=float, default=15.0)
    args = parser.parse_args()
    compile_bytecode()
    scenario = Path(tempfile.mkdtemp(prefix="health-cost-")) / "node.yaml"
    scenario.write_text(node())
    figures: dict[str, list[float]] = {"without (reference)": [], "with": []}
    for _ in range(args.rounds):
        for label, extra in (("without (reference)", ["--metric-denylist", DENY]), ("with", [])):
            with running_agent("--simulate", str(scenario), *extra) as agent:
                time.sleep(11)  # past the first GPM window
                cpu = cpu_while_scraped(agent.process.pid, f"{agent.url}/metrics", args.seconds, args.scrape_every)
                figures[label].append(cpu)
    print(f"the simulated node: 1 GPU with GPM, 12 pods, 48 processes; scraped every {args.scrape_every:g} s; ", end="")
    print(f"{args.rounds} rounds of {args.seconds:g} s each, alternately\n")
    print("| agent | CPU of a core, each round | mean |\n|---|---|---|")
    for label, values in figures.items():
        each = ", ".join(f"{v:.2f} %" for v in values)
        print(f"| {label} | {each} | {statistics.mean(values):.2f} % |")
    ratio = statistics.mean(figures["with"]) / statistics.mean(figures["without (reference)"])
    print(f"\nwith the health and GPM families: {ratio:.2f}x the reference")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
