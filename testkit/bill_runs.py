"""A bill on the simulated node, run on its own clock: the agent's parts (jittered sweeps, the
process watch, scrapes through the real telemetry) over a scenario, and what each pod was
billed against what the scenario ran (`SimulatedNode.ran`). The timing attacks' tests and the
bill's evaluation (bench/bill_evaluation.py) both run it."""

from __future__ import annotations

import heapq
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.allocation.ratio import RatioSource
from otel_vgpu.collect.reading import GpuReader
from otel_vgpu.collect.sweeper import next_wait
from otel_vgpu.export.exposition import OPENMETRICS_1, negotiate
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.gpu.sampling import MIN_WINDOW_US
from otel_vgpu.sim.node import SAMPLE_PERIOD_US, SimulatedNode
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.clock import Clock
from testkit.promtext import parse
from testkit.sim_sampler import sim_sampler

try:
    from otel_vgpu.collect.estimator import SETTLE_US
except ImportError:  # an agent from before the estimator (bench/bill_evaluation.py --tree): none
    SETTLE_US = 0

VICTIM = "5a1e0c2b-7d3f-4e8a-9b6c-1d2e3f405162"
ATTACKER = "a77ac4e2-0b1d-4c2e-8f3a-6b5c4d3e2f10"
THIRD = "3c3c3c3c-1111-4222-8333-444455556666"

SECONDS = 60.0
SWEEP_S = 2.0
WATCH_S = 0.25
# The simulated driver's sample period: the bill settles whole ones.
PERIOD_S = SAMPLE_PERIOD_US / 1e6


def node(*pods: str, accounting: bool = False) -> str:
    """A scenario of one GPU and `pods` (each from `pod`); with `accounting`, NVML's
    accounting mode on."""
    gpu = "{model: NVIDIA H100 80GB HBM3, memory: 80GiB" + (", accounting: true}" if accounting else "}")
    return f"gpus:\n  - {gpu}\npods:\n" + "".join(pods)


def pod(namespace: str, name: str, uid: str, *processes: str, more: str = "", shares: bool = True) -> str:
    """One pod of a scenario, holding a share of GPU 0 (none without `shares`); `more`: its other fields."""
    lines = [f"  - namespace: {namespace}", f"    name: {name}", f"    uid: {uid}"]
    lines += ["    shares: {0: 1}"] if shares else []
    lines += [f"    {line}" for line in more.splitlines() if line]
    lines += ["    processes:", *(f"      - {{gpu: 0, {process}}}" for process in processes)]
    return "\n".join(lines) + "\n"


def restarting(period_s: float, active_s: float, offset_s: float) -> str:
    """A pod whose processes live `active_s` of every `period_s`, fresh ones each time."""
    return f"period_s: {period_s}\nactive_s: {active_s}\noffset_s: {offset_s}\nrestarts: true"


# The victim: a steady pod beside every attack.
STEADY = pod("team-a", "victim", VICTIM, "memory: 4GiB, sm: 0.3")


def attacks(offset_s: float = 0.0) -> dict[str, str]:
    """Each attack of the tenant, beside the steady victim (one GPU, a share each), its phase
    moved by `offset_s` (0 to 2 s: a sweep every 2 s meets it anywhere)."""

    def at(base: float, period: float) -> float:
        return round((base + offset_s) % period, 3)

    return {
        # GPU processes alive 1.2 s of every 2 s, phased to miss sweeps every 2 s.
        "phased-between-sweeps": pod(
            "team-b", "tenant", ATTACKER, "memory: 8GiB, sm: 0.6", more=restarting(2.0, 1.2, at(0.4, 2.0))
        ),
        # Back-to-back restarts, each born 50 ms before a sweep every 2 s would come.
        "restarts-before-sweeps": pod(
            "team-b", "tenant", ATTACKER, "memory: 8GiB, sm: 0.6", more=restarting(2.0, 1.95, at(1.95, 2.0))
        ),
        # One process that never exits, at a trough whenever a sweep every 2 s would come.
        "trough-at-sweeps": pod(
            "team-b",
            "tenant",
            ATTACKER,
            f"memory: 8GiB, sm: {{mean: 0.5, amplitude: 0.45, period_s: 2.0, phase: {0.75 + offset_s / 2.0:.4f}}}",
        ),
        # No knowledge of the phase: processes of 1.4 s, one every 2.3 s.
        "short-unphased": pod(
            "team-b", "tenant", ATTACKER, "memory: 8GiB, sm: 0.6", more=restarting(2.3, 1.4, at(0.1, 2.3))
        ),
    }


ATTACKS = attacks()


# The cases the bill is evaluated on (bench/bill_evaluation.py) and tested with
# (tests/unit/collect/test_bill_evidence.py), by kind: an attack (a tenant against a victim: the victim at
# most 1.05 of what it ran, the tenant at least 0.90), a tenant no look can see (its work in
# the unattributed, never the victim's), an ordinary workload (every pod within 5 %), or a
# saturated GPU.
CASES = {
    "phased-between-sweeps": "attack",
    "restarts-before-sweeps": "attack",
    "trough-at-sweeps": "attack",
    "short-unphased": "attack",
    "idle-neighbour": "attack",
    "works-while-neighbour-idles": "attack",
    "bursts-without-a-share": "attack",
    "pod-between-sweeps": "attack",
    "own-mps-two-pods": "attack",
    "trough-with-idle-context": "attack",
    "spikes-beside-restarts": "attack",
    "shorter-than-a-look": "unseen",
    "inference-batches-and-notebook": "ordinary",
    "trainer-checkpoints-and-server": "ordinary",
    "saturated-two-busy": "saturated",
    "bursts-every-ten-seconds": "attack",
    "pulses-under-a-percent": "attack",
    "tick-dodging": "attack",
}


def case(name: str, offset: float = 0.0) -> tuple[str, float]:
    """The scenario text of case `name` (`CASES`) at phase `offset` (0-2 s), and how long it runs."""
    phase = offset / 60.0
    by_offset = attacks(offset)
    if name in by_offset:
        return node(STEADY, by_offset[name]), 60.0
    if name == "tick-dodging":
        # A tenant that reads the GPU's sample stamps and keeps its kernels off the GPU at every
        # tick (docs/nvml-sampling.md), beside a steady victim that is on at them.
        tenant = pod("team-b", "tenant", ATTACKER, "memory: 8GiB, sm: 0.4, dodges_ticks: true")
        return node(pod("team-a", "victim", VICTIM, "memory: 4GiB, sm: 0.5"), tenant), 60.0
    if name == "idle-neighbour":
        victim = pod(
            "team-a", "server", VICTIM, f"memory: 4GiB, sm: {{mean: 0.5, period_s: 60, on_s: 15, phase: {phase:.4f}}}"
        )
        return node(victim, pod("team-b", "steady", ATTACKER, "memory: 8GiB, sm: 0.4")), 120.0
    if name == "works-while-neighbour-idles":
        victim = pod("team-a", "server", VICTIM, "memory: 4GiB, sm: {mean: 0.5, period_s: 60, on_s: 15}")
        tenant = pod(
            "team-b",
            "tenant",
            ATTACKER,
            f"memory: 8GiB, sm: {{mean: 0.8, period_s: 60, on_s: 45, phase: {0.75 + phase:.4f}}}",
        )
        return node(victim, tenant), 120.0
    if name == "bursts-without-a-share":
        tenant = pod(
            "team-b",
            "tenant",
            ATTACKER,
            "memory: 8GiB, sm: 0.6",
            more=restarting(20.0, 1.0, 3.3 + offset),
            shares=False,
        )
        return node(STEADY, tenant), 60.0
    if name == "pod-between-sweeps":
        more = f"period_s: 2.0\nactive_s: 1.2\noffset_s: {round((0.4 + offset) % 2.0, 3)}"
        return node(STEADY, pod("team-b", "tenant", ATTACKER, "memory: 8GiB, sm: 0.6", more=more, shares=False)), 60.0
    if name == "own-mps-two-pods":
        first = pod(
            "team-b",
            "tenant-1",
            ATTACKER,
            "memory: 1GiB, sm: 0.0, mps: server, command: nvidia-cuda-mps-server",
            "memory: 4GiB, sm: 0.3, mps: client",
        )
        return node(STEADY, first, pod("team-b", "tenant-2", THIRD, "memory: 4GiB, sm: 0.3, mps: client")), 60.0
    if name == "trough-with-idle-context":
        return node(STEADY, by_offset["trough-at-sweeps"] + "      - {gpu: 0, memory: 1GiB, sm: 0.0}\n"), 60.0
    if name == "spikes-beside-restarts":
        victim = pod("team-a", "victim", VICTIM, "memory: 4GiB, sm: 0.3", more=restarting(2.0, 1.5, 0.3))
        tenant = pod(
            "team-b",
            "tenant",
            ATTACKER,
            "memory: 8GiB, sm: 0.2",
            f"memory: 1GiB, sm: {{mean: 0.5, period_s: 2.0, on_s: 0.3, phase: {0.1 + offset / 2.0:.4f}}}",
        )
        return node(victim, tenant), 60.0
    if name == "shorter-than-a-look":
        tenant = pod(
            "team-b",
            "tenant",
            ATTACKER,
            "memory: 8GiB, sm: 0.9",
            more=restarting(2.0, 0.15, round(0.05 + offset, 3) % 2.0),
        )
        return node(STEADY, tenant), 60.0
    if name == "inference-batches-and-notebook":
        server = pod(
            "team-a", "server", VICTIM, f"memory: 20GiB, sm: {{mean: 0.6, period_s: 30, on_s: 10, phase: {phase:.4f}}}"
        )
        notebook = pod("team-b", "notebook", ATTACKER, "memory: 6GiB, sm: {mean: 0.12, amplitude: 0.1, period_s: 20}")
        return node(server, notebook), 120.0
    if name == "bursts-every-ten-seconds":
        # A pod bursting 1 s every 9.5-11.5 s (with the offset) beside a steady one: its sample
        # after the idle seconds must not stand over them and take the steady pod's share
        # (estimator.BACK_US). The bursting pod is the one that would pay for the other.
        every = 9.5 + offset
        bursty = pod("team-a", "bursty", VICTIM, f"memory: 4GiB, sm: {{mean: 0.5, period_s: {every}, on_s: 1.0}}")
        return node(bursty, pod("team-b", "steady", ATTACKER, "memory: 4GiB, sm: 0.5")), 90.0
    if name == "pulses-under-a-percent":
        # Twenty of the tenant's processes pulsing 0.2 s at 0.65 every 15 s, staggered: each one's
        # figure under 1 % of its 14.2 s window, read 0 (a review's attack, 2026-12-07). Beside
        # them a pod bursting 1 s every 10 s, whose work over its gaps is placed where the GPU ran
        # more than the sure figures: the pulses' periods, were their work read as none.
        bursty = pod(
            "team-a",
            "bursty",
            VICTIM,
            f"memory: 4GiB, sm: {{mean: 0.5, period_s: 10, on_s: 1, phase: {offset / 10:.4f}}}",
        )
        pulses = [f"memory: 1GiB, sm: {{mean: 0.65, period_s: 15, on_s: 0.2, phase: {k / 20:.4f}}}" for k in range(20)]
        return node(bursty, pod("team-b", "tenant", ATTACKER, *pulses)), 90.0
    if name == "trainer-checkpoints-and-server":
        trainer = pod(
            "team-a",
            "trainer",
            VICTIM,
            f"memory: 30GiB, sm: {{mean: 0.55, period_s: 60, on_s: 50, phase: {phase:.4f}}}",
        )
        server = pod("team-b", "server", ATTACKER, "memory: 10GiB, sm: {mean: 0.3, period_s: 20, on_s: 8}")
        return node(trainer, server), 120.0
    if name == "saturated-two-busy":
        return node(
            pod("team-a", "a", VICTIM, "memory: 20GiB, sm: 0.7"), pod("team-b", "b", ATTACKER, "memory: 20GiB, sm: 0.7")
        ), 60.0
    raise KeyError(name)


@dataclass
class Bill:
    """What a run billed, by pod UID and for the GPU, and what the scenario ran."""

    pods: dict[str, float] = field(default_factory=dict)
    gpu: float = 0.0
    ran: dict[str, float] = field(default_factory=dict)
    gpu_ran: float = 0.0
    counters: list[dict[tuple[str, frozenset[tuple[str, str]]], float]] = field(default_factory=list)
    """Every counter series of each OpenMetrics scrape."""
    sweeps: int = 0
    joules: dict[str, float] = field(default_factory=dict)
    unattributed_joules: float = 0.0
    gpu_joules: float = 0.0
    unattributed_sm: dict[str, float] = field(default_factory=dict)
    """The GPU's SM-busy seconds no pod was given, by reason."""
    imbalance: float = 0.0
    """The largest gap, at any sweep, between the GPU's SM-busy seconds and its pods' plus
    every unattributed reason: 0 where the bill conserves."""

    def ratio(self, uid: str) -> float:
        """Billed over ran."""
        return self.pods.get(uid, 0.0) / self.ran[uid] if self.ran.get(uid) else float("nan")


def run(
    directory: Path | None,
    text: str,
    scrapes: list[float] | None = None,
    seed: int = 1,
    watch: bool = True,
    seconds: float = SECONDS,
    pods: tuple[str, ...] = (ATTACKER, VICTIM, THIRD),
) -> Bill:
    """The agent's parts on the scenario `text` for `seconds`: sweeps at jittered instants
    (drawn from `seed`), the watch every WATCH_S (unless not `watch`: `--watch-interval 0`),
    an OpenMetrics scrape every 15 s and at each of `scrapes` (the tenant's own)."""
    if directory is None:
        with tempfile.TemporaryDirectory() as temporary:
            return run(Path(temporary), text, scrapes, seed, watch, seconds, pods)
    directory.mkdir(parents=True, exist_ok=True)
    ratio = directory / "gpu_allocation.txt"
    ratio.write_text("2\n")
    clock = Clock(0.0)
    sim = SimulatedNode(parse_scenario(text, "attack.yaml"), directory / "proc", clock.monotonic, clock.wall_us)
    health = AgentHealth()
    sampler = sim_sampler(
        sim,
        RatioSource(ratio),
        health=health,
        clock=clock.monotonic,
        reader=GpuReader(sim, clock.monotonic, engine_every_s=0.0),
    )
    telemetry = Telemetry(sampler, health, min_interval=1.0, node_name="n", seed_metrics=False)
    sampler.drive()
    draw = random.Random(seed)
    events: list[tuple[float, int, str]] = [(0.0, 0, "sweep"), *([(WATCH_S, 1, "watch")] if watch else [])]
    events += [(t, 2, "scrape") for t in [*(15.0 * k for k in range(1, int(seconds // 15) + 1)), *(scrapes or [])]]
    heapq.heapify(events)
    bill = Bill()
    last: dict[str, float] = {}
    last_sweep = 0.0
    openmetrics = negotiate(OPENMETRICS_1)
    try:
        while events:
            t, _, kind = heapq.heappop(events)
            if t > seconds:
                break
            clock.t = t
            if kind == "sweep":
                last_sweep = t
                snapshot = sampler.sweep()
                sampler.collected("bill", snapshot)
                billed = 0.0
                rows = [row for row in (*snapshot.pods, *snapshot.ended) if row.sm_busy_seconds is not None]
                # A series gone since the last sweep starts again from 0 when it comes back.
                last = {uid: value for uid, value in last.items() if any(row.pod_uid == uid for row in rows)}
                for row in (*snapshot.pods, *snapshot.ended):
                    if row.sm_busy_seconds is not None:
                        before = last.get(row.pod_uid, 0.0)
                        # A pod's series that went and came back starts again from 0.
                        grown = row.sm_busy_seconds - before if row.sm_busy_seconds >= before else row.sm_busy_seconds
                        bill.pods[row.pod_uid] = bill.pods.get(row.pod_uid, 0.0) + grown
                        last[row.pod_uid] = row.sm_busy_seconds
                    if row.energy_joules is not None:
                        bill.joules[row.pod_uid] = max(bill.joules.get(row.pod_uid, 0.0), row.energy_joules)
                billed = sum(bill.pods.values())
                for gpu in snapshot.gpus:
                    bill.gpu = gpu.sm_busy_seconds or 0.0
                    bill.gpu_joules = gpu.energy_joules or 0.0
                    bill.unattributed_joules = gpu.energy_unattributed_joules or 0.0
                    bill.unattributed_sm = dict(gpu.sm_unattributed_seconds)
                    accounted = billed + sum(bill.unattributed_sm.values())
                    bill.imbalance = max(bill.imbalance, abs(bill.gpu - accounted))
                bill.sweeps += 1
                heapq.heappush(events, (t + next_wait(SWEEP_S, draw), 0, "sweep"))
            elif kind == "watch":
                sampler.watch()
                heapq.heappush(events, (t + WATCH_S, 1, "watch"))
            else:
                exposition = parse(telemetry.render(openmetrics).decode())
                bill.counters.append(
                    {
                        (name, key): value
                        for name, series in exposition.values.items()
                        if name.endswith("_total")
                        for key, value in series.items()
                    }
                )
        # The bill stands for the periods settled by the last sweep (collect/estimator.py), from
        # the first sweep's window, which reaches back before it: what the scenario ran is
        # counted over them. They end `SETTLE_US` before the last sweep, or earlier while a
        # process's next sample is awaited (`estimator.WAIT_US`): the periods after the last
        # settled are those the GPU's own counter does not hold yet, stepped back from the end.
        begin = -(MIN_WINDOW_US + SETTLE_US) / 1e6
        end = last_sweep - SETTLE_US / 1e6
        while sim.ran(0, begin, end) > bill.gpu + 1e-6 and end > begin:
            end -= PERIOD_S
        bill.ran = {uid: sim.ran(0, begin, end, uid) for uid in pods}
        bill.gpu_ran = sim.ran(0, begin, end)
    finally:
        telemetry.shutdown()
        sim.close()
    return bill
