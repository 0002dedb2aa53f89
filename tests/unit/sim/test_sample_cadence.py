"""How often the simulated driver gives a process a new NVML sample: about one a period on a GPU,
as the recorded driver does (the default, driver.one_sample_a_period;
tests/unit/sim/test_nvml_recordings.py holds the draw to the recordings), or for every process
in every period it ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_vgpu.gpu.backend import ProcessUse
from otel_vgpu.sim.node import SAMPLE_PERIOD_US, SimulatedNode
from otel_vgpu.sim.processes import DODGE_MARGIN_US, DODGE_MOST, stamped_in
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.bill_runs import node, pod
from testkit.clock import Clock

pytestmark = pytest.mark.unit

BUSY = "11111111-1111-4111-8111-111111111111"
LIGHT = "22222222-2222-4222-8222-222222222222"


def new_samples(
    tmp_path: Path, driver: str, seconds: float, light: str = "", text: str | None = None
) -> tuple[dict[int, int], int]:
    """Each PID's count of new samples over `seconds`, read at every period, and the periods;
    `light`: the light process's other fields; `text`: another scenario."""
    if text is None:
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


def test_a_process_that_dodges_the_ticks_takes_no_sample_from_one_on_the_gpu_at_them(tmp_path: Path) -> None:
    # dodges_ticks: the recorder's tick-dodging tenant, off the GPU from 25 ms before each tick to
    # 25 ms after. Drawn by use, the process beside it takes every period's sample, where without
    # dodging the light one has a part of them. At the recorded tick rule, whichever of the two
    # ran last before a tick takes it, the GPU's whole period credited: at each phase (seed) one
    # of them takes every sample, the neighbour where it is on the GPU at the ticks (as the
    # recordings' busy victim was), the dodger where its neighbour's kernels end before its own.
    plain, periods = new_samples(tmp_path / "plain", "", 20.0)
    busy, light = sorted(plain)  # the first pod's process has the lower PID
    assert plain[light] >= periods / 8
    drawn, _ = new_samples(tmp_path / "drawn", "", 20.0, light=", dodges_ticks: true")
    assert set(drawn) == {busy} and drawn[busy] == pytest.approx(periods, abs=2)
    takers = []
    for seed in range(10):
        driver = f"driver: {{rhythm_ms: 200, draw_seed: {seed}}}\n"
        counts, _ = new_samples(tmp_path / str(seed), driver, 20.0, light=", dodges_ticks: true")
        assert len(counts) == 1 and sum(counts.values()) == pytest.approx(periods, abs=2), (seed, counts)
        takers.append(next(iter(counts)))
    assert set(takers) == {busy, light}


def test_a_process_that_asks_more_than_fits_between_two_ticks_cannot_dodge_them() -> None:
    # DODGE_MOST: the driver's period less DODGE_MARGIN_US each side of its tick. Drawn by use, a
    # dodger that asks 0.7 of each period is never picked beside a neighbour that ran; one that
    # asks 0.8 is on the GPU at the ticks and drawn as any process is.
    assert pytest.approx(1 - 2 * DODGE_MARGIN_US / SAMPLE_PERIOD_US) == DODGE_MOST
    for ask, picked in ((0.7, False), (0.8, True)):
        used = {(1, 10): ProcessUse(0.2), (2, 20): ProcessUse(ask)}
        picks = [stamped_in(0, k * SAMPLE_PERIOD_US, used, 0, 0, frozenset({(2, 20)})) for k in range(1, 41)]
        assert ((2, 20) in picks) is picked, ask


def test_a_process_that_dodged_the_ticks_dodges_them_in_its_kept_periods_after_it_ends(tmp_path: Path) -> None:
    # NVML keeps an ended process's sample a while (driver.ended_samples_s): the periods it ran
    # in before it ended are picked as they were while it lived, dodging included, whenever
    # they are asked.
    light = pod("b", "light", LIGHT, "memory: 4GiB, sm: 0.3, dodges_ticks: true", more="period_s: 10\nactive_s: 5")
    text = node(pod("a", "busy", BUSY, "memory: 4GiB, sm: 0.6"), light) + "driver: {ended_samples_s: 10}\n"
    counts, periods = new_samples(tmp_path, "", 20.0, text=text)
    assert len(counts) == 1 and sum(counts.values()) == pytest.approx(periods, abs=2), counts
