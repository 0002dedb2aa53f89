"""Usage counters carried from sweep to sweep (otel_vgpu/collect/usage.py): pure, on plain rows."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from otel_vgpu.collect.aggregate import GpuRow, PodRow
from otel_vgpu.collect.usage import MAX_GAP_S, EnergySplit, Pending, Usage, accumulate, note_interval, split_pending
from otel_vgpu.gpu.backend import Device, ProcessUse
from testkit.rows import pod_row

pytestmark = pytest.mark.unit

GPU = GpuRow(
    device=Device(index=0, uuid="GPU-a", model="H200", memory_total=140, memory_used=10, utilization=0.5),
    vgpus=2.0,
    unattributed_memory=0,
)


def gpu_with(gpu: GpuRow, **device: Any) -> GpuRow:
    """`gpu` with its device's fields replaced as given."""
    return dataclasses.replace(gpu, device=dataclasses.replace(gpu.device, **device))


def pod(uid: str = "u1", sm: float | None = 0.25, memory: int = 100, container: str | None = None) -> PodRow:
    use = None if sm is None else ProcessUse(sm=sm)
    return pod_row(
        "trainer", use, namespace="ml", pod_uid=uid, container=container, memory_used=memory, memory_allocated=70
    )


def run(sweeps: list[tuple[float, list[PodRow], float | None]]) -> tuple[Usage, tuple[GpuRow, ...], tuple[PodRow, ...]]:
    """Sweeps at the given times with the given pods and GPU utilization; the last result."""
    usage = Usage()
    gpus: tuple[GpuRow, ...] = ()
    pods: tuple[PodRow, ...] = ()
    for at, rows, utilization in sweeps:
        usage, gpus, pods = accumulate(usage, [gpu_with(GPU, utilization=utilization)], rows, at)
    return usage, gpus, pods


def test_busy_seconds_integrate_sm_over_uneven_intervals() -> None:
    # 0.25 of the SMs for 1 s, 0.5 for 3 s, 0 for 0.5 s, 1.0 for 2 s: 0.25 + 1.5 + 0 + 2 = 3.75
    _, gpus, pods = run(
        [
            (100.0, [pod(sm=0.9)], 0.9),  # the first sweep counts nothing: no interval before it
            (101.0, [pod(sm=0.25)], 0.3),
            (104.0, [pod(sm=0.5)], 0.6),
            (104.5, [pod(sm=0.0)], 0.1),
            (106.5, [pod(sm=1.0)], 1.0),
        ]
    )
    assert pods[0].sm_busy_seconds == pytest.approx(3.75)
    assert gpus[0].sm_busy_seconds == pytest.approx(0.3 + 1.8 + 0.05 + 2.0)
    # rate() over the run is the mean SM use: 3.75 / 6.5 s
    assert (pods[0].sm_busy_seconds or 0.0) / (106.5 - 100.0) == pytest.approx(0.5769, abs=1e-3)


def test_a_long_gap_counts_as_max_gap_only() -> None:
    _, _, pods = run([(0.0, [pod()], 0.5), (1000.0, [pod(sm=1.0)], 0.5)])
    assert pods[0].sm_busy_seconds == pytest.approx(MAX_GAP_S)


def test_unknown_sm_leaves_the_counter_out_and_it_resumes_where_it_was() -> None:
    usage, _, pods = run([(0.0, [pod()], 0.5), (2.0, [pod(sm=0.5)], 0.5), (3.0, [pod(sm=None)], None)])
    assert pods[0].sm_busy_seconds is None  # an MPS server appeared: no per-pod SM
    usage, gpus, pods = accumulate(usage, [GPU], [pod(sm=0.5)], 4.0)
    assert pods[0].sm_busy_seconds == pytest.approx(1.0 + 0.5), "never backwards, no gap filled"
    assert gpus[0].sm_busy_seconds == pytest.approx(1.0 + 0.5)


def test_an_ended_pod_with_no_reader_is_dropped_and_starts_from_zero_if_seen_again() -> None:
    usage, _, _ = run([(0.0, [pod("u1"), pod("u2")], 0.5), (2.0, [pod("u1"), pod("u2")], 0.5)])
    usage, _, pods = accumulate(usage, [GPU], [pod("u1")], 3.0)
    assert [p.pod_uid for p in pods] == ["u1"] and len(usage.pod_busy) == 1 and not usage.ended
    usage, _, pods = accumulate(usage, [GPU], [pod("u1"), pod("u2")], 4.0)
    assert {p.pod_uid: p.sm_busy_seconds for p in pods} == pytest.approx({"u1": 1.0, "u2": 0.25})


def test_an_ended_pod_is_kept_at_its_final_values_until_every_reader_has_collected_it() -> None:
    usage, _, _ = run([(0.0, [pod("u1"), pod("u2")], 0.5), (2.0, [pod("u1"), pod("u2")], 0.5)])
    # u2 ends at sweep 3; the readers have collected sweep 2 at most: it is kept, its value final
    usage, _, pods = accumulate(usage, [GPU], [pod("u1")], 3.0, generation=3, collected_through=2)
    [kept] = usage.ended.values()
    assert [p.pod_uid for p in pods] == ["u1"] and kept.row.pod_uid == "u2" and kept.final == 3
    assert kept.row.sm_busy_seconds == pytest.approx(0.5) and kept.row.ended
    usage, _, _ = accumulate(usage, [GPU], [pod("u1")], 3.5, generation=4, collected_through=2)
    assert [e.row.sm_busy_seconds for e in usage.ended.values()] == pytest.approx([0.5])  # it does not move
    # once every reader has collected a sweep from its final one on, it goes
    usage, _, _ = accumulate(usage, [GPU], [pod("u1")], 4.0, generation=5, collected_through=3)
    assert not usage.ended and set(usage.pod_busy) == {("u1", "", "GPU-a", "")}


def test_a_pod_back_while_its_series_is_kept_goes_on_from_its_value() -> None:
    usage, _, _ = run([(0.0, [pod("u1")], 0.5), (2.0, [pod("u1")], 0.5)])
    usage, _, _ = accumulate(usage, [GPU], [], 3.0, generation=3, collected_through=2)
    usage, _, pods = accumulate(usage, [GPU], [pod("u1")], 4.0, generation=4, collected_through=2)
    assert pods[0].sm_busy_seconds == pytest.approx(0.5 + 0.25) and not usage.ended


def test_peak_memory_is_the_most_held_at_once_per_container() -> None:
    rows = [pod(memory=100, container="a"), pod(memory=5, container="b")]
    usage, _, _ = run([(0.0, rows, 0.5)])
    usage, _, _ = accumulate(usage, [GPU], [pod(memory=300, container="a"), pod(memory=5, container="b")], 1.0)
    _, _, pods = accumulate(usage, [GPU], [pod(memory=50, container="a"), pod(memory=7, container="b")], 2.0)
    assert {p.container: (p.memory_used, p.memory_peak) for p in pods} == {"a": (50, 300), "b": (7, 7)}


def test_the_gpu_counter_follows_its_own_samples_over_the_interval_not_the_last_period() -> None:
    # Bursty work sampled every 2 s: the last period read 1.0 (a burst), the window's samples 0.3.
    usage, _, _ = accumulate(Usage(), [GPU], [], 0.0)
    bursty = gpu_with(GPU, utilization=1.0, utilization_window=0.3)
    _, gpus, _ = accumulate(usage, [bursty], [], 2.0)
    assert gpus[0].sm_busy_seconds == pytest.approx(0.6)
    # Without samples (an old driver), the last period's figure serves.
    _, gpus, _ = accumulate(usage, [gpu_with(GPU, utilization=1.0)], [], 2.0)
    assert gpus[0].sm_busy_seconds == pytest.approx(2.0)


def split_energy(
    joules: float, seconds: float, idle_watts: float, utilization: float | None, ratio: float, pods: list[PodRow]
) -> EnergySplit:
    """One interval's energy split, as a read of the counter every sweep makes it."""
    return split_pending(joules, idle_watts, note_interval(Pending(), seconds, utilization, ratio, pods))


def shares(uid: str, held: float, sm: float | None) -> PodRow:
    return dataclasses.replace(pod(uid, sm=sm), shares=held)


@pytest.mark.parametrize(
    ("joules", "idle_watts", "utilization", "rows"),
    [
        (300.0, 75.0, 0.6, [shares("a", 1, 0.4), shares("b", 1, 0.2)]),  # a GPU half held, SM all run by pods
        (300.0, 75.0, 0.9, [shares("a", 2, 0.4)]),  # SM the pods did not run
        (100.0, 75.0, 0.0, [shares("a", 1, 0.0), shares("b", 1, 0.0)]),  # all held, idle
        (50.0, 75.0, 0.0, []),  # nobody: all unattributed, less than idle power (a short interval)
        (300.0, 0.0, 0.5, [shares("a", 3, 0.5)]),  # idle power not learned yet
        (300.0, 75.0, 0.5, [shares("a", 1, None)]),  # MPS: per-pod SM unknown
    ],
)
def test_the_pods_and_the_unattributed_add_up_to_the_gpus_energy(
    joules: float, idle_watts: float, utilization: float, rows: list[PodRow]
) -> None:
    split = split_energy(joules, 2.0, idle_watts, utilization, 2.0, rows)
    assert sum(split.pods.values()) + split.unattributed == pytest.approx(joules)
    assert all(part >= 0 for part in split.pods.values()) and split.unattributed >= -1e-9


def test_idle_energy_goes_by_shares_and_active_energy_by_sm() -> None:
    # 2 s at 275 W (idle 75 W): 150 J idle, 400 J active; ratio 2.
    split = split_energy(550.0, 2.0, 75.0, 0.6, 2.0, [shares("a", 1, 0.4), shares("b", 1, 0.2)])
    a, b = split.pods[("a", "", "GPU-a", "")], split.pods[("b", "", "GPU-a", "")]
    assert a == pytest.approx(75 + 400 * 0.4 / 0.6) and b == pytest.approx(75 + 400 * 0.2 / 0.6)
    assert split.unattributed == pytest.approx(0.0)
    # Under MPS the pods get nothing: all of it is unattributed.
    mps = split_energy(550.0, 2.0, 75.0, 0.6, 2.0, [shares("a", 1, None)])
    assert mps.pods == {} and mps.unattributed == 550.0


class Hashed(str):
    """A string whose hash is given: a set of them iterates in an order the test picks, as a set
    of plain strings iterates in one that PYTHONHASHSEED picks, differing from run to run."""

    hashed: int

    def __new__(cls, text: str, hashed: int) -> Hashed:
        made = super().__new__(cls, text)
        made.hashed = hashed
        return made

    def __hash__(self) -> int:
        return self.hashed


def test_the_split_is_the_same_whatever_order_a_set_of_its_pods_iterates_in() -> None:
    # 100 J by SM of 0.1, 0.2 and 0.4: the parts summed in one order come to 100 J, in another to
    # 1.4e-14 J less, which the unattributed counter took; in set order it changed between runs.
    sm = {"a": 0.1, "b": 0.2, "c": 0.4}
    orders, splits = set(), []
    for hashes in itertools.permutations(range(len(sm))):
        keys = {
            uid: (Hashed(uid, h), Hashed("", 0), Hashed("GPU-a", 0), Hashed("", 0))
            for uid, h in zip(sm, hashes, strict=True)
        }
        orders.add(tuple(str(key[0]) for key in set(keys.values())))
        pending = Pending(
            seconds=1.0,
            busy=sum(sm.values()),  # as note_interval sums it, where the GPU's own figure is no higher
            peak_utilization=sum(sm.values()),
            held={keys[uid]: 0.0 for uid in sm},
            ran={keys[uid]: sm[uid] for uid in sm},
        )
        split = split_pending(100.0, 0.0, pending)
        splits.append((split.unattributed, {str(key[0]): part for key, part in split.pods.items()}))
    assert len(orders) > 1  # the keys did iterate in more than one order
    assert all(split == splits[0] for split in splits), splits


def test_a_driver_reload_counts_from_zero_and_idle_power_is_learned() -> None:
    gpu = gpu_with(GPU, utilization=0.0, energy_mj=1_000_000)
    usage, gpus, _ = accumulate(Usage(), [gpu], [], 0.0)
    assert gpus[0].energy_joules == 0.0
    # 2 s idle at 80 W: 160 J; the idle power learned is 80 W
    usage, gpus, _ = accumulate(usage, [gpu_with(gpu, energy_mj=1_160_000)], [], 2.0)
    assert gpus[0].energy_joules == pytest.approx(160.0) and usage.idle_watts["GPU-a"] == pytest.approx(80.0)
    # the driver reloaded: its counter reads 40 J since then
    usage, gpus, _ = accumulate(usage, [gpu_with(gpu, energy_mj=40_000)], [], 4.0)
    assert gpus[0].energy_joules == pytest.approx(200.0), "never backwards"
    # a GPU without a counter has no energy families
    _, gpus, _ = accumulate(usage, [gpu_with(gpu, energy_mj=None)], [], 6.0)
    assert gpus[0].energy_joules is None


def test_a_configured_idle_power_bills_shares_on_a_gpu_never_seen_idle() -> None:
    # Busy from the first sweep on: nothing to learn from. 2 s at 400 W, 100 W of it idle
    # as configured; ratio 2: the holder of one share running nothing gets 100 J.
    busy = gpu_with(GPU, utilization=0.5, utilization_window=0.5, energy_mj=0)
    holder, runner = shares("a", 1, 0.0), shares("b", 1, 0.5)
    learned, _, _ = accumulate(Usage(), [busy], [holder, runner], 0.0)
    configured, _, _ = accumulate(Usage(), [busy], [holder, runner], 0.0, idle_watts=100.0)
    later = gpu_with(busy, energy_mj=800_000)
    _, _, pods = accumulate(learned, [later], [holder, runner], 2.0)
    assert {row.pod_uid: row.energy_joules for row in pods}["a"] == 0.0, "nothing learned, nothing idle"
    usage, _, pods = accumulate(configured, [later], [holder, runner], 2.0, idle_watts=100.0)
    assert {row.pod_uid: row.energy_joules for row in pods} == pytest.approx({"a": 100.0, "b": 700.0})
    # an idle interval teaches nothing when the power is configured
    idle = gpu_with(GPU, utilization=0.0, utilization_window=0.0, energy_mj=900_000)
    usage, _, _ = accumulate(usage, [idle], [], 4.0, idle_watts=100.0)
    assert usage.idle_watts["GPU-a"] == 100.0


def sweeps_of(
    pods_each: list[list[PodRow]], read_every: int, watts: float = 400.0, idle_watts: float | None = 100.0
) -> list[tuple[tuple[GpuRow, ...], tuple[PodRow, ...]]]:
    """Sweeps 2 s apart of a GPU drawing `watts`, 0.5 busy, its energy counter read
    every `read_every` sweeps (and on the first): the rows each sweep gives."""
    usage, out = Usage(), []
    for n, pods in enumerate(pods_each):
        read = n % read_every == 0
        gpu = gpu_with(
            GPU, utilization=0.5, utilization_window=0.5, energy_mj=int(n * 2 * watts * 1000) if read else None
        )
        gpu = gpu_with(gpu, energy_skipped=not read)
        # A reader that has collected nothing yet: the pods that end are kept.
        usage, gpus, rows = accumulate(usage, [gpu], pods, n * 2.0, idle_watts=idle_watts, collected_through=-1)
        out.append((gpus, rows + tuple(e.row for e in usage.ended.values())))
    return out


def joules_by_pod(rows: tuple[PodRow, ...]) -> dict[str, float | None]:
    return {row.pod_uid: row.energy_joules for row in rows}


def test_energy_read_every_few_sweeps_splits_as_reading_it_every_sweep_would() -> None:
    # Steady power: reading the counter every 5th sweep gives, at each read, what reading
    # it every sweep gives; between reads the counters hold, never going back.
    pods = [shares("a", 1, 0.3), shares("b", 1, 0.1)]
    every = sweeps_of([pods] * 11, read_every=1)
    fifth = sweeps_of([pods] * 11, read_every=5)
    for n in (5, 10):
        assert joules_by_pod(fifth[n][1]) == pytest.approx(joules_by_pod(every[n][1]))
        assert fifth[n][0][0].energy_joules == pytest.approx(every[n][0][0].energy_joules)
    for (gpus, rows), (later_gpus, later_rows) in itertools.pairwise(fifth):
        assert later_gpus[0].energy_joules is not None and gpus[0].energy_joules is not None
        assert later_gpus[0].energy_joules >= gpus[0].energy_joules
        for uid, joules in joules_by_pod(later_rows).items():
            assert joules is not None and joules >= (joules_by_pod(rows).get(uid) or 0.0)
    assert joules_by_pod(fifth[3][1]) == joules_by_pod(fifth[1][1]), "held between reads"


def test_pods_that_come_and_go_between_reads_are_split_by_the_time_they_held() -> None:
    # a for the whole window, b for its first half, c appears in its last sweep
    a, b, c = shares("a", 1, 0.4), shares("b", 1, 0.4), shares("c", 1, 0.4)
    window = [[a, b], [a, b], [a, b], [a], [a], [a, c]]
    gpus, rows = sweeps_of(window, read_every=5)[5]
    parts = joules_by_pod(rows)
    # 10 s at 400 W: 1000 J idle (100 W), 3000 J active. Each pod holds 1 of 2 vGPUs, 0.5 of the
    # idle power while present: a 10 s, b 4 s, c 2 s. Active by SM seconds over the GPU's busy
    # seconds: 2 x (0.8 + 0.8 + 0.5 + 0.5 + 0.8) = 6.8; a ran 4.0, b 1.6, c 0.8 of them.
    a_j, b_j, c_j = 500 + 3000 * 4.0 / 6.8, 200 + 3000 * 1.6 / 6.8, 100 + 3000 * 0.8 / 6.8
    assert gpus[0].energy_joules == pytest.approx(4000.0)
    # b ended before the read: its series, kept for the readers, carries its part
    assert parts == pytest.approx({"a": a_j, "b": b_j, "c": c_j})
    assert gpus[0].energy_unattributed_joules == pytest.approx(4000.0 - a_j - b_j - c_j)
    assert [row.pod_uid for row in rows if row.ended] == ["b"]
    # a pod that appears between reads has its counter at once, from 0
    _, rows = sweeps_of([[a], [a], [a, c]], read_every=5)[2]
    assert joules_by_pod(rows)["c"] == 0.0
