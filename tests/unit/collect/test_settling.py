"""When a GPU's periods settle (otel_vgpu/collect/settling.py)."""

from __future__ import annotations

import math

import pytest

from otel_vgpu.collect import estimator, ledger, settling, trailing
from otel_vgpu.gpu.backend import ProcessUse

pytestmark = pytest.mark.unit

S = 1_000_000


def track(*samples: tuple[float, float, float]) -> estimator.Track:
    """Samples (stamp, since, sure), in seconds."""
    made = estimator.Track()
    for stamp, since, sure in samples:
        made.append(round(stamp * S), ProcessUse(0.5), since * S, sure * S)
    return made


def test_periods_settle_after_the_driver_s_delay_and_while_no_sample_is_awaited() -> None:
    assert settling.cut(20 * S, [], []) == 20 * S - estimator.SETTLE_US
    # A listed process sampled 4 s ago may yet have its next: the periods after wait for it.
    assert settling.cut(20 * S, [track((16, 14, 14))], []) == 16 * S
    # One sampled longer ago than WAIT_US (an idle context) holds nothing back.
    assert settling.awaited([track((20 - estimator.WAIT_US / S - 1, 5, 5))], 20 * S) == math.inf


def test_the_periods_after_a_batch_s_last_sample_wait_as_long_as_the_next_figure_holds_them() -> None:
    # A server's last sample of a batch at 20 s, its next batch's 12 s later: that sample's figure
    # (a mean over 14.2 s, collect/trailing.py) still holds what it ran after 20 s, and stands
    # back over the gap. Settled before it came, those seconds read as idle (at 10 s, the server
    # of bench/bill_evaluation.py's trainer-checkpoints-and-server was billed 0.885).
    assert settling.awaited([track((20, 18, 18))], 32_500_000) == 20 * S
    # Past a figure's window, no figure holds what ran then: nothing is held back.
    assert settling.awaited([track((20, 18, 18))], 20 * S + trailing.WINDOW_US + S) == math.inf


def test_a_gap_settles_whole_with_its_sample_s_own_period() -> None:
    # A sample of 16 s back from a gap (it stands back to 9 s, surely only from 15.8 s): at 18 s
    # its own period does not settle yet (3 s after it), so neither does any of its gap.
    gapped = track((9, 8, 8), (16, 9, 15.8))
    assert settling.cut(18 * S, [], [gapped]) == 9 * S
    # Once its own period may settle, the whole gap does.
    assert settling.cut(20 * S, [], [gapped]) == 20 * S - estimator.SETTLE_US
    # A sample that continues the one before holds nothing back.
    assert settling.cut(18 * S, [], [track((9, 8, 8), (16, 9, 9))]) == 18 * S - estimator.SETTLE_US


def test_no_samples_hold_the_periods_back_longer_than_a_window_and_the_driver_s_delay() -> None:
    # A tenant's processes, each back from a gap that reaches into the one before (staggered):
    # only the gap whose own sample is recent holds the periods back, and no further than its
    # window. Held back in a chain, the periods would wait without end, past what the ledger
    # keeps pending (`ledger.PENDING_KEPT`), and go unbilled.
    window = trailing.WINDOW_US / S
    chained = [track((t - window, t - 20, t - 20), (t, t - window, t - 0.2)) for t in range(20, 101, 10)]
    now = 101 * S
    assert settling.cut(now, [], chained) == 100 * S - trailing.WINDOW_US
    assert now - settling.cut(now, [], chained) <= estimator.SETTLE_US + trailing.WINDOW_US
    assert (estimator.SETTLE_US + trailing.WINDOW_US) / ledger.PERIOD_US < ledger.PENDING_KEPT
    assert estimator.WAIT_US / ledger.PERIOD_US < ledger.PENDING_KEPT
