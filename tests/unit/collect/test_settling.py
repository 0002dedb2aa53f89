"""When a GPU's periods settle (otel_vgpu/collect/settling.py)."""

from __future__ import annotations

import math

import pytest

from otel_vgpu.collect import estimator, settling
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


def test_a_gap_settles_whole_with_its_sample_s_own_period() -> None:
    # A sample of 16 s back from a gap (it stands back to 9 s, surely only from 15.8 s): its own
    # period does not settle at a cut of 15 s, so neither does any of its gap.
    gapped = track((9, 8, 8), (16, 9, 15.8))
    assert settling.whole_gaps([gapped], 15 * S) == 9 * S
    # Once its own period may settle, the whole gap does.
    assert settling.whole_gaps([gapped], 17 * S) == 17 * S
    # A sample that continues the one before holds nothing back.
    assert settling.whole_gaps([track((9, 8, 8), (16, 9, 9))], 15 * S) == 15 * S
    # Held back past another's unsettled gap, that one's gap is kept whole too.
    other = track((4, 3, 3), (12, 4, 11.8))
    assert settling.whole_gaps([gapped, other], 15 * S) == 4 * S
