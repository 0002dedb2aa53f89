"""Where one scrape's time goes, in process, on the simulated node scrape_bench.py uses.

Times each part of a rendered scrape (median over the runs), as a scrape runs them: the sweep,
the scrape's collection (the callbacks' observations, the series kept and pruned as the SDK's
storage would: export/direct.py), the exposition written from the collection, the process
metrics; and, for comparison, prometheus_client
rendering the same series from precomputed families (the floor's work).
`--cprofile` prints the functions that take the time instead.

    python bench/scrape_profile.py [--pods 80] [--runs 100] [--cprofile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from otel_vgpu.sim.scenario_file import load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import generate_latest

from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.allocation.ratio import RatioSource
from otel_vgpu.export.exposition import TEXT
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.memory import quiet_collector
from otel_vgpu.sim.node import SimulatedNode
from testkit.floor_exporter import floor_registry
from testkit.scrape_load import scenario
from testkit.sim_sampler import sim_sampler


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=80)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp())
    (tmp / "node.yaml").write_text(yaml.safe_dump(scenario(args.gpus, args.pods, 4 * args.pods)))
    (tmp / "ratio").write_text("4\n")
    node = SimulatedNode(load_scenario(str(tmp / "node.yaml")), tmp / "node")
    health = AgentHealth()
    sampler = sim_sampler(node, RatioSource(tmp / "ratio"), health=health)
    telemetry = Telemetry(sampler, health, min_interval=0.0, node_name="bench", seed_metrics=False)
    for _ in range(10):
        telemetry.render(TEXT)
    quiet_collector()  # as the agent does once it serves

    if args.cprofile:
        profile = cProfile.Profile()
        profile.runcall(lambda: [telemetry.render(TEXT) for _ in range(args.runs)])
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return

    parts: dict[str, list[float]] = {}

    def timed(name: str, call: Callable[[], object]) -> object:
        started = time.perf_counter()
        result = call()
        parts.setdefault(name, []).append(time.perf_counter() - started)
        return result

    renderer = telemetry._renderer
    resource = (telemetry.resource, telemetry.resource.attributes)

    def collect() -> object:
        return telemetry._direct.collect(telemetry._scrape_observations())

    def render(series: object) -> Callable[[], object]:
        return lambda: renderer.render_series(resource, series, TEXT)  # type: ignore[arg-type]

    for _ in range(args.runs):
        timed("sweep: simulated NVML, /proc, attribution, aggregation", lambda: sampler.snapshot(0.0))
        with telemetry.scope.collection("scrape"), telemetry._render_lock:
            series = timed("collection: the callbacks' observations, the series kept", collect)
            timed("exposition from the collection", render(series))
        timed("process metrics (prometheus_client)", lambda: telemetry._process_metrics(TEXT))

    registry = floor_registry(sampler.snapshot(0.0))
    floor = [0.0] * args.runs
    for i in range(args.runs):
        started = time.perf_counter()
        generate_latest(registry)
        floor[i] = time.perf_counter() - started

    print(f"{args.gpus} GPUs, {args.pods} pods, {4 * args.pods} processes; median of {args.runs} runs, in process")
    total = 0.0
    for name, samples in parts.items():
        total += median_ms(samples)
        print(f"  {name:58} {median_ms(samples):7.2f} ms")
    print(f"  {'a rendered scrape, sweep included':58} {total:7.2f} ms")
    print(f"  {'the floor: prometheus_client rendering precomputed families':58} {median_ms(floor):7.2f} ms")
    # The render alone (what a sweep's first scrape adds to the sweep), against the floor's.
    rendering = sum(median_ms(samples) for name, samples in parts.items() if not name.startswith("sweep"))
    print(f"  the render alone, against the floor's: {rendering / median_ms(floor):.2f}x (goal <= 1.6x)")
    telemetry.shutdown()


if __name__ == "__main__":
    main()
