"""What the health and GPM families cost the agent's own code, on the simulated node, in process.

The agent is built as `python -m otel_vgpu --simulate` builds it, twice, over the same simulated
node (one GPU with GPM, 12 pods, 48 processes, as the H200 cost run has them: a third busy, a
third copying, a third idle): once with every family, once with the health and GPM families
turned off by the denylist of docs/metrics.md, "Health and GPM off" (the reference, which reads
nothing they need). Each
is swept every 2 s and collected (rendered for a scrape) every `--scrape-every` seconds of a
simulated clock, so that GPM windows close as they would, for `--seconds` of it; CPU is the
thread's clock, to the nanosecond, so a few seconds of run are enough.

The simulated driver answers the health and GPM reads in Python, where a real node's NVML
answers in C: those calls are timed apart and taken out, since bench/gpu_health_calls.py
measures NVML's on a GPU (bench/results/h200-health.md); so are its answers to every other
call. What remains is the agent's own code: /proc, attribution, the rows, the GPM windows, the
families' callbacks, the render. The XID thread is not started here: it costs a call a second,
measured on the GPU.

    .venv/bin/python bench/health_families_cost.py [--seconds 1200] [--rounds 5] [--scrape-every 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# A simulated clock for the agent's timers, set before the agent's modules bind time.monotonic
# as their clocks' defaults: sweeps 2 s apart close GPM and engine windows as on a node,
# without waiting for them.
_NOW = [10_000.0]
_EPOCH_NS = time.time_ns()
_real_monotonic = time.monotonic
time.monotonic = lambda: _NOW[0]
time.time_ns = lambda: _EPOCH_NS + int((_NOW[0] - 10_000.0) * 1e9)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otel_vgpu.agent import Agent  # noqa: E402
from otel_vgpu.config import parse_config  # noqa: E402
from otel_vgpu.export.exposition import TEXT  # noqa: E402
from otel_vgpu.gpu.backend import GpuBackend  # noqa: E402
from otel_vgpu.memory import quiet_collector  # noqa: E402
from testkit.agent import free_port  # noqa: E402
from testkit.scripts import load as load_script  # noqa: E402

SWEEP_S = 2.0
# The health and GPM families off as docs/metrics.md's denylist turns them off: every family
# that needs a health, GPM or XID read, made from the families' declarations.
DENY = ",".join(load_script("family_lists.py").health_and_gpm_off())


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


@dataclass
class Spent:
    """CPU seconds of one agent over the run."""

    sweeps: float = 0.0
    collections: float = 0.0
    health_calls: float = 0.0
    """Of both, the simulated driver's answers to the health and GPM reads."""
    other_calls: float = 0.0
    """Of both, its answers to every other call (devices, processes, samples, energy)."""
    series: int = 0
    _depth: int = 0

    def own(self) -> float:
        return self.sweeps + self.collections - self.health_calls - self.other_calls

    def timed(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        """`call`, its CPU added to the driver's (once, where one call makes another)."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            started = time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    spent = time.thread_time() - started
                    if name in HEALTH_CALLS:
                        self.health_calls += spent
                    else:
                        self.other_calls += spent

        return wrapper


HEALTH_CALLS = ("health", "gpm")
# Every call of the backend's protocol (gpu/backend.py), timed as the driver's.
DRIVER_CALLS = [name for name in vars(GpuBackend) if not name.startswith("_") and callable(getattr(GpuBackend, name))]


def median(rounds: list[Spent]) -> Spent:
    """Each figure's median over the rounds."""
    figures = ("sweeps", "collections", "health_calls", "other_calls")
    middle = {name: statistics.median(getattr(spent, name) for spent in rounds) for name in figures}
    return Spent(**middle, series=rounds[0].series)


def run(scenario: Path, extra: list[str], seconds: float, scrape_every: float) -> Spent:
    agent = Agent(parse_config(["--simulate", str(scenario), "--port", str(free_port()), *extra], {}))
    spent = Spent()
    try:
        backend = agent._backend
        for name in DRIVER_CALLS:
            setattr(backend, name, spent.timed(name, getattr(backend, name)))
        body = b""
        for _ in range(int(30 / SWEEP_S)):  # past the first windows, the first renders
            _NOW[0] += SWEEP_S
            agent.sampler.snapshot(0.0)
            body = agent.telemetry.render(TEXT)
        quiet_collector()  # as the agent does once it serves
        spent.health_calls = spent.other_calls = 0.0
        next_scrape, ended = _NOW[0], _NOW[0] + seconds
        while _NOW[0] < ended:
            _NOW[0] += SWEEP_S
            started = time.thread_time()
            agent.sampler.snapshot(0.0)
            spent.sweeps += time.thread_time() - started
            if _NOW[0] >= next_scrape:
                started = time.thread_time()
                body = agent.telemetry.render(TEXT)
                spent.collections += time.thread_time() - started
                next_scrape += scrape_every
        spent.series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    finally:
        agent.close()
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1200.0, help="of the simulated clock, each round")
    parser.add_argument("--scrape-every", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    scenario = Path(tempfile.mkdtemp(prefix="health-cost-")) / "node.yaml"
    scenario.write_text(node())
    started = _real_monotonic()
    versions: list[tuple[str, list[str]]] = [("without (reference)", ["--metric-denylist", DENY]), ("with", [])]
    rounds: dict[str, list[Spent]] = {label: [] for label, _ in versions}
    for round_ in range(args.rounds):
        # Alternately, each first in every other round: what drifts over the run falls on both.
        for label, extra in versions if round_ % 2 == 0 else versions[::-1]:
            rounds[label].append(run(scenario, extra, args.seconds, args.scrape_every))
    figures = {label: median(spent) for label, spent in rounds.items()}
    print(
        f"the simulated node: 1 GPU with GPM, 12 pods, 48 processes; swept every {SWEEP_S:g} s, scraped every "
        f"{args.scrape_every:g} s, over {args.seconds:g} s of a simulated clock, {args.rounds} rounds alternately "
        f"({_real_monotonic() - started:.0f} s of run); CPU of a core, the median of the rounds\n"
    )
    print(
        "| agent | series | sweeps | collections | of which the simulated driver: health and GPM | its other calls "
        "| the agent's own code |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, spent in figures.items():
        parts = (spent.sweeps, spent.collections, spent.health_calls, spent.other_calls, spent.own())
        share = [100 * v / args.seconds for v in parts]
        print(f"| {label} | {spent.series} | " + " | ".join(f"{v:.4f} %" for v in share) + " |")
    with_, without = figures["with"], figures["without (reference)"]
    extra = 100 * (with_.own() - without.own()) / args.seconds
    print(
        f"\nthe agent's own code with the health and GPM families: {with_.own() / without.own():.2f}x the reference "
        f"({extra:+.4f} % of a core)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
