"""The floor for scrape cost: plain prometheus_client serving the same series.

Takes one snapshot of the simulated node (the agent's own sweep, once), turns
it into prometheus_client metric families up front, and serves them on
/metrics: each scrape only renders what is precomputed. Whatever the agent
costs above this is the price of sweeping and of the OpenTelemetry pipeline.

    python testkit/floor_exporter.py SCENARIO RATIO_FILE PORT
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from otel_vgpu.allocation.ratio import RatioSource
from otel_vgpu.collect.aggregate import Snapshot
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.export.families import GPU, POD, POD_COUNTED, Family, of_subject
from otel_vgpu.pods.attribution import Attributor, ProcReader
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario_file import load_scenario


def families(rows: Sequence[Any], specs: Iterable[Family[Any]]) -> list[GaugeMetricFamily]:
    result = []
    for spec in specs:
        unit = {"By": "bytes"}.get(spec.unit, "")
        name = spec.name.replace(".", "_")
        family = GaugeMetricFamily(name, spec.description, unit=unit)
        for row in rows:
            value = spec.value(row)
            if value is not None:
                family.add_sample(family.name, dict(spec.subject.attributes(row)), float(value))
        result.append(family)
    return result


class Precomputed(Collector):
    def __init__(self, prepared: list[GaugeMetricFamily]) -> None:
        self._prepared = prepared

    def collect(self) -> Iterable[GaugeMetricFamily]:
        return self._prepared


def floor_registry(snapshot: Snapshot) -> CollectorRegistry:
    """The process metrics and the snapshot's families, made once, rendered on every collect."""
    prepared = families(snapshot.pods, of_subject(POD, POD_COUNTED)) + families(snapshot.gpus, of_subject(GPU))
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    registry.register(Precomputed(prepared))
    return registry


def main() -> None:
    scenario_path, ratio_path, port = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    node = SimulatedNode(load_scenario(scenario_path), Path(tempfile.mkdtemp()))
    # Built here, not with testkit/sim_sampler.py: this runs as a script of its own, with the
    # installed package on its path and not the repository.
    sampler = Sampler(
        node,
        attributor=Attributor(ProcReader(node.proc_root)),
        directory=node.directory(),
        allocation=node,
        ratio=RatioSource(ratio_path),
    )
    start_http_server(port, addr="127.0.0.1", registry=floor_registry(sampler.snapshot(0.0)))
    threading.Event().wait()


if __name__ == "__main__":
    main()
