"""Each reader's cost in sight: vgpu_agent_reader_duration_seconds and vgpu_agent_reader_success,
by reader, on the simulated node in process (a clock the test moves, the agent's threads' reads
made by hand): which readers there are, that one turned off has no series, that a failing read
reads 0 and 1 again once it answers, that a scrape serves the last passes and makes none, and that
a reader stuck in the driver says so: slow GPM reads cost a sweep one deadline, a hung XID take
on one GPU leaves the others' XIDs counted, and a pass in flight past its deadline reads 0.
The Kubernetes readers are in tests/system/test_kubernetes.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_vgpu.agent_health import AgentHealth, Reader, Stage
from otel_vgpu.collect import sampler as sampler_module
from otel_vgpu.collect.device_health import DeviceHealth
from otel_vgpu.collect.gpm_reads import GPM_DEADLINE_S
from otel_vgpu.collect.reading import GpuReader, Read
from otel_vgpu.collect.sampler import SWEEP_DEADLINE_S, Sampler
from otel_vgpu.collect.xids import XID_DEADLINE_S, XidCounts, XidWatch
from otel_vgpu.export.exposition import TEXT
from otel_vgpu.export.families import FAMILIES, reads_of, selected
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.sim.node import SimulatedNode
from testkit.agent import wait_until
from testkit.clock import Clock
from testkit.promtext import Exposition, parse

from ...conftest import hand_clocked, make_sampler

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
    health: AgentHealth
    devices: DeviceHealth | None
    xids: XidWatch | None
    telemetry: Telemetry
    counts: XidCounts | None = None

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
def simulated(
    tmp_path: Path,
    text: str,
    deny: tuple[str, ...] = (),
    deadline_s: float = 2.0,
    gpm_deadline_s: float = GPM_DEADLINE_S,
    sweep_deadline_s: float = SWEEP_DEADLINE_S,
    xid_deadline_s: float = XID_DEADLINE_S,
) -> Iterator[Node]:
    """The scenario `text` read with the families `deny` leaves: what they read, and no more.
    `deadline_s`: the health reads'; the others, each reader's."""
    clock, sim, ratio = hand_clocked(tmp_path, text)
    kept, _ = selected(deny=list(deny))
    reads = reads_of(kept)
    health = AgentHealth()
    # Every sweep closes a GPM window: each reads GPM.
    reader = GpuReader(sim, clock.monotonic, reads=reads, engine_every_s=0.0, gpm_deadline_s=gpm_deadline_s)
    sampler = make_sampler(
        sim, ratio, health=health, clock=clock.monotonic, reader=reader, sweep_deadline_s=sweep_deadline_s
    )
    devices = DeviceHealth(sampler, health, clock.monotonic, deadline_s=deadline_s) if Read.HEALTH in reads else None
    counts = XidCounts() if Read.XID_EVENTS in reads else None
    xids = XidWatch(sim, counts, health, sampler.gpu_indices, deadline_s=xid_deadline_s) if counts is not None else None
    telemetry = Telemetry(sampler, health, 1.0, "n", False, families=kept, devices=devices, xids=counts)
    try:
        yield Node(sim, clock, sampler, health, devices, xids, telemetry, counts)
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
        passes = wait_until(lambda: dict(node.health.passes()).get(Reader.DEVICE_HEALTH) and node.health.passes())
        first = parse(node.telemetry.render(TEXT).decode())
        node.clock.t += 1.0
        second = parse(node.telemetry.render(TEXT).decode())
        # The very passes made before the scrapes: neither scrape swept or read a GPU's health.
        assert node.health.passes() == passes and node.sampler.sweeps == 1
        assert all(a is b for (_, a), (_, b) in zip(node.health.passes(), passes, strict=True))
    assert success(first) == success(second) == {"sweep": 1, "health": 1}
    assert duration(first) == duration(second) == {reader.value: last.seconds for reader, last in passes}


def h100s(count: int, extra: str = "") -> str:
    """`count` H100s, a pod busy on each, and `extra` (faults, health events)."""
    return (
        "gpus:\n"
        + f"  - {{model: {H100}}}\n" * count
        + "pods:\n"
        + "".join(
            f"  - {{name: p{n}, processes: [{{gpu: {n}, memory: 1GiB, sm: 0.5, tensor: 0.4}}]}}\n" for n in range(count)
        )
        + extra
    )


def test_slow_gpm_reads_on_every_gpu_cost_the_sweep_one_of_them_not_one_each(tmp_path: Path) -> None:
    # Each of 8 GPUs' GPM calls takes 0.5 s: read in turn, a sweep that closes their windows
    # took 8 x 0.5 s (8 x 0.9 s held it 7.2 s on the node). Read at once, the slowest.
    slow_s, gpus = 0.5, 8
    with simulated(tmp_path, h100s(gpus, f"faults: [{{call: gpm, delay_s: {slow_s}}}]\n"), gpm_deadline_s=4.0) as node:
        node.round()  # the windows open
        node.clock.t += 2.0
        started = time.monotonic()
        node.sampler.snapshot(0.0)  # the windows close: every GPU's GPM read
        took = time.monotonic() - started
        seen = parse(node.telemetry.render(TEXT).decode())
    # Half of what reading in turn must take, whatever the machine's load: it took about slow_s.
    assert took < gpus * slow_s / 2, took
    assert sorted(seen.by("vgpu_gpu_tensor_active_ratio", "gpu_id")) == [(str(n),) for n in range(gpus)]
    assert success(seen)["gpm"] == 1 and slow_s <= duration(seen)["gpm"] < gpus * slow_s / 2


def test_a_hung_xid_take_on_one_gpu_leaves_the_other_gpus_xids_counted_and_the_round_failed(tmp_path: Path) -> None:
    # GPU 0's event set hangs (a minute: for ever, to this test); GPU 3 has an XID 79 at 1 s.
    text = h100s(4, "faults: [{call: xid_events, gpu: 0, delay_s: 60}]\nhealth_events: [{gpu: 3, at_s: 1, xid: 79}]\n")
    with simulated(tmp_path, text) as node:
        node.clock.t += 2.0
        node.sampler.snapshot(0.0)
        assert node.xids is not None
        # A round on the watch's own thread, as the agent's: it must not hold GPU 3's XID.
        threading.Thread(target=node.xids.take, daemon=True).start()
        assert node.counts is not None
        counts = node.counts
        # Each GPU's take has a 1 s deadline; before, GPU 3 waited for GPU 0's minute.
        wait_until(
            lambda: [(c.gpu_index, c.xid) for c in counts.rows()] == [(3, "79")],
            timeout=30,
            what="GPU 3's XID 79 counted beside GPU 0's hung take",
        )
        wait_until(lambda: node.health.failing(Stage.XID_EVENTS, "0:DEADLINE"), what="GPU 0's take said late")
        seen = node.round()  # the next sweep's scrape (its round of XIDs refuses GPU 0 at once)
    assert seen.by("vgpu_gpu_xid_errors_total", "gpu_id", "xid") == {("3", "79"): 1}
    assert success(seen)["xid"] == 0  # GPU 0 missed its deadline: the round failed, and says so
    assert success(seen)["sweep"] == 1


def test_a_sweep_stuck_in_the_driver_reads_0_once_past_its_deadline_and_1_again_once_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # From 3 s on the node's clock, GPU 0's device call takes 3 s: the sweep then is stuck in it,
    # for 0.2 s of deadline. A scrape waits for no sweep in flight (the agent's own sweeps).
    monkeypatch.setattr(sampler_module, "SWEEP_WAIT_S", 0.0)
    text = h100s(1, "faults: [{call: device, gpu: 0, delay_s: 3, from_s: 3}]\n")
    with simulated(tmp_path, text, sweep_deadline_s=0.2) as node:
        node.round()
        node.sampler.drive()
        node.clock.t += 2.0
        sweep = threading.Thread(target=node.sampler.sweep, daemon=True)
        sweep.start()

        def stuck() -> Exposition | None:
            seen = parse(node.telemetry.render(TEXT).decode())
            return seen if success(seen).get("sweep") == 0 else None

        # Before, the gauge read the last sweep's 1 until this one ended (and /healthz said
        # nothing for 120 s).
        during = wait_until(stuck, timeout=2.5, what="the stuck sweep's reader to read 0")
        sweep.join(timeout=30)
        after = parse(node.telemetry.render(TEXT).decode())
    assert duration(during)["sweep"] >= 0.2  # how long it has run so far
    assert success(during)["process_watch"] == 1  # the other readers say their own passes
    assert success(after)["sweep"] == 1  # the sweep answered, late: it did not fail
