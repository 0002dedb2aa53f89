"""A bill no tenant can time its way out of. A tenant chooses when its processes live, when
they work, and when its pod scrapes `/metrics`; none of it may shed its bill or move it onto
a neighbour. Each test is an attack on the simulated node, which runs its processes on its
own clock (a process between two sweeps still ran, and the GPU's samples and energy count
it), against the agent's own parts: its jittered sweeps, its process watch every 0.25 s,
and scrapes through the real telemetry. The bill is held to what the scenario ran
(`SimulatedNode.ran`): the tenant pays at least 95 % of it, the victim within 5 %.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from otel_vgpu.collect.reading import GpuReader
from otel_vgpu.collect.sweeper import next_wait
from otel_vgpu.export.exposition import OPENMETRICS_1, negotiate
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.health import Health
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.clock import Clock
from testkit.promtext import parse

from .conftest import make_sampler

VICTIM = "5a1e0c2b-7d3f-4e8a-9b6c-1d2e3f405162"
ATTACKER = "a77ac4e2-0b1d-4c2e-8f3a-6b5c4d3e2f10"


def node(*pods: str, accounting: bool = False) -> str:
    """A scenario of one GPU and `pods` (each from `pod`); with `accounting`, NVML's
    accounting mode on."""
    gpu = "{model: NVIDIA H100 80GB HBM3, memory: 80GiB" + (", accounting: true}" if accounting else "}")
    return f"gpus:\n  - {gpu}\npods:\n" + "".join(pods)


def pod(namespace: str, name: str, uid: str, *processes: str, more: str = "") -> str:
    """One pod of a scenario, holding a share of GPU 0; `more`: its other fields."""
    lines = [f"  - namespace: {namespace}", f"    name: {name}", f"    uid: {uid}", "    shares: {0: 1}"]
    lines += [f"    {line}" for line in more.splitlines() if line]
    lines += ["    processes:", *(f"      - {{gpu: 0, {process}}}" for process in processes)]
    return "\n".join(lines) + "\n"


def write_ratio(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("2\n")
    return ratio


pytestmark = pytest.mark.unit

SECONDS = 60.0
SWEEP_S = 2.0
WATCH_S = 0.25
# The victim: a steady pod beside every attack.
STEADY = pod("team-a", "victim", VICTIM, "memory: 4GiB, sm: 0.3")


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


def run(tmp_path: Path, text: str, scrapes: list[float] | None = None, seed: int = 1, watch: bool = True) -> Bill:
    """The agent's parts on the scenario `text` for SECONDS: sweeps at jittered instants, the
    watch every WATCH_S (unless not `watch`: `--watch-interval 0`), an OpenMetrics scrape every
    15 s and at each of `scrapes` (the tenant's own)."""
    clock = Clock(0.0)
    sim = SimulatedNode(parse_scenario(text, "attack.yaml"), tmp_path / "proc", clock.monotonic, clock.wall_us)
    health = Health()
    sampler = make_sampler(
        sim, write_ratio(tmp_path), health=health, clock=clock.monotonic, reader=GpuReader(sim, clock.monotonic)
    )
    telemetry = Telemetry(sampler, health, min_interval=1.0, node_name="n", seed_metrics=False)
    sampler.drive()
    draw = random.Random(seed)
    events: list[tuple[float, int, str]] = [(0.0, 0, "sweep"), *([(WATCH_S, 1, "watch")] if watch else [])]
    events += [(t, 2, "scrape") for t in [*(15.0 * k for k in range(1, 5)), *(scrapes or [])]]
    heapq.heapify(events)
    bill = Bill()
    last: dict[str, float] = {}
    openmetrics = negotiate(OPENMETRICS_1)
    try:
        while events:
            t, _, kind = heapq.heappop(events)
            if t > SECONDS:
                break
            clock.t = t
            if kind == "sweep":
                snapshot = sampler.sweep()
                sampler.collected("bill", snapshot)
                for row in (*snapshot.pods, *snapshot.ended):
                    if row.sm_busy_seconds is not None:
                        before = last.get(row.pod_uid, 0.0)
                        # A pod's series that went and came back starts again from 0.
                        grown = row.sm_busy_seconds - before if row.sm_busy_seconds >= before else row.sm_busy_seconds
                        bill.pods[row.pod_uid] = bill.pods.get(row.pod_uid, 0.0) + grown
                        last[row.pod_uid] = row.sm_busy_seconds
                    if row.energy_joules is not None:
                        bill.joules[row.pod_uid] = max(bill.joules.get(row.pod_uid, 0.0), row.energy_joules)
                for gpu in snapshot.gpus:
                    bill.gpu = gpu.sm_busy_seconds or 0.0
                    bill.gpu_joules = gpu.energy_joules or 0.0
                    bill.unattributed_joules = gpu.energy_unattributed_joules or 0.0
                    bill.unattributed_sm = dict(gpu.sm_unattributed_seconds)
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
        end = clock.t
        bill.ran = {uid: sim.ran(0, 0.0, end, uid) for uid in (ATTACKER, VICTIM)}
        bill.gpu_ran = sim.ran(0, 0.0, end)
    finally:
        telemetry.shutdown()
        sim.close()
    return bill


def restarting(period_s: float, active_s: float, offset_s: float) -> str:
    """A pod whose processes live `active_s` of every `period_s`, fresh ones each time."""
    return f"period_s: {period_s}\nactive_s: {active_s}\noffset_s: {offset_s}\nrestarts: true"


# Each attack of the tenant, beside the steady victim (one GPU, a share each).
ATTACKS = {
    # GPU processes alive 1.2 s of every 2 s, phased to miss sweeps every 2 s.
    "phased-between-sweeps": pod(
        "team-b",
        "tenant",
        ATTACKER,
        "memory: 8GiB, sm: 0.6",
        more=restarting(2.0, 1.2, 0.4),
    ),
    # Back-to-back restarts, each born 50 ms before a sweep every 2 s would come.
    "restarts-before-sweeps": pod(
        "team-b",
        "tenant",
        ATTACKER,
        "memory: 8GiB, sm: 0.6",
        more=restarting(2.0, 1.95, 1.95),
    ),
    # One process that never exits, at a trough whenever a sweep every 2 s would come.
    "trough-at-sweeps": pod(
        "team-b", "tenant", ATTACKER, "memory: 8GiB, sm: {mean: 0.5, amplitude: 0.45, period_s: 2.0, phase: 0.75}"
    ),
    # No knowledge of the phase: processes of 1.4 s, one every 2.3 s.
    "short-unphased": pod(
        "team-b",
        "tenant",
        ATTACKER,
        "memory: 8GiB, sm: 0.6",
        more=restarting(2.3, 1.4, 0.1),
    ),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_tenant_that_times_its_processes_pays_what_it_ran_and_its_neighbour_keeps_its_bill(
    tmp_path: Path, attack: str
) -> None:
    bill = run(tmp_path, node(STEADY, ATTACKS[attack]))
    assert bill.ran[ATTACKER] > 10.0, bill  # the attack ran for real
    assert bill.pods.get(ATTACKER, 0.0) >= 0.95 * bill.ran[ATTACKER], bill
    assert bill.pods.get(ATTACKER, 0.0) <= 1.05 * bill.ran[ATTACKER], bill
    assert bill.pods[VICTIM] == pytest.approx(bill.ran[VICTIM], rel=0.05), bill
    # The GPU's own figures count every process, whether or not a sweep saw it.
    assert bill.gpu == pytest.approx(bill.gpu_ran, rel=0.05), bill


def test_a_trough_at_the_sweeps_never_moves_the_tenants_bill_onto_its_neighbour(tmp_path: Path) -> None:
    # The sweeps are jittered, so the tenant's troughs meet them at random: its per-process
    # figure, sampled at the sweeps, is wrong both ways from period to period. Beside the
    # victim's figure, which holds still, what the GPU ran beyond it is the tenant's: a figure
    # read low sheds nothing, and one read high takes nothing from the victim.
    bill = run(tmp_path, node(STEADY, ATTACKS["trough-at-sweeps"]))
    assert bill.pods[VICTIM] <= 1.02 * bill.ran[VICTIM], bill
    assert bill.pods[ATTACKER] <= 1.02 * bill.ran[ATTACKER], bill
    assert bill.pods[ATTACKER] + bill.pods[VICTIM] <= bill.gpu + 1e-6, bill
    assert bill.gpu == pytest.approx(bill.gpu_ran, rel=0.05), bill


@pytest.mark.parametrize("attack", ["trough-at-sweeps", "phased-between-sweeps"])
def test_a_tenant_cannot_push_its_work_onto_a_neighbours_young_processes(tmp_path: Path, attack: str) -> None:
    # The victim starts a fresh process every 2 s: each is young, and young processes are
    # given what a shared period's figures leave (collect/ledger.py), held to the rise their
    # coming made. A tenant whose figure reads low beside them must not bill them its work.
    victim = pod("team-a", "victim", VICTIM, "memory: 4GiB, sm: 0.3", more=restarting(2.0, 1.5, 0.3))
    bill = run(tmp_path, node(victim, ATTACKS[attack]))
    assert bill.ran[VICTIM] > 10.0, bill
    assert bill.pods[VICTIM] <= 1.05 * bill.ran[VICTIM], bill


def test_a_tenant_that_scrapes_to_set_the_sweeps_moves_none_and_pays_what_it_ran(tmp_path: Path) -> None:
    # The tenant scrapes at the start of each of its bursts, then works 1.2 s: were a scrape to
    # sweep, the next sweep would come after its burst.
    tenant = pod(
        "team-b",
        "tenant",
        ATTACKER,
        "memory: 8GiB, sm: 0.6",
        more=restarting(2.0, 1.2, 0.5),
    )
    scrapes = [0.5 + 2.0 * k + d for k in range(29) for d in (0.0, 0.01)]
    bill = run(tmp_path, node(STEADY, tenant), scrapes=scrapes)
    quiet = run(tmp_path / "quiet", node(STEADY, tenant))
    # Its scrapes made no sweep: as many as without them, the same jittered draws.
    assert bill.sweeps == quiet.sweeps
    assert bill.pods[ATTACKER] >= 0.95 * bill.ran[ATTACKER], bill
    assert bill.pods[VICTIM] == pytest.approx(bill.ran[VICTIM], rel=0.05), bill


def test_a_tenants_own_mps_daemon_is_billed_to_its_pod_and_its_neighbour_keeps_its_energy(tmp_path: Path) -> None:
    # `nvidia-cuda-mps-control -d` in the tenant's own pod, on a time-sliced GPU in the default
    # compute mode: the server's samples are its two clients' work, all the tenant's.
    tenant = pod(
        "team-b",
        "tenant",
        ATTACKER,
        "memory: 1GiB, sm: 0.0, mps: server, command: nvidia-cuda-mps-server",
        "memory: 4GiB, sm: 0.15, mps: client",
        "memory: 4GiB, sm: 0.15, mps: client",
    )
    bill = run(tmp_path, node(STEADY, tenant))
    assert bill.ran[ATTACKER] == pytest.approx(0.3 * bill.ran[VICTIM] / 0.3, rel=0.05)
    assert bill.pods[ATTACKER] == pytest.approx(bill.ran[ATTACKER], rel=0.05), bill
    assert bill.pods[VICTIM] == pytest.approx(bill.ran[VICTIM], rel=0.05), bill
    # Each pod gets energy: the victim's is not blanked by its neighbour's daemon.
    assert bill.joules[VICTIM] > 0.1 * bill.gpu_joules, bill
    assert bill.joules[ATTACKER] > 0.1 * bill.gpu_joules, bill


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_no_counter_goes_below_zero_or_down_under_any_attack(tmp_path: Path, attack: str) -> None:
    scrapes = [0.5 + 1.7 * k for k in range(34)]
    bill = run(tmp_path, node(STEADY, ATTACKS[attack]), scrapes=scrapes)
    assert len(bill.counters) > 30
    assert any(name == "vgpu_gpu_energy_unattributed_joules_total" for c in bill.counters for name, _ in c)
    for before, after in zip(bill.counters, bill.counters[1:], strict=False):
        for series, value in after.items():
            assert value >= 0, series
            # A series that stayed from one scrape to the next never went down.
            assert series not in before or value >= before[series], (series, before[series], value)


@pytest.mark.parametrize("attack", sorted(set(ATTACKS) - {"trough-at-sweeps"}))
def test_with_accounting_on_each_process_is_billed_its_lifetime_use(tmp_path: Path, attack: str) -> None:
    # NVML's accounting (an administrator's nvidia-smi -am 1) gives an ended process's lifetime
    # figure: the young-process estimate gives way to it, and the bill is the work, not a floor.
    bill = run(tmp_path, node(ATTACKS[attack], STEADY, accounting=True))
    assert bill.ran[ATTACKER] > 10.0
    assert bill.pods.get(ATTACKER, 0.0) == pytest.approx(bill.ran[ATTACKER], rel=0.05)
    assert bill.pods[VICTIM] == pytest.approx(bill.ran[VICTIM], rel=0.05)


def test_with_the_watch_off_what_no_look_saw_is_unattributed_never_the_victims(tmp_path: Path) -> None:
    # No watch (--watch-interval 0): the tenant's processes phased between the sweeps are seen by
    # none. Without accounting, the periods they ran in look like the victim's alone, and the
    # victim pays for them; with it, each is a process of no pod there, unattributed as unseen.
    attack = ATTACKS["phased-between-sweeps"]
    blind = run(tmp_path / "off", node(attack, STEADY), watch=False)
    accounted = run(tmp_path / "on", node(attack, STEADY, accounting=True), watch=False)
    assert blind.pods[VICTIM] > 1.3 * blind.ran[VICTIM]
    assert accounted.pods[VICTIM] == pytest.approx(accounted.ran[VICTIM], rel=0.05)
    billed = accounted.pods.get(ATTACKER, 0.0)
    assert accounted.unattributed_sm["unseen"] + billed >= 0.9 * accounted.ran[ATTACKER]
    assert blind.unattributed_sm.get("unseen", 0.0) == 0.0
