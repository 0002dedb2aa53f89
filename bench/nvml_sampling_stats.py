"""What the recordings of the real driver show (tests/data/nvml-recordings): how often each
process gets a new NVML sample, what its value means against the work the process noted, how
the processes' work compares with the GPU's own busy figure, and how long NVML takes to list a
process. Pure: it reads the committed recordings, no GPU. docs/nvml-sampling.md quotes it:

    .venv/bin/python bench/nvml_sampling_stats.py [--markdown]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otel_vgpu.collect import trailing
from otel_vgpu.sim.processes import time_sliced
from testkit.recordings import Recording, Truth, every, segments, unwound_as_swept

PERIOD_US = 200_000


def work_fraction(truth: Truth, solo_s: float, start_us: float, end_us: float) -> float:
    return truth.work_s(solo_s, start_us, end_us) / ((end_us - start_us) / 1e6)


def gaps(stamps: Iterable[int]) -> list[float]:
    ordered = sorted(stamps)
    return [(b - a) / 1000 for a, b in itertools.pairwise(ordered)]


def describe(values: list[float], unit: str = "") -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{statistics.median(values):.3g}{unit} ({values[0]:.3g}-{values[-1]:.3g})"


def plan_text(plan: tuple[float, float]) -> str:
    period, on = plan
    if on >= period:
        return "busy"
    if on == 0:
        return "idle"
    return f"{on:g}/{period:g} ms"


def segment_rows(recording: Recording) -> list[list[str]]:
    """Per segment and process: its plan, the others', sample spacing, arrival delay, its
    value against its work over three windows, and the GPU's busy figure against the work of all."""
    rows = []
    for segment in segments(recording):
        device = [(s, v) for s, v in recording.device if segment.start_us < s <= segment.end_us]
        busy = statistics.fmean(v for _, v in device) if device else float("nan")
        truths = {t.pid: t for t in recording.truths}
        total_work = sum(
            work_fraction(truths[pid], recording.solo_s, segment.start_us, segment.end_us) for pid in segment.plans
        )
        for pid, plan in sorted(segment.plans.items()):
            truth = truths[pid]
            others = ", ".join(plan_text(p) for q, p in sorted(segment.plans.items()) if q != pid) or "alone"
            samples = [s for s in recording.samples_of(pid) if segment.start_us < s.stamp_us <= segment.end_us]
            spacing = gaps(s.stamp_us for s in samples)
            delay = [(s.arrived_us - s.stamp_us) / 1000 for s in samples]
            work = work_fraction(truth, recording.solo_s, segment.start_us, segment.end_us)
            value = statistics.fmean(s.sm for s in samples) if samples else 0.0
            # The value against the work over its own period, and since the sample before.
            own = []
            since_last = []
            previous = None
            for sample in sorted(recording.samples_of(pid), key=lambda s: s.stamp_us):
                if segment.start_us < sample.stamp_us <= segment.end_us:
                    own.append(work_fraction(truth, recording.solo_s, sample.stamp_us - PERIOD_US, sample.stamp_us))
                    if previous is not None:
                        since_last.append(work_fraction(truth, recording.solo_s, previous, sample.stamp_us))
                previous = sample.stamp_us
            rows.append(
                [
                    recording.name,
                    f"{(segment.start_us - recording.start_us) / 1e6:.0f}-"
                    f"{(segment.end_us - recording.start_us) / 1e6:.0f} s",
                    plan_text(plan),
                    others,
                    f"{len(samples)}",
                    describe(spacing, " ms"),
                    describe(delay, " ms"),
                    f"{value:.3f}",
                    f"{work:.3f}",
                    f"{statistics.fmean(own):.3f}" if own else "-",
                    f"{statistics.fmean(since_last):.3f}" if since_last else "-",
                    f"{busy:.3f}",
                    f"{total_work:.3f}",
                ]
            )
    return rows


def listing_rows(recording: Recording) -> list[list[str]]:
    """Per process: when NVML first and last listed it against its context, first kernel and exit."""
    rows = []
    for truth in recording.truths:
        listed = [p.at_us for p in recording.polls if truth.pid in p.listed]
        sampled = sorted(s.stamp_us for s in recording.samples_of(truth.pid))
        first_kernel = truth.bursts[0][0] if truth.bursts else None
        rows.append(
            [
                recording.name,
                truth.worker,
                f"{(truth.exit_us - truth.context_us[1]) / 1e6:.2f} s",
                f"{(listed[0] - truth.context_us[1]) / 1000:.0f} ms" if listed else "never",
                f"{(listed[0] - first_kernel) / 1000:.0f} ms" if listed and first_kernel else "-",
                f"{(listed[-1] - truth.exit_us) / 1000:.0f} ms" if listed else "-",
                f"{len(sampled)}",
                f"{(sampled[0] - first_kernel) / 1000:.0f} ms" if sampled and first_kernel else "-",
                f"{truth.work_s(recording.solo_s):.3f}",
            ]
        )
    return rows


def ran_between(history: list[trailing.Point], start_us: float, end_us: float) -> float:
    return trailing.ran_by(history, end_us)[0] - trailing.ran_by(history, start_us)[0]


def contention_rows(recording: Recording) -> list[list[str]]:
    """Per process of each stretch whose processes ask more than the GPU has (time-sliced, not
    MPS): its part of the processes' unwound figures against its part of their work, and the
    simulated driver's split of what they asked (sim/processes.py `time_sliced`)."""
    if recording.mps:
        return []
    truths = {t.pid: t for t in recording.truths}
    histories = {pid: unwound_as_swept(recording, truth) for pid, truth in truths.items()}
    rows = []
    for segment in segments(recording):
        if not segment.oversubscribed:
            continue
        asked = segment.asked
        figures = {pid: ran_between(histories[pid], segment.start_us, segment.end_us) for pid in asked}
        work = {pid: truths[pid].work_s(recording.solo_s, segment.start_us, segment.end_us) for pid in asked}
        modelled = dict(zip(asked, time_sliced(list(asked.values())), strict=True))
        for pid, plan in sorted(segment.plans.items()):
            figure_share = figures[pid] / (sum(figures.values()) or 1.0)
            work_share = work[pid] / (sum(work.values()) or 1.0)
            rows.append(
                [
                    recording.name,
                    f"{(segment.start_us - recording.start_us) / 1e6:.0f}-"
                    f"{(segment.end_us - recording.start_us) / 1e6:.0f} s",
                    plan_text(plan),
                    f"{figure_share:.3f}",
                    f"{work_share:.3f}",
                    f"{figure_share / work_share:.2f}" if work_share else "-",
                    f"{modelled[pid]:.3f}",
                    f"{asked[pid] / sum(asked.values()):.3f}",
                ]
            )
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    recordings = list(every())
    if not recordings:
        # Nothing to tabulate yet: not an error of this script's input (docs/nvml-sampling.md).
        print("no recordings in tests/data/nvml-recordings yet: bench/gpu_record_sampling.py makes them on a GPU")
        return 0
    first = recordings[0].gpu
    print(
        f"{first['name']}, driver {first['driver']}, recorded {first['recorded']}; one step alone "
        f"{first['step_solo_s'] * 1e3:.3f} ms; polled every {first['poll_ms']:g} ms\n"
    )
    seg_rows = [row for recording in recordings for row in segment_rows(recording)]
    print(table(
        ["scenario", "stretch", "process", "beside", "samples", "spacing", "seen after", "its SM value",
         "its work", "work, its 200 ms", "work since its last", "GPU busy", "all work"],
        seg_rows,
    ))  # fmt: skip
    print()
    list_rows = [row for recording in recordings for row in listing_rows(recording)]
    print(table(
        ["scenario", "process", "context lived", "listed after context", "listed after first kernel",
         "last listed after exit", "samples", "first sample after first kernel", "work (s)"],
        list_rows,
    ))  # fmt: skip
    print()
    contended = [row for recording in recordings for row in contention_rows(recording)]
    print(table(
        ["scenario", "stretch", "process", "its part of the unwound figures", "its part of the work",
         "figure over work", "time-sliced model", "in proportion to what each asked"],
        contended,
    ))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
