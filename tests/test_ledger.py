"""The ledger's rules on plain data (otel_vgpu/collect/ledger.py): whose each period of the
GPU's own samples is, given the processes the listings saw and their own figures."""

from __future__ import annotations

import pytest

from otel_vgpu.collect import ledger
from otel_vgpu.gpu.backend import AccountingRecord, ProcessUse, UtilizationSample
from otel_vgpu.pods.cgroups import PodRef

pytestmark = pytest.mark.unit

MS = 1_000
A = PodRef("aaaaaaaa-0000-4000-8000-000000000001", None)
B = PodRef("bbbbbbbb-0000-4000-8000-000000000002", None)


def periods(start_ms: int, end_ms: int, sm: float) -> list[tuple[int, float | None]]:
    """The GPU's samples, one per 200 ms period ending after `start_ms` up to `end_ms`."""
    return [(t * MS, sm) for t in range(start_ms + 200, end_ms + 1, 200)]


def seen(pid: int, owner: PodRef | None, start: int = 1) -> ledger.Seen:
    return ledger.Seen(pid, start, None, owner)


def test_a_period_one_pod_held_alone_is_that_pods_whole_whatever_its_figure() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    ledger.sampled(book, [UtilizationSample(1, 100 * MS, ProcessUse(0.1))])  # it read low
    ledger.listed(book, 1_000 * MS, [seen(1, A)])
    window = ledger.close(book, periods(0, 1_000, 0.8))
    assert window.ran[(1, 1)].sm == pytest.approx(0.8 * 1.0)
    assert window.unexplained == pytest.approx(0.0)


def test_a_process_between_two_listings_is_billed_from_halfway_to_halfway() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, B)])
    ledger.listed(book, 400 * MS, [seen(1, B), seen(2, A)])  # 2 appears: since 200 ms
    ledger.listed(book, 1_200 * MS, [seen(1, B)])  # and goes: until 800 ms
    by_key = ledger.close(book, periods(0, 1_200, 0.5)).ran
    # B's 1 alone in the first 200 ms and the last 400 ms; with A's 2 between, which has no
    # figure yet, and no period before it says what its coming added: that is no one's.
    assert by_key[(1, 1)].sm == pytest.approx(0.5 * 0.2 + 0.5 * 0.4)
    assert by_key[(2, 1)].sm == pytest.approx(0.0)


def test_what_the_figures_leave_goes_to_young_processes_only_and_never_past_their_part() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    ledger.sampled(book, [UtilizationSample(1, t * MS, ProcessUse(0.2)) for t in range(8_200, 9_801, 400)])
    ledger.listed(book, 9_800 * MS, [seen(1, A)])
    ledger.close(book, periods(7_800, 9_800, 0.2))  # A's 1 alone, at 0.2
    ledger.listed(book, 10_000 * MS, [seen(1, A), seen(2, B)])  # B's 2 from 9.9 s
    ledger.sampled(book, [UtilizationSample(1, 10_200 * MS, ProcessUse(0.2))])
    ledger.listed(book, 11_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, periods(10_000, 11_000, 0.9))
    # A's 1, listed for 10 s, keeps its figure; B's 2, young and without one, the rise its
    # coming made over the 0.2 the GPU ran for A before it.
    assert window.ran[(1, 1)].sm == pytest.approx(0.2)
    assert window.ran[(2, 1)].sm == pytest.approx(0.7)
    assert window.unexplained == pytest.approx(0.0)
    # Seven seconds on, B's 2 is no longer young: what the figures leave is no one's.
    ledger.sampled(book, [UtilizationSample(2, 17_200 * MS, ProcessUse(0.1))])
    ledger.listed(book, 18_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, periods(17_000, 18_000, 0.9))
    assert window.ran[(2, 1)].sm == pytest.approx(0.1)
    assert window.unexplained == pytest.approx(0.9 - 0.2 - 0.1)


def test_a_shared_period_is_split_by_the_figures_and_what_they_leave_is_no_ones() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A), seen(2, B)])
    ledger.sampled(
        book, [UtilizationSample(1, 200 * MS, ProcessUse(0.3)), UtilizationSample(2, 200 * MS, ProcessUse(0.2))]
    )
    ledger.listed(book, 1_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, periods(0, 1_000, 0.9))
    assert window.ran[(1, 1)].sm == pytest.approx(0.3)
    assert window.ran[(2, 1)].sm == pytest.approx(0.2)
    assert window.unexplained == pytest.approx(0.9 - 0.5)
    # Where they read more than the GPU ran, both are scaled down alike.
    ledger.sampled(
        book, [UtilizationSample(1, 1_200 * MS, ProcessUse(0.6)), UtilizationSample(2, 1_200 * MS, ProcessUse(0.6))]
    )
    ledger.listed(book, 2_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, periods(1_000, 2_000, 0.6))
    assert window.ran[(1, 1)].sm == pytest.approx(0.3) and window.ran[(2, 1)].sm == pytest.approx(0.3)


def test_a_process_of_no_pod_or_of_unknown_use_keeps_a_period_from_being_anyones_whole() -> None:
    for other, unknown in ((None, False), (A, True)):
        book = ledger.GpuLedger()
        ledger.listed(book, 0, [seen(1, A), seen(2, other)])
        ledger.sampled(book, [UtilizationSample(1, 200 * MS, ProcessUse(0.2))])
        if unknown:
            ledger.unknown(book, frozenset({2}))
        ledger.listed(book, 1_000 * MS, [seen(1, A), seen(2, other)])
        window = ledger.close(book, periods(0, 1_000, 0.9))
        assert window.ran[(1, 1)].sm == pytest.approx(0.2)
        assert window.unexplained == pytest.approx(0.7)
        assert ledger.means(window)[0].get(2, ProcessUse()).sm == 0.0


def test_a_pid_taken_by_a_new_process_keeps_the_old_ones_sample_and_counts_the_refusal() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [ledger.Seen(7, 1, 0, A)])
    # At 1 s another process (born at 900 ms) holds PID 7; the sample of 850 ms is the first's.
    ledger.listed(book, 1_000 * MS, [ledger.Seen(7, 2, 900 * MS, B)])
    refused = ledger.sampled(book, [UtilizationSample(7, 850 * MS, ProcessUse(0.5))])
    assert refused == {7}
    first, second = book.lives[(7, 1)], book.lives[(7, 2)]
    assert [use.sm for _, use in first.samples] == [0.5] and not second.samples
    _, ended = ledger.means(ledger.close(book, periods(0, 1_000, 0.5)))
    assert set(ended) == {A}


def test_a_young_process_is_held_to_the_rise_its_coming_made_beside_still_figures_only() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    for t in range(200, 2_001, 200):  # A's 1 alone for 2 s at 0.3: the GPU's level for others
        ledger.sampled(book, [UtilizationSample(1, t * MS, ProcessUse(0.3))])
    ledger.listed(book, 2_000 * MS, [seen(1, A)])
    ledger.close(book, periods(0, 2_000, 0.3))
    # B's 2 comes; the GPU reads 0.9 and A's figure holds at 0.3: the rise, 0.6, is B's.
    ledger.listed(book, 2_200 * MS, [seen(1, A), seen(2, B)])
    ledger.listed(book, 3_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, periods(2_200, 3_000, 0.9))
    assert window.ran[(1, 1)].sm == pytest.approx(0.3 * 0.8)
    assert window.ran[(2, 1)].sm == pytest.approx(0.6 * 0.8)
    # Were the GPU at 1.0 there, B would still be held to what it could have run of it,
    # and A's figure reading low leaves the rest to no one: B's share is the rise, 0.7.
    ledger.listed(book, 3_800 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, periods(3_000, 3_800, 1.0))
    assert window.ran[(2, 1)].sm == pytest.approx(0.7 * 0.8)


def test_beside_a_figure_that_swings_a_young_process_is_given_only_its_own() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    for t, sm in zip(range(200, 2_001, 200), [0.1, 0.9] * 5, strict=True):
        ledger.sampled(book, [UtilizationSample(1, t * MS, ProcessUse(sm))])
    ledger.listed(book, 2_000 * MS, [seen(1, A)])
    ledger.close(book, periods(0, 2_000, 0.5))
    ledger.listed(book, 2_200 * MS, [seen(1, A), seen(2, B)])
    ledger.sampled(book, [UtilizationSample(2, 2_400 * MS, ProcessUse(0.2))])
    ledger.listed(book, 3_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, periods(2_200, 3_000, 1.0))
    # A's figure (its last, 0.9, swinging) and B's own 0.2 fitted under the GPU's 1.0: B is
    # given its figure, never what A's may have read low.
    assert window.ran[(2, 1)].sm == pytest.approx(0.2 * 0.8 * (1.0 / 1.1))


def young_beside_a_risen_figure(a_figures: list[float]) -> ledger.Window:
    """A's 1 settled alone at 0.3 for 2 s, then B's 2 comes, young, reading 0.1, while A's 1
    reads `a_figures` (one a period), the GPU 1.0."""
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    for t in range(200, 2_001, 200):
        ledger.sampled(book, [UtilizationSample(1, t * MS, ProcessUse(0.3))])
    ledger.listed(book, 2_000 * MS, [seen(1, A)])
    ledger.close(book, periods(0, 2_000, 0.3))
    ledger.listed(book, 2_200 * MS, [seen(1, A), seen(2, B)])
    for k, sm in enumerate(a_figures):
        ledger.sampled(book, [UtilizationSample(1, (2_400 + 200 * k) * MS, ProcessUse(sm))])
    ledger.sampled(book, [UtilizationSample(2, 2_400 * MS, ProcessUse(0.1))])
    ledger.listed(book, 3_000 * MS, [seen(1, A), seen(2, B)])
    return ledger.close(book, periods(2_200, 3_000, 1.0))


def test_a_figure_that_rose_beside_a_young_process_leaves_it_the_rise_and_one_at_a_trough_does_not() -> None:
    # A time-sliced process's figure rises while a neighbour runs beside it, to 4.5 times the
    # work it does then (bench/results/h200-shared-samples.md). A's figure read at its crest,
    # 0.5, hides nothing below it: what the figures leave, 0.4 of each period, is the young
    # B's, up to the rise its coming made (1.0 - 0.3).
    risen = young_beside_a_risen_figure([0.5] * 4)
    assert risen.ran[(1, 1)].sm == pytest.approx(0.5 * 0.8)
    assert risen.ran[(2, 1)].sm == pytest.approx((0.1 + 0.4) * 0.8)
    # Read at a trough (0.1, below its recent 0.3), A's figure may hide A's own work: B is
    # given its own figure alone.
    trough = young_beside_a_risen_figure([0.1] * 4)
    assert trough.ran[(2, 1)].sm == pytest.approx(0.1 * 0.8)


def record(pid: int, start_ms: int, end_ms: int, sm: float, running: bool = False) -> AccountingRecord:
    """NVML's accounting of a process: `time` is 0 while it runs (nvml.h)."""
    seconds = 0.0 if running else (end_ms - start_ms) / 1_000
    return AccountingRecord(pid, start_ms * MS, seconds, running, sm, 0.0)


def test_a_record_of_a_process_the_looks_saw_changes_nothing_of_its_bill() -> None:
    # Its lifetime figure is no figure of its last window (a process that idled, then ran hard
    # before it ended, would hide its work), and nvml.h's "just like nvmlDeviceGetUtilizationRates"
    # may be the device's: the samples stand.
    def bill(records: list[AccountingRecord]) -> dict[ledger.LifeKey, float]:
        book = ledger.GpuLedger()
        ledger.listed(book, 0, [seen(1, A)])
        ledger.listed(book, 400 * MS, [seen(1, A), seen(2, B)])
        ledger.sampled(book, [UtilizationSample(1, t * MS, ProcessUse(0.3)) for t in range(200, 2_001, 200)])
        ledger.sampled(book, [UtilizationSample(2, t * MS, ProcessUse(0.6)) for t in range(400, 1_001, 200)])
        ledger.listed(book, 1_800 * MS, [seen(1, A)])
        ledger.accounted(book, records)
        return {key: ran.sm for key, ran in ledger.close(book, periods(0, 2_000, 0.9)).ran.items()}

    assert bill([record(2, 150, 1_150, 0.02)]) == bill([])
    assert bill([])[(2, 1)] == pytest.approx(0.6 * 1.0)


def test_a_process_no_listing_saw_is_unattributed_and_keeps_the_period_from_its_neighbour() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    ledger.sampled(book, [UtilizationSample(1, t * MS, ProcessUse(0.3)) for t in range(200, 2_001, 200)])
    ledger.listed(book, 2_000 * MS, [seen(1, A)])
    # A process of some pod ran 0.6 s to 1.6 s between the two listings, at 0.5.
    ledger.accounted(book, [record(7, 600, 1_600, 0.5), record(8, 0, 0, 0.9, running=True)])
    window = ledger.close(book, periods(0, 2_000, 0.8))
    # A's 1 is given its figure where the unseen one ran, the whole period elsewhere; what its
    # figure leaves beside the unseen one is counted as unseen.
    assert window.ran[(1, 1)].sm == pytest.approx(0.3 * 1.0 + 0.8 * 1.0)
    assert window.unattributed["unseen"] == pytest.approx(0.5 * 1.0)
    assert sum(window.unattributed.values()) == pytest.approx(0.8 * 2.0 - window.ran[(1, 1)].sm)
    assert (8, None) not in book.lives  # running: its samples serve


def test_what_no_pod_is_given_is_counted_by_its_reason_and_adds_up_to_the_rest() -> None:
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [])
    ledger.listed(book, 1_000 * MS, [seen(1, A), seen(2, None), seen(3, B)])
    ledger.sampled(
        book,
        [UtilizationSample(pid, t * MS, ProcessUse(0.2)) for pid in (1, 2) for t in range(1_200, 3_001, 200)],
    )
    ledger.listed(book, 2_000 * MS, [seen(1, A), seen(2, None), seen(3, B)])
    ledger.unknown(book, frozenset({3}))  # an MPS client: NVML cannot tell its use
    ledger.listed(book, 3_000 * MS, [seen(1, A), seen(2, None), seen(3, B)])
    window = ledger.close(book, periods(0, 3_000, 0.7))
    reasons = window.unattributed
    assert reasons["unexplained"] == pytest.approx(0.7 * 0.4)  # before anything was listed
    assert reasons["no_pod"] == pytest.approx(0.2 * 2.6)
    # Beside the MPS client, what the figures leave is put down to it.
    assert reasons["mps"] == pytest.approx((0.7 - 0.4) * 2.6)
    pods = sum(ran.sm for key, ran in window.ran.items() if window.lives[key].owner is not None)
    assert pods + sum(reasons.values()) == pytest.approx(window.gpu_busy)


def steady_and_swinging(book: ledger.GpuLedger, swinging_owner: PodRef, third: PodRef | None = None) -> None:
    """A's 1 at a still 0.3 and 2 whose samples swing 0.1 to 0.9, listed for 10 s; with
    `third`, a process of that pod beside them, swinging too."""
    pids = [(1, A), (2, swinging_owner)] + ([(3, third)] if third is not None else [])
    ledger.listed(book, 0, [seen(pid, owner) for pid, owner in pids])
    for t in range(200, 10_001, 200):
        swing = 0.1 if (t // 200) % 2 else 0.9
        ledger.sampled(
            book,
            [UtilizationSample(1, t * MS, ProcessUse(0.3)), UtilizationSample(2, t * MS, ProcessUse(swing))]
            + ([UtilizationSample(3, t * MS, ProcessUse(1.0 - swing))] if third is not None else []),
        )
    ledger.listed(book, 10_000 * MS, [seen(pid, owner) for pid, owner in pids])
    ledger.close(book, periods(0, 10_000, 0.8))


def test_beside_still_figures_what_the_gpu_ran_beyond_them_is_the_swinging_pods() -> None:
    book = ledger.GpuLedger()
    steady_and_swinging(book, B)
    # The next second: B's figure was sampled at a trough (0.1), the GPU ran 0.8.
    ledger.sampled(book, [UtilizationSample(pid, 11_000 * MS, ProcessUse(sm)) for pid, sm in ((1, 0.3), (2, 0.1))])
    ledger.listed(book, 11_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, periods(10_000, 11_000, 0.8))
    assert window.ran[(1, 1)].sm == pytest.approx(0.3 * 1.0)  # A's still figure, as read
    assert window.ran[(2, 1)].sm == pytest.approx(0.5 * 1.0)  # B: the rest, not its 0.1
    # Sampled at a crest (0.9): A keeps its 0.3, B is held to what is left.
    ledger.sampled(book, [UtilizationSample(pid, 12_000 * MS, ProcessUse(sm)) for pid, sm in ((1, 0.3), (2, 0.9))])
    ledger.listed(book, 12_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, periods(11_000, 12_000, 0.8))
    assert window.ran[(1, 1)].sm == pytest.approx(0.3 * 1.0)
    assert window.ran[(2, 1)].sm == pytest.approx(0.5 * 1.0)


def test_where_two_pods_figures_swing_neither_is_given_what_the_figures_leave() -> None:
    book = ledger.GpuLedger()
    other = PodRef("cccccccc-0000-4000-8000-000000000003", None)
    steady_and_swinging(book, B, third=other)
    # B at a trough, C beside it: what the figures leave (0.8 - 0.3 - 0.1 - 0.1) may be either's.
    samples = ((1, 0.3), (2, 0.1), (3, 0.1))
    ledger.sampled(book, [UtilizationSample(pid, 11_000 * MS, ProcessUse(sm)) for pid, sm in samples])
    ledger.listed(book, 11_000 * MS, [seen(1, A), seen(2, B), seen(3, other)])
    window = ledger.close(book, periods(10_000, 11_000, 0.8))
    assert window.ran[(2, 1)].sm == pytest.approx(0.1 * 1.0)
    assert window.ran[(3, 1)].sm == pytest.approx(0.1 * 1.0)
    assert window.unattributed["unexplained"] == pytest.approx(0.3 * 1.0)


def test_a_swinging_pod_is_never_given_more_than_its_own_samples_read() -> None:
    # A still figure beside it may read low (its work timed away from the samples): what the GPU
    # ran beyond the still figures goes to the swinging pod only up to the most it read itself.
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A), seen(2, B)])
    for t in range(200, 10_001, 200):
        bursty = 0.1 if (t // 200) % 2 else 0.5
        ledger.sampled(
            book, [UtilizationSample(1, t * MS, ProcessUse(0.05)), UtilizationSample(2, t * MS, ProcessUse(bursty))]
        )
    ledger.listed(book, 10_000 * MS, [seen(1, A), seen(2, B)])
    window = ledger.close(book, periods(0, 10_000, 0.95))
    assert window.ran[(2, 1)].sm <= 0.5 * 10.0 + 1e-9
    assert window.ran[(1, 1)].sm == pytest.approx(0.05 * 10.0)
    assert window.unattributed["unexplained"] == pytest.approx(
        0.95 * 10.0 - window.ran[(1, 1)].sm - window.ran[(2, 1)].sm
    )


def test_a_pod_restarting_back_to_back_keeps_its_rise_from_process_to_process() -> None:
    # Fresh processes of B read low (NVML smooths a new process's figure) beside A's still 0.3,
    # the GPU at 0.9 while B runs, 0.3 before. What B's predecessor's figure left was B's own:
    # counted as the others' level, it would hold each successor lower than the last.
    book = ledger.GpuLedger()
    ledger.listed(book, 0, [seen(1, A)])
    ledger.sampled(book, [UtilizationSample(1, t * MS, ProcessUse(0.3)) for t in range(200, 12_001, 200)])
    ledger.listed(book, 2_000 * MS, [seen(1, A)])
    ledger.close(book, periods(0, 2_000, 0.3))
    billed = []
    for k in range(5):
        start, end = 2_000 + 1_000 * k, 3_000 + 1_000 * k
        ledger.listed(book, start * MS, [seen(1, A), seen(10 + k, B, start=10 + k)])
        ledger.sampled(book, [UtilizationSample(10 + k, (start + 200) * MS, ProcessUse(0.1))])
        ledger.confirmed(book, end * MS)  # the watch's looks found nothing come or go
        ledger.listed(book, end * MS, [seen(1, A)])
        window = ledger.close(book, periods(start, end, 0.9))
        billed.append(sum(ran.sm for key, ran in window.ran.items() if key[0] == 10 + k))
    assert billed == pytest.approx([billed[0]] * 5, rel=0.02)
    assert billed[0] >= 0.5
