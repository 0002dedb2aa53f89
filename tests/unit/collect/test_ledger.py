"""The estimator (otel_vgpu/collect/estimator.py) and the ledger that feeds it
(otel_vgpu/collect/ledger.py) on plain data: what a sample stands for, what its absence means,
how a period of the GPU's own figure is split, and that every split conserves."""

from __future__ import annotations

import math
import random

import pytest

from otel_vgpu.collect import estimator, ledger, trailing
from otel_vgpu.collect.estimator import Evidence, Kind, Present
from otel_vgpu.gpu.backend import AccountingRecord, ProcessUse, UtilizationSample
from otel_vgpu.pods.cgroups import PodRef

pytestmark = pytest.mark.unit

MS = 1_000
A = PodRef("aaaaaaaa-0000-4000-8000-000000000001", None)
B = PodRef("bbbbbbbb-0000-4000-8000-000000000002", None)


def periods(start_ms: int, end_ms: int, sm: float) -> list[tuple[int, float | None]]:
    """The GPU's samples, one per 200 ms period ending after `start_ms` up to `end_ms`."""
    return [(t * MS, sm) for t in range(start_ms + 200, end_ms + 1, 200)]


def seen(pid: int, owner: PodRef | None, start: int = 1, born_ms: int = 0) -> ledger.Seen:
    """A process in a listing, begun at `born_ms`."""
    return ledger.Seen(pid, start, born_ms * MS, owner)


def nvml(sm: float, *runs: tuple[int, int], at_ms: int) -> float:
    """NVML's figure at `at_ms` of a process that ran at `sm` over each of `runs` (from, to ms):
    the mean of its use over the window up to it (collect/trailing.py), less the half percent
    that whole percents rounded down take off on average."""
    window_ms = trailing.WINDOW_US / MS
    ran = sum(max(0, min(to, at_ms) - max(begin, at_ms - window_ms)) for begin, to in runs) * sm
    return ran / window_ms - trailing.FLOORED


def samples(pid: int, first_ms: int, last_ms: int, sm: float, since_ms: int = 0) -> list[UtilizationSample]:
    """A process's samples every 200 ms from `first_ms` to `last_ms`, running at `sm` since
    `since_ms`, as NVML gives them."""
    return [
        UtilizationSample(pid, t * MS, ProcessUse(nvml(sm, (since_ms, t), at_ms=t)))
        for t in range(first_ms, last_ms + 1, 200)
    ]


def record(pid: int, start_ms: int, end_ms: int, sm: float, running: bool = False) -> AccountingRecord:
    """NVML's accounting of a process: `time` is 0 while it runs (nvml.h)."""
    seconds = 0.0 if running else (end_ms - start_ms) / 1_000
    return AccountingRecord(pid, start_ms * MS, seconds, running, sm, 0.0)


def figure(value: float, low: float | None = None, peak: float | None = None) -> Evidence:
    return Evidence(Kind.FIGURE, value, 0, value if peak is None else peak, value if low is None else low)


# The estimator alone.


def drawn_evidence(draw: random.Random, spread: float = 1.0, unsure: bool = False) -> Evidence:
    """Evidence of any kind, its figure up to 1 / `spread` (none but a figure's or a tail's), its
    low and its peak around it; with `unsure`, standing surely four times in five."""
    kind = draw.choice([Kind.FIGURE, Kind.IDLE, Kind.TAIL, Kind.UNKNOWN])
    value = draw.random() / spread
    low, peak = sorted((draw.uniform(0, value), draw.uniform(value, 1)))
    sure = (draw.random() < 0.8,) if unsure else ()
    return Evidence(kind, value if kind in (Kind.FIGURE, Kind.TAIL) else 0.0, 0, peak, low, *sure)


def test_every_split_conserves_the_gpus_figure_and_gives_no_one_a_negative_share() -> None:
    draw = random.Random(55)
    for _ in range(5_000):
        present = []
        for _ in range(draw.randint(0, 5)):
            present.append(
                Present(
                    draw.choice(["a", "b", None]),
                    draw.choice([1.0, draw.random()]),
                    drawn_evidence(draw),
                    unseen=draw.random() < 0.1,
                )
            )
        gpu = draw.random()
        result = estimator.split(gpu, present)
        assert all(share >= -1e-12 for share in result.shares)
        assert all(value >= -1e-12 for value in result.unattributed.values())
        pods = sum(share for share, p in zip(result.shares, present, strict=True) if p.owner is not None)
        assert pods + sum(result.unattributed.values()) == pytest.approx(gpu)
        # No life is given more than its figures, the edge of its life, its peak and its tail allow.
        for share, p in zip(result.shares, present, strict=True):
            e = p.evidence
            most = {
                Kind.FIGURE: max(e.value, e.peak) + e.value * estimator.SLACK,
                Kind.TAIL: e.value * (1 + estimator.SLACK),
            }.get(e.kind, 0.0)
            assert share <= most + 1e-9


def test_a_run_of_periods_split_at_once_gives_each_what_it_would_have_alone() -> None:
    draw = random.Random(57)
    for _ in range(2_000):
        present = []
        for _ in range(draw.randint(0, 6)):
            evidence = drawn_evidence(draw, spread=3, unsure=True)
            present.append(Present(draw.choice(["a", "b", None]), draw.choice([1.0, draw.random()]), evidence))
        gpus = [draw.random() for _ in range(draw.randint(1, 6))]
        tails = draw.random() < 0.5
        # Exactly: the bill's sums are the same, to the last digit.
        for gpu, (shares, unattributed) in zip(gpus, estimator.split_run(gpus, present, tails), strict=True):
            alone = estimator.split(gpu, present, tails)
            assert (tuple(shares), unattributed) == (alone.shares, alone.unattributed)


def test_a_lifes_evidence_stepped_from_one_samples_run_of_periods_to_the_next_is_what_each_period_reads() -> None:
    draw = random.Random(58)
    for _ in range(300):
        track = estimator.Track()
        stamp = draw.randint(0, 3) * 200 * MS
        for _ in range(draw.randint(0, 12)):
            since = stamp - draw.choice([200, 1000, 2000, 3000]) * MS
            figure = ProcessUse(sm=draw.random())
            track.append(stamp, figure, since, draw.choice([since, stamp - 200 * MS]))
            stamp += draw.choice([1000, 2000, 2200, 4000]) * MS
        ended = draw.choice([None, stamp - draw.randint(0, 5000) * MS])
        ends = range(200 * MS, stamp + 5000 * MS, 200 * MS)
        stepped = estimator.LifeEvidence(track, ended)
        said, to, before = estimator.IDLE, -float("inf"), -float("inf")
        for end in ends:
            if not (end <= to and end < before):
                said, to, before = stepped.run(end - 200 * MS, end)
            assert said == estimator.evidence_at(track, end - 200 * MS, end, ended)


def test_a_period_is_split_by_the_figures_and_what_they_leave_is_unexplained() -> None:
    result = estimator.split(0.9, [Present("a", 1.0, figure(0.3)), Present("b", 1.0, figure(0.2))])
    assert result.shares == pytest.approx((0.3, 0.2))
    assert result.unattributed["unexplained"] == pytest.approx(0.4)


def test_where_the_figures_read_more_than_the_gpu_ran_the_swinging_one_gives_way_first() -> None:
    # A still 0.3 beside a figure read 0.9 whose samples around read as low as 0.1.
    result = estimator.split(0.6, [Present("a", 1.0, figure(0.3)), Present("b", 1.0, figure(0.9, low=0.1))])
    assert result.shares == pytest.approx((0.3, 0.3))
    # Two still figures that read more than the GPU ran (time-slicing) are scaled alike.
    result = estimator.split(0.6, [Present("a", 1.0, figure(0.6)), Present("b", 1.0, figure(0.6))])
    assert result.shares == pytest.approx((0.3, 0.3))


def test_a_figure_read_at_a_trough_takes_up_to_its_own_peak_and_a_still_neighbour_none() -> None:
    result = estimator.split(0.9, [Present("a", 1.0, figure(0.3)), Present("b", 1.0, figure(0.1, peak=0.9))])
    assert result.shares == pytest.approx((0.3, 0.6))
    assert result.unattributed["unexplained"] == pytest.approx(0.0)


def test_only_a_pod_alone_may_take_the_drivers_error_beyond_its_figure() -> None:
    alone = estimator.split(0.5, [Present("a", 1.0, figure(0.4)), Present("a", 1.0, Evidence(Kind.IDLE))])
    assert alone.shares[0] == pytest.approx(0.4 * (1 + estimator.SLACK))
    beside = estimator.split(0.5, [Present("a", 1.0, figure(0.4)), Present("b", 1.0, figure(0.0))])
    assert beside.shares[0] == pytest.approx(0.4)
    # An idle context of another pod is no one beside it.
    idle = estimator.split(0.5, [Present("a", 1.0, figure(0.4)), Present("b", 1.0, Evidence(Kind.IDLE))])
    assert idle.shares[0] == pytest.approx(0.4 * (1 + estimator.SLACK))


def test_a_tail_is_given_at_most_its_newest_figure_and_a_life_without_one_nothing() -> None:
    result = estimator.split(
        0.9,
        [
            Present("a", 1.0, figure(0.3)),
            Present("b", 1.0, Evidence(Kind.TAIL, 0.4)),
            Present("c", 1.0, Evidence(Kind.IDLE)),
        ],
    )
    assert result.shares[1] == pytest.approx(0.4 * (1 + estimator.SLACK))
    assert result.shares[2] == 0.0


def test_what_no_pod_is_given_is_counted_by_its_reason() -> None:
    no_pod = estimator.split(0.5, [Present(None, 1.0, figure(0.2)), Present("a", 1.0, figure(0.2))])
    assert no_pod.unattributed["no_pod"] == pytest.approx(0.2)
    assert no_pod.unattributed["unexplained"] == pytest.approx(0.1)
    mps = estimator.split(0.5, [Present("a", 1.0, Evidence(Kind.UNKNOWN)), Present("b", 1.0, figure(0.2))])
    assert mps.unattributed["mps"] == pytest.approx(0.3)
    unseen = estimator.split(
        0.5, [Present(None, 1.0, Evidence(Kind.IDLE), unseen=True), Present("b", 1.0, figure(0.2))]
    )
    assert unseen.unattributed["unseen"] == pytest.approx(0.3)


# What the ledger makes of listings and samples.


def test_a_sample_after_a_gap_stands_back_to_the_one_before_it_surely_only_for_its_own_period() -> None:
    # An inference server that ran at 0.5 until 2 s, then kept its context idle: no new sample.
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A), seen(2, B)])
    ledger.sampled(book, [*samples(1, 2_000, 2_000, 0.5), *samples(2, 2_000, 2_000, 0.4)], 2_100 * MS)
    ledger.sampled(book, samples(2, 4_000, 4_000, 0.4), 4_100 * MS)
    ledger.sampled(book, samples(2, 6_000, 6_000, 0.4), 6_100 * MS)
    ledger.listed(book, 6_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, [*periods(0, 2_000, 0.9), *periods(2_000, 6_000, 0.4)], 7_100 * MS)
    # Settled only to its sample of 2 s: a next one may yet stand back to it (collect/settling.py `awaited`).
    assert window.seconds == pytest.approx(2.0)
    assert window.ran[(1, 1)].sm == pytest.approx(0.5 * 2.0)
    assert window.ran[(2, 1)].sm == pytest.approx(0.4 * 2.0)
    for at in range(8_000, 14_001, 2_000):
        ledger.sampled(book, samples(2, at, at, 0.4), (at + 100) * MS)
    # When it runs again (from 14 s), its first new sample stands back to its sample of 2 s
    # (no further than its figure's window, 14.2 s): the recorded driver may stamp a process
    # that runs seconds apart, so when in there it ran no sample says.
    again = UtilizationSample(1, 16_000 * MS, ProcessUse(nvml(0.5, (0, 2_000), (14_000, 16_000), at_ms=16_000)))
    ledger.sampled(book, [again, *samples(2, 16_000, 16_000, 0.4)], 16_100 * MS)
    # Surely only for its own period: it comes back from a gap.
    track = book.lives[(1, 1)].samples
    at = track.stamps.index(16_000 * MS)
    assert (track.since[at], track.sure[at]) == (2_000 * MS, 16_000 * MS - ledger.PERIOD_US)
    ledger.listed(book, 16_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, [*periods(4_000, 14_000, 0.4), *periods(14_000, 16_000, 0.9)], 19_100 * MS)
    # What it ran since is known, not when: placed where the GPU ran more than the sure
    # figures (`estimator.rebalance`), which is where it ran; its idle seconds stay idle.
    assert window.ran[(1, 1)].sm == pytest.approx(0.5 * 2.0, rel=0.05)
    assert window.ran[(2, 1)].sm == pytest.approx(0.4 * 14.0, rel=0.01)


def test_a_time_sliced_process_that_waits_seconds_for_a_sample_has_its_periods_wait_for_it() -> None:
    # The recorded driver gives about one new sample a period on a GPU (docs/nvml-sampling.md):
    # a process time-sliced beside a busy one went up to 3 s without one while it ran every
    # period. The periods after its newest sample wait for its next (they do not settle as
    # idle); it comes back from a gap, its work placed where the GPU ran more than the others.
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A), seen(2, B)])
    ledger.sampled(book, [*samples(1, 2_000, 2_000, 0.3), *samples(2, 2_000, 2_000, 0.7)], 2_100 * MS)
    ledger.sampled(book, samples(2, 4_000, 4_000, 0.7), 4_100 * MS)
    ledger.listed(book, 4_000 * MS, [seen(1, A), seen(2, B)])
    early = ledger.close(book, periods(0, 4_000, 1.0), 6_000 * MS)
    # At 6 s, 3 s would have settled; process 1's newest sample, of 2 s, holds them there.
    assert early.seconds == pytest.approx(2.0)
    later = UtilizationSample(1, 5_400 * MS, ProcessUse(nvml(0.3, (0, 5_400), at_ms=5_400)))
    ledger.sampled(book, [later, *samples(2, 6_000, 6_000, 0.7)], 6_100 * MS)
    track = book.lives[(1, 1)].samples
    at = track.stamps.index(5_400 * MS)
    # It stands back to its sample of 2 s, surely only for its own period.
    assert (track.since[at], track.sure[at]) == (2_000 * MS, 5_400 * MS - ledger.PERIOD_US)
    ledger.listed(book, 6_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, periods(4_000, 6_000, 1.0), 9_100 * MS)
    # Billed what it ran, at most; the busy one what it ran, up to the 5.4 s where the settling
    # waits, and `SLACK` over it where it was alone with a figure.
    ran_1 = early.ran[(1, 1)].sm + window.ran[(1, 1)].sm
    assert 0.3 * 5.4 * 0.98 <= ran_1 <= 0.3 * 5.4 + 1e-9
    ran_2 = early.ran[(2, 1)].sm + window.ran[(2, 1)].sm
    assert 0.7 * 5.4 - 1e-9 <= ran_2 <= 0.7 * 5.4 * (1 + estimator.SLACK)
    # One that had no sample for longer than WAIT_US (an idle context) holds nothing back.
    idle = ledger.GpuLedger()
    ledger.listed(idle, 0, [seen(1, A), seen(2, B)])
    ledger.sampled(idle, [*samples(1, 200, 200, 0.3), *samples(2, 200, 200, 0.7)], 300 * MS)
    assert estimator.WAIT_US < 16_300 * MS
    ledger.sampled(idle, samples(2, 16_400, 16_400, 0.7), 16_500 * MS)
    settled = ledger.close(idle, periods(0, 16_400, 0.7), 16_500 * MS)
    assert settled.seconds == pytest.approx(13.4)  # to `SETTLE_US` before the close


def test_periods_settle_only_once_the_driver_has_stamped_their_samples() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    ledger.sampled(book, samples(1, 200, 4_000, 0.5), 4_000 * MS)
    window = ledger.close(book, periods(0, 4_000, 0.5), 4_000 * MS)
    assert window.seconds == pytest.approx((4_000 * MS - estimator.SETTLE_US) / 1e6)
    # The rest settles at the next close, with the periods read since.
    ledger.sampled(book, samples(1, 4_200, 8_000, 0.5), 8_000 * MS)
    window = ledger.close(book, periods(3_000, 8_000, 0.5), 8_000 * MS)
    assert window.seconds == pytest.approx(4.0)
    assert window.ran[(1, 1)].sm == pytest.approx(0.5 * 4.0)


def test_a_process_between_two_listings_is_billed_from_halfway_to_halfway() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, B)])
    ledger.listed(book, 400 * MS, [seen(1, B), seen(2, A)])  # 2 appears: since 200 ms
    ledger.sampled(book, [*samples(1, 200, 1_200, 0.2), *samples(2, 400, 800, 0.3)], 800 * MS)
    ledger.listed(book, 1_200 * MS, [seen(1, B)])  # and goes: until 800 ms (its last sample's stamp)
    ledger.sampled(book, samples(1, 1_000, 1_200, 0.2), 1_200 * MS)
    assert book.lives[(2, 1)].since_us == 200 * MS
    window = ledger.close(book, periods(0, 1_200, 0.5))
    assert window.ran[(2, 1)].sm == pytest.approx(0.3 * 0.6)
    assert window.ran[(1, 1)].sm == pytest.approx(0.2 * 0.6 + 0.2 * 1.05 * 0.6)


def test_a_pod_with_a_process_of_unknown_use_has_no_share_and_what_its_others_ran_is_mps() -> None:
    # A tenant's own MPS server in its pod, serving a client of its own and one of another pod:
    # the server's sample holds both clients' work, and neither pod may keep it off every series.
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A), seen(2, A), seen(3, B)])
    ledger.sampled(book, samples(1, 200, 1_000, 0.6), 1_000 * MS)
    ledger.unknown(book, frozenset({2, 3}))
    window = ledger.close(book, periods(0, 1_000, 0.6))
    assert window.ran[(1, 1)].sm == 0.0
    assert window.unattributed["mps"] == pytest.approx(0.6)


def test_a_pid_taken_by_a_new_process_keeps_the_old_ones_sample_and_counts_the_refusal() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [ledger.Seen(7, 1, 0, A)])
    # At 1 s another process (born at 900 ms) holds PID 7; the sample of 850 ms is the first's.
    ledger.listed(book, 1_000 * MS, [ledger.Seen(7, 2, 900 * MS, B)])
    refused = ledger.sampled(book, [UtilizationSample(7, 850 * MS, ProcessUse(nvml(0.5, (0, 850), at_ms=850)))])
    assert refused == {7}
    first, second = book.lives[(7, 1)], book.lives[(7, 2)]
    assert [use.sm for use in first.samples.uses] == [pytest.approx(0.5)] and not second.samples
    _, ended = ledger.means(ledger.close(book, periods(0, 1_000, 0.5)))
    assert set(ended) == {A}


def test_a_process_no_listing_saw_is_unseen_and_never_its_neighbours() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    ledger.sampled(book, samples(1, 200, 2_000, 0.3), 2_000 * MS)
    ledger.listed(book, 2_000 * MS, [seen(1, A)])
    # A process of some pod ran 0.6 s to 1.6 s between the two listings, at 0.5.
    ledger.accounted(book, [record(7, 600, 1_600, 0.5), record(8, 0, 0, 0.9, running=True)])
    window = ledger.close(book, periods(0, 2_000, 0.8))
    assert window.ran[(1, 1)].sm == pytest.approx(0.3 * 1.0 + 0.3 * 1.05 * 1.0)
    assert window.unattributed["unseen"] == pytest.approx(0.5 * 1.0)
    pods = window.ran[(1, 1)].sm
    assert pods + sum(window.unattributed.values()) == pytest.approx(window.gpu_busy)
    assert (8, None) not in book.lives  # running: its samples serve


def test_a_record_of_a_process_the_looks_saw_changes_nothing_of_its_bill() -> None:
    def bill(records: list[AccountingRecord]) -> dict[ledger.LifeKey, float]:
        book = ledger.GpuLedger()
        ledger.listed(book, 0, [seen(1, A)])
        ledger.listed(book, 400 * MS, [seen(1, A), seen(2, B)])
        ledger.sampled(book, [*samples(1, 200, 2_000, 0.3), *samples(2, 400, 1_000, 0.6)], 1_000 * MS)
        ledger.listed(book, 1_800 * MS, [seen(1, A)])
        ledger.accounted(book, records)
        return {key: ran.sm for key, ran in ledger.close(book, periods(0, 2_000, 0.9)).ran.items()}

    assert bill([record(2, 150, 1_150, 0.02)]) == bill([])


def test_a_process_back_from_a_gap_is_given_its_gap_where_it_ran_nearest_its_sample_first() -> None:
    # A server idle, then running 0.3 in the last 4 of 10 periods before its sample, which reads
    # 0.12 over all 10 (0.3 x 4 / 10). Beside it a trainer whose figure reads 0.5 throughout, on
    # a GPU that ran 0.5 in the first 6 and 0.8 in the last 4: the gap's work goes to the periods
    # the GPU ran more in, latest first, never to the idle ones, and no more than the claim.
    gap = estimator.Evidence(Kind.FIGURE, 0.12, 0, 0.12, 0.12, sure=False, stamp=10, gap=0.12 * 10)
    trainer = figure(0.5)
    gpu = [0.5] * 6 + [0.8] * 4
    periods = []
    for busy in gpu:
        result = estimator.split(busy, [Present("t", 1.0, trainer), Present("s", 1.0, gap)], tails=False)
        periods.append((["t", "s"], [trainer, gap], [1.0, 1.0], list(result.shares), dict(result.unattributed)))
    # The gap settles over two sweeps: what the first leaves of the claim, the second may give.
    claims: dict[tuple[object, int], float] = {}
    estimator.rebalance(periods[:7], claims)
    estimator.rebalance(periods[7:], claims)
    server = [shares[1] for _, _, _, shares, _ in periods]
    assert server[:6] == pytest.approx([0.0] * 6, abs=1e-9)
    assert server[6:] == pytest.approx([0.3] * 4)
    assert sum(left["unexplained"] for *_, left in periods) == pytest.approx(0.0, abs=1e-9)
    assert claims[("s", 10)] == pytest.approx(0.0, abs=1e-9)


def test_periods_held_for_a_process_s_next_sample_are_kept_across_a_long_sweep_interval() -> None:
    # Sweeps 20 s apart (`--sweep-interval 20`): each reads the GPU's 71 newest periods (NVML's
    # buffer, 14.2 s), and the periods held for a process's next sample (up to BACK_US) wait
    # beside them. None may be dropped unsettled: the GPU's busy seconds would be in no counter.
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A), seen(2, B)])
    ledger.sampled(book, [*samples(1, 11_000, 11_000, 0.3), *samples(2, 20_000, 20_000, 0.7)], 20_100 * MS)
    ledger.listed(book, 20_000 * MS, [seen(1, A), seen(2, B)])
    first = ledger.close(book, periods(5_800, 20_000, 1.0), 20_100 * MS)
    assert first.seconds == pytest.approx(11.0 - 5.8)  # held at process 1's sample of 11 s
    ledger.sampled(book, [*samples(1, 40_000, 40_000, 0.3), *samples(2, 40_000, 40_000, 0.7)], 40_100 * MS)
    ledger.listed(book, 40_000 * MS, [seen(1, A), seen(2, B)])
    second = ledger.close(book, periods(25_800, 40_000, 1.0), 50_000 * MS)
    assert second.seconds == pytest.approx((20.0 - 11.0) + (40.0 - 25.8))


def test_what_a_process_of_no_pod_takes_back_from_a_gap_is_counted_as_no_pod_s() -> None:
    # A process of no pod's share, back from a gap, takes what it ran there from what is
    # unexplained (`estimator.rebalance`): that is no pod's too, or the pods' shares and the
    # unattributed reasons fall short of what the GPU ran.
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, None), seen(2, A)])
    ledger.sampled(book, [*samples(1, 2_000, 2_000, 0.3), *samples(2, 2_000, 2_000, 0.3)], 2_100 * MS)
    windows = []
    for at in range(4_000, 30_001, 2_000):
        taken = samples(2, at, at, 0.3)
        if at == 20_000:  # it ran 1 s at 1.0 just before this sample, after 17 s idle
            taken.append(UtilizationSample(1, at * MS, ProcessUse(nvml(1.0, (0, 2_000), (19_000, 20_000), at_ms=at))))
        ledger.sampled(book, taken, (at + 100) * MS)
        ledger.listed(book, at * MS, [seen(1, None), seen(2, A)])
        gpu = [*periods(at - 2_000, at - 1_000, 0.3), *periods(at - 1_000, at, 1.0 if at == 20_000 else 0.3)]
        windows.append(ledger.close(book, gpu, (at + 100) * MS))
    windows.append(ledger.close(book, [], None))
    busy = sum(window.gpu_busy for window in windows)
    pods = sum(use.sm for w in windows for key, use in w.ran.items() if w.lives[key].owner is not None)
    unattributed = sum(sum(window.unattributed.values()) for window in windows)
    no_pod = sum(window.unattributed["no_pod"] for window in windows)
    assert busy == pytest.approx(0.3 * 28 + 0.7 * 1.0)
    assert pods + unattributed == pytest.approx(busy, abs=1e-9)
    assert no_pod > 0.5  # what it ran over its gap


def test_a_process_back_from_a_gap_takes_a_swinging_neighbour_s_crest_only_where_the_gpu_ran_more() -> None:
    # "a" stands surely at 0.6, its own samples around reading as low as 0.45 (a crest); "b"
    # comes back from a gap at 0.4 (its sample stands for this period unsurely).
    crest = Evidence(Kind.FIGURE, 0.6, 0, 0.6, 0.45, stamp=1)
    back = Evidence(Kind.FIGURE, 0.4, 0, 0.4, 0.4, sure=False, stamp=2, gap=0.4)
    present = [Present("a", 1.0, crest), Present("b", 1.0, back)]

    def rebalanced(gpu: float) -> tuple[list[float], dict[str, float]]:
        split = estimator.split(gpu, present, tails=False)
        shares, left = list(split.shares), dict(split.unattributed)
        estimator.rebalance([(["a", "b"], [crest, back], [1.0, 1.0], shares, left)])
        assert sum(shares) + sum(left.values()) == pytest.approx(gpu)
        return shares, left

    # The GPU ran 0.9: 0.3 beyond the sure figure, so someone beside "a" ran; "b" has its 0.4,
    # "a" gives way down to 0.5, within its own lowest reading.
    shares, left = rebalanced(0.9)
    assert shares == pytest.approx([0.5, 0.4])
    assert left["unexplained"] == pytest.approx(0.0)
    # The GPU ran 0.62: the sure figure explains it within its own error. A rate is no
    # evidence that "b" ran here (a bursty process's rate spreads over its idle periods):
    # "a" keeps its figure, "b" has what is left.
    shares, _ = rebalanced(0.62)
    assert shares == pytest.approx([0.6, 0.02])


def test_every_window_conserves_the_gpus_busy_time_whatever_the_samples() -> None:
    # Lives of two pods and of none, sampled at random (seconds apart, as the recorded driver
    # stamps them, or every read), some ending: at every close, the pods' SM seconds and every
    # unattributed reason add up to the GPU's, and none is negative, through the split, the
    # gaps' placement and the giving way of `rebalance`, and the tails.
    for seed in range(40):
        draw = random.Random(seed)
        book = ledger.GpuLedger()
        owners = [draw.choice([A, B, None]) for _ in range(draw.randint(1, 5))]
        ends = [draw.choice([None, draw.randint(5_000, 40_000)]) for _ in owners]
        for read_ms in range(2_000, 46_001, 2_000):
            alive = [pid for pid, end in enumerate(ends, 1) if end is None or end > read_ms]
            ledger.listed(book, read_ms * MS, [seen(pid, owners[pid - 1]) for pid in alive])
            fresh = [
                UtilizationSample(pid, (read_ms - draw.randint(0, 9) * 200) * MS, ProcessUse(draw.random() * 0.8))
                for pid in alive
                if draw.random() < 0.5
            ]
            ledger.sampled(book, fresh, (read_ms + 100) * MS)
            gpu = [((read_ms - 2_000 + k) * MS, draw.random()) for k in range(200, 2_001, 200)]
            window = ledger.close(book, gpu, (read_ms + 100) * MS)
            pods = sum(
                use.sm for key, use in window.ran.items() if (life := window.lives.get(key)) and life.owner is not None
            )
            assert all(value >= -1e-9 for value in window.unattributed.values()), (seed, read_ms)
            assert all(use.sm >= -1e-9 for use in window.ran.values()), (seed, read_ms)
            assert pods + sum(window.unattributed.values()) == pytest.approx(window.gpu_busy, abs=1e-9), (seed, read_ms)


def test_what_a_process_back_from_a_gap_ran_comes_before_a_swinging_neighbour_s_peak() -> None:
    # "a" stands surely at 0.4, its own samples around reading up to 0.6; "b" comes back from a
    # gap, claiming 0.3 of this period. The GPU ran 0.64: "b"'s sure work first, then "a"'s
    # peak may take what is left (none), never the other way round (its peak first, "a" read
    # 0.6 and "b" had 0.04).
    swinging = Evidence(Kind.FIGURE, 0.4, 0, 0.6, 0.4, stamp=1)
    back = Evidence(Kind.FIGURE, 0.3, 0, 0.3, 0.3, sure=False, stamp=2, gap=0.3)
    present = [Present("a", 1.0, swinging), Present("b", 1.0, back)]
    split = estimator.split(0.64, present, tails=False)
    shares, left = list(split.shares), dict(split.unattributed)
    estimator.rebalance([(["a", "b"], [swinging, back], [1.0, 1.0], shares, left)])
    estimator.give_tails(present, shares, left)
    assert shares == pytest.approx([0.4, 0.24])
    assert sum(shares) + sum(left.values()) == pytest.approx(0.64)
    # With more room than the gap's claim, the peak has the rest, up to its reading.
    split = estimator.split(0.9, present, tails=False)
    shares, left = list(split.shares), dict(split.unattributed)
    estimator.rebalance([(["a", "b"], [swinging, back], [1.0, 1.0], shares, left)])
    estimator.give_tails(present, shares, left)
    assert shares == pytest.approx([0.6, 0.3])


def test_a_bursty_process_s_figures_claim_what_it_ran_and_no_more() -> None:
    # 1 s at 0.5 every 10 s, stamped once a burst (at its end, as the recorded driver may), read
    # at sweeps every 2 s: what its samples claim over their spans adds up to what it ran. Its
    # history holds each burst's work as run after the read before: spread evenly back over the
    # 10 s since its sample before, each figure's lag read high and the next figure's increment,
    # never below 0, ratcheted up (a tenant's unexplained work then went to it).
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    bursts = [(at - 1_000, at) for at in range(10_300, 120_000, 10_000)]
    ends = {end: end for _, end in bursts}
    for read in range(2_000, 122_001, 2_000):
        stamped = [end for end in ends if read - 2_000 < end <= read - 400]
        fresh = []
        for end in stamped:
            figure = nvml(0.5, *bursts, at_ms=end) + trailing.FLOORED
            fresh.append(UtilizationSample(1, end * MS, ProcessUse(math.floor(figure * 100 + 1e-9) / 100)))
        ledger.sampled(book, fresh, read * MS)
    track = book.lives[(1, 1)].samples
    assert len(track) == len(bursts)
    spans = zip(track.stamps, track.uses, track.since, strict=True)
    claimed = sum(use.sm * (stamp - since) / 1e6 for stamp, use, since in spans)
    assert claimed == pytest.approx(0.5 * len(bursts), rel=0.1), claimed


def test_a_batch_s_first_sample_after_a_short_last_span_is_no_stand_in_for_it() -> None:
    # A server at 0.6 in batches of 10 s every 30 s, read at sweeps every 2 s; the last two
    # samples of a batch 0.2 s apart. The next batch's first sample comes back from a gap: it
    # stood in for the last one (a span under MIN_SPAN_US), stood back to the one before and its
    # history spread the batch's first second over the whole window, and each later sample of
    # the batch read that into its lag and claimed it again (0.664 a second for 0.6).
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    batches = [(0, 10_000), (30_000, 40_000)]
    stamps = [2_000, 4_000, 6_000, 8_000, 9_800, 10_000, 31_400, 32_800, 35_600, 38_400, 40_000]
    for read in range(100, 42_001, 2_000):
        fresh = [
            UtilizationSample(1, at * MS, ProcessUse(nvml(0.6, *batches, at_ms=at)))
            for at in stamps
            if read - 2_000 < at <= read - 100
        ]
        ledger.sampled(book, fresh, read * MS)
    track = book.lives[(1, 1)].samples
    batch = [at for at, stamp in enumerate(track.stamps) if stamp > 31_400 * MS]
    claimed = sum(track.uses[at].sm * (track.stamps[at] - track.since[at]) / 1e6 for at in batch)
    assert claimed == pytest.approx(0.6 * (40.0 - 31.4), rel=0.02), claimed


def test_a_sample_back_from_a_gap_is_no_reading_of_how_low_a_figure_runs() -> None:
    # Its figure is its mean over the gap (idle seconds and all), not a rate it ran at: read as
    # one, a bursty process's figure gave way to a steady neighbour's around each burst.
    samples = estimator.Track()
    samples.append(10_000 * MS, ProcessUse(0.03), 0.0, 9_800 * MS)
    samples.append(11_000 * MS, ProcessUse(0.6), 10_000 * MS, 10_000 * MS)
    samples.append(12_000 * MS, ProcessUse(0.6), 11_000 * MS, 11_000 * MS)
    said = estimator.evidence_at(samples, 10_800 * MS, 11_000 * MS, None)
    assert (said.value, said.lowest, said.peak) == (0.6, 0.6, 0.6)


def test_a_sample_that_reads_0_everywhere_stands_only_where_the_gpu_ran_more_than_the_sure_figures() -> None:
    # NVML gives a sample only for a process with a use in its period (nvml.h), and every period
    # to a young context before its first kernel (the recordings), every figure 0: under a whole
    # percent of the window, or nothing. It may have run half a percent on average, only where the
    # GPU ran more than the sure figures: twenty of a tenant's processes pulsing under 1 % each
    # were read as nothing, and a bursty neighbour's gaps took their work.
    _, use = trailing.unwound([], 20_000 * MS, ProcessUse(0.0), from_us=-math.inf) or ([], None)
    assert use is not None and use.sm == pytest.approx(trailing.FLOORED)
    _, decoding = trailing.unwound([], 20_000 * MS, ProcessUse(0.0, decoder=0.02), from_us=-math.inf) or ([], None)
    assert decoding is not None and decoding.sm == 0.0

    def bill(gpu: float) -> float:
        book = ledger.GpuLedger()
        ledger.listed(book, 0, [seen(1, A), seen(2, B)])
        for at in range(2_000, 20_001, 2_000):
            young = [UtilizationSample(2, t * MS, ProcessUse(0.0)) for t in range(at - 1_800, at + 1, 200)]
            ledger.sampled(book, [*samples(1, at, at, 0.4), young[-1]], (at + 100) * MS)
        window = ledger.close(book, periods(0, 20_000, gpu), 20_100 * MS)
        return window.ran[(2, 1)].sm if (2, 1) in window.ran else 0.0

    # Beside a steady pod whose figure is all the GPU ran: nothing.
    assert bill(0.4) == pytest.approx(0.0, abs=1e-9)
    # Where the GPU ran more: what a figure of 0 holds, half a percent of each window, at most.
    assert 1e-9 < bill(0.6) <= 2 * trailing.FLOORED * trailing.WINDOW_US / 1e6


@pytest.mark.parametrize("late_ms", [estimator.BACK_US // MS, estimator.BACK_US // MS + 600])
def test_a_first_sample_stamped_before_the_read_before_stands_for_its_own_period(late_ms: int) -> None:
    # A process listed at one read whose first sample, stamped BACK_US or more before that read,
    # NVML shows only at the next (the driver's tick gave the period to it while a neighbour's
    # sample was the one shown): it stood back to the read before less BACK_US, after its own
    # stamp, over no time or less than none, and the sweep failed dividing by it (a simulated
    # driver with a 97 ms rhythm: every figure of the GPU lost from then on, 37.9 busy-s).
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    ledger.sampled(book, [], 10_000 * MS)
    stamp = (10_000 - late_ms) * MS
    ledger.sampled(book, [UtilizationSample(1, stamp, ProcessUse(0.3))], 12_000 * MS)
    track = book.lives[(1, 1)].samples
    assert list(track.stamps) == [stamp]
    assert track.since[0] <= stamp - ledger.PERIOD_US
    assert track.uses[0].sm > 0
