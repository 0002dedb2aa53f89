"""A flame graph of the agent's own CPU on the replayed 8-GPU node (bench/agent_cost.py's row of
8 GPUs x 40 processes, scraped every 15 s), with py-spy, written as SVG; and the functions that
spent the most samples themselves, from a second, raw recording of the same row.

py-spy is not a dependency of the agent: install it beside the test tools first (the `profile`
extra of pyproject.toml),

    .venv/bin/uv pip install --python .venv/bin/python -e '.[profile]'
    .venv/bin/python bench/flamegraph.py --out bench/results/agent-cost-8gpu.svg [--top 25]

The recording of the simulated node is made first, unprofiled; only the row's process (the
agent's parts on the replay) is sampled. py-spy needs to ptrace the process it starts.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.py_spy import py_spy, top_functions

AGENT_COST = Path(__file__).resolve().parent / "agent_cost.py"


def record(directory: Path, gpus: int, seconds: float) -> Path:
    """bench/agent_cost.py's recording of the node, kept in `directory`: where its row reads it."""
    command = [sys.executable, str(AGENT_COST), "--gpus", str(gpus), "--seconds", f"{seconds:g}"]
    subprocess.run([*command, "--keep", str(directory), "--record-only"], check=True)
    return directory / f"{gpus}-gpus"


def row_command(recorded: Path, scrape_every: float, seconds: float) -> list[str]:
    """bench/agent_cost.py's row on that recording, in a process of its own."""
    every = ["--scrape-every", f"{scrape_every:g}", "--seconds", f"{seconds:g}"]
    return [sys.executable, str(AGENT_COST), "--row", str(recorded), *every]


def profile(row: list[str], out: Path, rate: int, fmt: str) -> None:
    """The row's process sampled `rate` times a second, every thread, idle ones left out."""
    command = [py_spy(), "record", "--rate", str(rate), "--format", fmt, "--output", str(out), "--", *row]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the SVG")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=600.0, help="of the simulated clock")
    parser.add_argument("--scrape-every", type=float, default=15.0)
    parser.add_argument("--rate", type=int, default=200, help="samples a second")
    parser.add_argument("--top", type=int, default=0, help="also list the N functions of most self time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agent-flame-") as temporary:
        directory = Path(temporary)
        row = row_command(record(directory, args.gpus, args.seconds), args.scrape_every, args.seconds)
        profile(row, args.out, args.rate, "flamegraph")
        print(f"{args.out}: {args.out.stat().st_size / 1024:.0f} KiB")
        if args.top:
            raw = directory / "stacks.txt"
            profile(row, raw, args.rate, "raw")
            print("\n| samples on top | share | function (file:line) |\n|---|---|---|")
            for frame, n, share in top_functions(raw, args.top):
                print(f"| {n} | {share:.1f} % | `{frame}` |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
