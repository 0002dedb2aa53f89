"""How often the simulated driver gives a process a new NVML sample: about one a period on a GPU,
as the recorded driver does (the default, driver.one_sample_a_period;
tests/unit/sim/test_nvml_recordings.py holds the draw to the recordings), or for every process
in every period it ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_vgpu.sim.node import SAMPLE_PERIOD_US, SimulatedNode
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.bill_runs import node, pod
from testkit.clock import Clock

pytestmark = pytest.mark.unit

BUSY = "11111111-1111-4111-8111-111111111111"
LIGHT = "22222222-2222-4222-8222-222222222222"


def new_samples(tmp_path: Path, driver: str, seconds: float, light: str = "") -> tuple[dict[int, int], int]:
    """Each PID's count of new samples over `seconds`, read at every period, and the periods;
    `light`: the light process's other fields."""
    text = node(
        pod("a", "busy", BUSY, "memory: 4GiB, sm: 0.6"), pod("b", "light", LIGHT, f"memory: 4GiB, sm: 0.3{light}")
    )
    clock = Clock()
    sim = SimulatedNode(parse_scenario(text + driver, "s.yaml"), tmp_path / "proc", clock.monotonic, clock.wall_us)
    seen: set[tuple[int, int]] = set()
    periods = round(seconds * 1e6 / SAMPLE_PERIOD_US)
    try:
        for _ in range(periods):
            clock.t += SAMPLE_PERIOD_US / 1e6
            seen |= {(s.pid, s.timestamp_us) for s in sim.utilization_samples(0, clock.wall_us() - 1_000_000)}
    finally:
        sim.close()
    counts: dict[int, int] = {}
    for pid, _ in seen:
        counts[pid] = counts.get(pid, 0) + 1
    return counts, periods


def test_without_the_recorded_cadence_every_process_that_ran_has_a_new_sample_each_period(tmp_path: Path) -> None:
    counts, periods = new_samples(tmp_path, "driver: {one_sample_a_period: false}\n", 40.0)
    assert sorted(counts.values()) == pytest.approx([periods, periods], abs=2)


def test_by_default_a_gpu_gives_one_a_period_drawn_by_use_as_recorded(tmp_path: Path) -> None:
    counts, periods = new_samples(tmp_path, "", 120.0)
    assert sum(counts.values()) == pytest.approx(periods, abs=2)
    light, busy = sorted(counts.values())
    # The busy process ran 0.6 of each period, the light one 0.3: two samples to one.
    assert busy / (busy + light) == pytest.approx(2 / 3, abs=0.08)


def test_each_draw_seed_draws_the_period_s_samples_anew_and_the_same_every_time(tmp_path: Path) -> None:
    # An evaluation over seeds meets other draws of which process a period's sample goes to; one
    # seed asked twice meets the same (the driver's pick of a period does not change when asked).
    def stamps(seed: int, where: str) -> dict[int, set[int]]:
        text = node(pod("a", "busy", BUSY, "memory: 4GiB, sm: 0.6"), pod("b", "light", LIGHT, "memory: 4GiB, sm: 0.3"))
        clock = Clock()
        scenario = parse_scenario(text + f"driver: {{draw_seed: {seed}}}\n", "s.yaml")
        sim = SimulatedNode(scenario, tmp_path / where, clock.monotonic, clock.wall_us)
        got: dict[int, set[int]] = {}
        try:
            for _ in range(100):
                clock.t += SAMPLE_PERIOD_US / 1e6
                for sample in sim.utilization_samples(0, clock.wall_us() - 1_000_000):
                    got.setdefault(sample.pid, set()).add(sample.timestamp_us)
        finally:
            sim.close()
        return got

    assert stamps(0, "a") == stamps(0, "b")
    assert stamps(7, "c") == stamps(7, "d")
    assert stamps(0, "e") != stamps(7, "f")


def test_with_a_rhythm_the_process_on_the_gpu_at_the_tick_takes_the_samples(tmp_path: Path) -> None:
    # driver.rhythm_ms: 100, as the recorded driver does with processes whose kernels keep a
    # 100 ms rhythm (tests/data/nvml-recordings/idle-context-*): at some seeds (phases) one
    # process takes every sample, where the draw by use gives two to one.
    parts = []
    for seed in range(8):
        counts, periods = new_samples(tmp_path / str(seed), f"driver: {{rhythm_ms: 100, draw_seed: {seed}}}\n", 20.0)
        assert sum(counts.values()) == pytest.approx(periods, abs=2)
        parts.append(max(counts.values()) / sum(counts.values()))
    assert max(parts) >= 0.95


def test_with_a_rhythm_the_taker_s_figure_is_the_gpu_s_whole_period(tmp_path: Path) -> None:
    # The recordings: the process that takes a period's tick is credited with the GPU's whole
    # period, 0.8 for its own 0.43 (tests/unit/sim/test_nvml_recordings.py). Here 0.6 + 0.3: at
    # a phase where one takes every tick, its figure climbs to the GPU's 0.9, not its own; drawn
    # by use, each is credited its own, and no figure passes the busy one's 0.6.
    text = node(pod("a", "busy", BUSY, "memory: 4GiB, sm: 0.6"), pod("b", "light", LIGHT, "memory: 4GiB, sm: 0.3"))

    def highest(driver: str, where: str) -> float:
        clock = Clock()
        sim = SimulatedNode(parse_scenario(text + driver, "s.yaml"), tmp_path / where, clock.monotonic, clock.wall_us)
        try:
            clock.t += 20.0
            return max(sample.use.sm for sample in sim.utilization_samples(0, clock.wall_us() - 1_000_000))
        finally:
            sim.close()

    locked = [highest(f"driver: {{rhythm_ms: 100, draw_seed: {seed}}}\n", f"r{seed}") for seed in range(8)]
    assert max(locked) >= 0.85
    drawn = [highest(f"driver: {{draw_seed: {seed}}}\n", f"d{seed}") for seed in range(4)]
    assert max(drawn) <= 0.61


@pytest.mark.parametrize("driver", ["", "driver: {rhythm_ms: 200}\n", "driver: {rhythm_ms: 100, draw_seed: 3}\n"])
def test_a_process_that_dodges_the_ticks_is_given_no_sample_beside_one_on_the_gpu(tmp_path: Path, driver: str) -> None:
    # What the recorded tick rule gives a process that keeps its kernels off the GPU at every
    # tick (dodges_ticks: the recorder's tick-dodging): beside a process that runs in every
    # period it never takes a period's sample, drawn by use or at a rhythm, and the other
    # takes every one, where without dodging it has a part of them.
    counts, periods = new_samples(tmp_path / "dodging", driver, 20.0, light=", dodges_ticks: true")
    assert len(counts) == 1
    assert sum(counts.values()) == pytest.approx(periods, abs=2)
    plain, _ = new_samples(tmp_path / "plain", "driver: {rhythm_ms: 200}\n" if driver else "", 20.0)
    assert min(plain.values()) >= periods / 8
