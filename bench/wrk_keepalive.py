"""Back-to-back requests on kept-alive connections, measured with wrk (a C client).

Starts the agent on the realistic simulated node (8 GPUs, 80 pods, 320
processes, `--min-interval 1`: scrapes share a sweep's body) and the floor
(plain prometheus_client serving the same series, testkit/floor_exporter.py), and
loads each with `wrk` over one kept-alive connection and over 32, one run
after the other on one machine. Python client threads on two cores would
measure the client; wrk does not. Needs `wrk` (Debian's package).

With `--replay`, the agent serves the same node recorded ahead of time
(testkit/replay_agent.py): its process then does the agent's work alone, where on the simulated
node every sweep also works out the node's answers in the agent's process (sim/node.py), which
a real node's driver does not.

    .venv/bin/python bench/wrk_keepalive.py [--seconds 5] [--replay]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.procstat import compile_bytecode
from testkit.scrape_load import agent_on, floor_command, scenario, serving

_LATENCY = re.compile(r"^\s+(50|90|99)%\s+([\d.]+)(us|ms|s)\s*$", re.MULTILINE)
_RATE = re.compile(r"^Requests/sec:\s+([\d.]+)", re.MULTILINE)
_SCALE = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def wrk(port: int, connections: int, seconds: float) -> dict[str, float]:
    """Requests a second and latency percentiles (ms), as wrk --latency reports them."""
    threads = min(connections, 2)
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--latency"]
    out = subprocess.run(
        [*command, f"http://127.0.0.1:{port}/metrics"], capture_output=True, text=True, check=True
    ).stdout
    rate = _RATE.search(out)
    if rate is None or "Non-2xx" in out:
        raise SystemExit(f"wrk said:\n{out}")
    figures = {"rate": float(rate.group(1))}
    for percentile, value, unit in _LATENCY.findall(out):
        figures[f"p{percentile}"] = float(value) * _SCALE[unit]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="each wrk run")
    parser.add_argument("--port", type=int, default=18199)
    parser.add_argument("--replay", action="store_true", help="the agent on the node recorded ahead of time")
    args = parser.parse_args()
    compile_bytecode()  # the figures are the agent's, not Python compiling its imports
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ratio = Path(tmp) / "gpu_allocation.txt"
        ratio.write_text("4\n")
        node = Path(tmp) / "node.yaml"
        node.write_text(yaml.safe_dump(scenario(8, 80, 320)))
        recording = Path(tmp) / "recording" if args.replay else None
        # The agent's warm-up and two wrk runs, with room: past the recording's end the answers stand still.
        agent = agent_on(node, recording, 60 + 4 * args.seconds)(ratio, args.port, "1")
        node_name = "simulated" if recording is None else "recorded"
        for name, command in (
            ("floor (prometheus_client)", floor_command(node, ratio, args.port)),
            (f"otel-vgpu --min-interval 1, {node_name} node", agent),
        ):
            with serving(command, args.port):
                for connections in (1, 32):
                    rows.append((name, connections, wrk(args.port, connections, args.seconds)))
    print("| server | kept-alive connections | responses/s | p50 | p90 | p99 |")
    print("|---|---|---|---|---|---|")
    for name, connections, f in rows:
        print(
            f"| {name} | {connections} | {f['rate']:,.0f} | {f['p50']:.2f} ms | {f['p90']:.2f} ms | {f['p99']:.2f} ms |"
        )


if __name__ == "__main__":
    main()
