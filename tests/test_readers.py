"""Each reader's cost in sight: vgpu_agent_reader_duration_seconds and vgpu_agent_reader_success,
by reader, on the simulated node in process (a clock the test moves, the agent's threads' reads
made by hand): which readers there are, that one turned off has no series, that a failing read
reads 0 and 1 again once it answers, and that a scrape serves the last passes and makes none.
The Kubernetes readers are in tests/test_kubernetes.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_vgpu.collect.device_health import DeviceHealth
from otel_vgpu.collect.reading import GpuReader, Read
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.collect.xids import XidCounts, XidWatch
from otel_vgpu.export.exposition import TEXT
from otel_vgpu.export.families import FAMILIES, reads_of, selected
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.health import Health, Reader
from otel_vgpu.sim.node import SimulatedNode
from testkit.agent import wait_until
from testkit.clock import Clock
from testkit.promtext import Exposition, parse

from .conftest import hand_clocked, make_sampler

pytestmark = pytest.mark.unit

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
TWO_H100S = f"""
gpus:
  - {{model: {H100}}}
  - {{model: {H100}}}
pods:
  - {{name: trainer, processes: [{{gpu: 0, memory: 1GiB, sm: 0.5, tensor: 0.4}}]}}
"""


@dataclass
class Node:
    sim: SimulatedNode
    clock: Clock
    sampler: Sampler
    health: Health
    devices: DeviceHealth | None
    xids: XidWatch | None
    telemetry: Telemetry

    def round(self) -> Exposition:
        """2 s later: a sweep, a look of the process watch and a round of XID events, as the
        agent's threads make them; then a scrape (which reads the GPUs' health, in process)."""
        self.clock.t += 2.0
        self.sampler.snapshot(0.0)
        self.sampler.watch()
        if self.xids is not None:
            self.xids.take()
        return parse(self.telemetry.render(TEXT).decode())


@contextmanager
def simulated(tmp_path: Path, text: str, deny: tuple[str, ...] = (), deadline_s: float = 2.0) -> Iterator[Node]:
    """The scenario `text` read with the families `deny` leaves: what they read, and no more."""
    clock, sim, ratio = hand_clocked(tmp_path, text)
    kept, _ = selected(deny=list(deny))
    reads = reads_of(kept)
    health = Health()
    # Every sweep closes a GPM window: each reads GPM.
    reader = GpuReader(sim, clock.monotonic, reads=reads, engine_every_s=0.0)
    sampler = make_sampler(sim, ratio, health=health, clock=clock.monotonic, reader=reader)
    devices = DeviceHealth(sampler, health, clock.monotonic, deadline_s=deadline_s) if Read.HEALTH in reads else None
    counts = XidCounts() if Read.XID_EVENTS in reads else None
    xids = XidWatch(sim, counts, health, sampler.gpu_indices) if counts is not None else None
    telemetry = Telemetry(sampler, health, 1.0, "n", False, families=kept, devices=devices, xids=counts)
    try:
        yield Node(sim, clock, sampler, health, devices, xids, telemetry)
    finally:
        telemetry.shutdown()
        if devices is not None:
            devices.stop()
        sim.close()


def success(exposition: Exposition) -> dict[str, float]:
    return {reader: value for (reader,), value in exposition.by("vgpu_agent_reader_success", "reader").items()}


def duration(exposition: Exposition) -> dict[str, float]:
    return {reader: value for (reader,), value in exposition.by("vgpu_agent_reader_duration_seconds", "reader").items()}


def test_each_reader_of_a_node_has_its_last_pass(tmp_path: Path) -> None:
    with simulated(tmp_path, TWO_H100S) as node:
        node.round()
        seen = node.round()
    readers = {"sweep", "process_watch", "gpm", "health", "xid"}
    assert success(seen) == dict.fromkeys(readers, 1)
    assert set(duration(seen)) == readers and min(duration(seen).values()) >= 0
    assert seen.types["vgpu_agent_reader_duration_seconds"] == seen.types["vgpu_agent_reader_success"] == "gauge"


def test_a_reader_that_is_off_has_no_series(tmp_path: Path) -> None:
    # The health and XID families turned off: their readers never read. An A100 has no GPM:
    # the gpm reader has nothing to read.
    off = "|".join(f.prometheus_name for f in FAMILIES if f.reads & {Read.HEALTH, Read.XID_EVENTS})
    with simulated(tmp_path, f"gpus:\n  - {{model: {A100}}}\n", deny=(off,)) as node:
        node.round()
        seen = node.round()
    assert success(seen) == {"sweep": 1, "process_watch": 1}


@pytest.mark.parametrize(
    ("reader", "call"),
    [("sweep", "processes"), ("gpm", "gpm"), ("health", "health"), ("xid", "xid_events")],
)
def test_a_failing_read_reads_0_the_others_1_and_1_again_once_it_answers(
    tmp_path: Path, reader: str, call: str
) -> None:
    with simulated(tmp_path, TWO_H100S) as node:
        node.round()
        node.sim.fail(call, 1, "UNKNOWN")
        failing = node.round()
        node.sim.fail(call, 1, None)
        node.round()
        answered = node.round()
    everyone = {"sweep", "process_watch", "gpm", "health", "xid"}
    # GPM's failures are the gpm reader's, though its reads are part of the sweep.
    assert success(failing) == {**dict.fromkeys(everyone, 1), reader: 0}
    assert success(answered) == dict.fromkeys(everyone, 1)


def test_the_health_pass_lasts_as_long_as_its_slowest_gpu_and_fails_past_the_deadline(tmp_path: Path) -> None:
    slow = TWO_H100S + "faults:\n  - {call: health, gpu: 1, delay_s: 0.2}\n"
    with simulated(tmp_path, slow) as node:
        seen = node.round()
    assert success(seen)["health"] == 1 and duration(seen)["health"] >= 0.2  # GPU 0's read takes no time
    with simulated(tmp_path / "late", slow, deadline_s=0.05) as node:
        late = node.round()
    assert success(late)["health"] == 0 and duration(late)["health"] >= 0.05


def test_a_scrape_serves_the_last_passes_and_makes_none(tmp_path: Path) -> None:
    with simulated(tmp_path, TWO_H100S) as node:
        node.sampler.drive()  # the sweeps are the agent's own: a scrape makes none
        node.sampler.sweep()
        assert node.devices is not None
        node.devices.start()  # its first round now, on its own thread; the next in 10 s
        passes = wait_until(lambda: dict(node.health.passes()).get(Reader.HEALTH) and node.health.passes())
        first = parse(node.telemetry.render(TEXT).decode())
        node.clock.t += 1.0
        second = parse(node.telemetry.render(TEXT).decode())
        # The very passes made before the scrapes: neither scrape swept or read a GPU's health.
        assert node.health.passes() == passes and node.sampler.sweeps == 1
        assert all(a is b for (_, a), (_, b) in zip(node.health.passes(), passes, strict=True))
    assert success(first) == success(second) == {"sweep": 1, "health": 1}
    assert duration(first) == duration(second) == {reader.value: last.seconds for reader, last in passes}
