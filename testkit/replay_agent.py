"""The agent as a process of its own, serving a recorded node (testkit/nvml_replay.py) in real
time: what the HTTP benchmarks load (bench/scrape_bench.py, bench/wrk_keepalive.py with
`--replay`) to measure the agent's scrapes without the simulator's cost in its process.

    python testkit/replay_agent.py record DIR --scenario node.yaml [--seconds 90]
    python testkit/replay_agent.py serve DIR -- AGENT-FLAGS...

`record` asks the simulated node of the scenario ahead of time (the node's proc tree is left
in DIR, its files read by the agent's attribution); `serve` runs the agent's own command line
with `--simulate DIR/node.json`, the recording answering in the simulated node's place from
the moment the process starts, on its own clock. Past the recording's end the answers stay
those of its last instant: record longer than the longest run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

# Run as a script from anywhere (`command`), the repository's packages importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit import nvml_replay

SCENARIO_FILE = "node.json"


def record(directory: Path, scenario: Path, seconds: float) -> None:
    from otel_vgpu.sim.scenario_file import load_scenario  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(scenario, directory / SCENARIO_FILE)  # YAML or JSON: the loader takes either
    nvml_replay.record(load_scenario(str(scenario)), directory, seconds).save(directory)


def serve(directory: Path, agent_flags: list[str]) -> int:
    from otel_vgpu import cli  # noqa: PLC0415
    from otel_vgpu.sim import node as sim_node  # noqa: PLC0415

    recording = nvml_replay.load(directory)
    began = time.monotonic()
    replay = nvml_replay.Replay(recording, clock=lambda: recording.start_s + time.monotonic() - began)
    # `--simulate` builds the simulated node here: the replay stands in its place.
    sim_node.SimulatedNode = lambda *args, **kwargs: replay  # type: ignore[assignment,misc]
    return cli.main(["--simulate", str(directory / SCENARIO_FILE), *agent_flags])


def command(directory: Path, *agent_flags: str) -> list[str]:
    """The command line that serves `directory`'s recording with these agent flags."""
    return [sys.executable, str(Path(__file__).resolve()), "serve", str(directory), "--", *agent_flags]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("record", "serve"))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--scenario", type=Path, help="record: the simulated node's scenario")
    parser.add_argument("--seconds", type=float, default=90.0, help="record: of the node's clock")
    parser.add_argument("agent_flags", nargs="*", help="serve: the agent's flags, after --")
    args = parser.parse_args()
    if args.action == "record":
        if args.scenario is None:
            parser.error("record needs --scenario")
        record(args.directory, args.scenario, args.seconds)
        return 0
    return serve(args.directory, args.agent_flags)


if __name__ == "__main__":
    raise SystemExit(main())
