"""The bill, evaluated: every attack at every phase offset and seed, and ordinary workloads,
on the simulated node, each pod's billed over what it ran (testkit/bill_runs.py), worst and
median; and the SM the bill left in no series (the largest gap, at any sweep, between the GPU's
SM-busy seconds and its pods' plus every unattributed reason).

    .venv/bin/python bench/bill_evaluation.py [--seeds 3] [--offsets 10] [--out FILE] [--every-process-a-period]
        [--cases NAME ...] [--rhythm-ms MS]

`--rhythm-ms 100`: the processes keep their kernels to a 100 ms rhythm, and a period's sample
goes to the one on the GPU at the tick (else the last that was), credited with the GPU's whole
period, as the recorded driver does (docs/scenario.md, driver.rhythm_ms): each seed is then
another phase, and a rhythm that divides the 200 ms period keeps one process taking every
sample (docs/nvml-sampling.md).

`--tree DIR` runs another checkout's agent (a folder holding only its otel_vgpu/: a testkit/ there
would be taken for this checkout's) on this checkout's simulated node
and harness: how bench/results/bill-evaluation.md's "before" column was made, from a worktree
of the commit before the estimator (docs/development.md says how).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The goals (issue 55): the victim at most 1.05 of what it ran, the tenant at least 0.90;
# ordinary workloads on a GPU that is not saturated within 5 %.
VICTIM_MOST, TENANT_LEAST, ORDINARY = 1.05, 0.90, 0.05


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    """attack: a tenant against a victim; ordinary: every pod held to what it ran."""
    phased: bool
    """Its tenant's phase moves with the offset."""


def cases() -> dict[str, Case]:
    from testkit.bill_runs import CASES  # noqa: PLC0415

    return {name: Case(name, kind, True) for name, kind in CASES.items()}


def one(
    args: tuple[str, float, int, bool, float],
) -> tuple[str, float, int, dict[str, float], float, dict[str, float]]:
    name, offset, seed, every_process, rhythm_ms = args
    from testkit.bill_runs import ATTACKER, THIRD, VICTIM, case, run  # noqa: PLC0415

    text, seconds = case(name, offset)
    # Each seed its own sweeps' jitter and the driver's own draws of which process a period's
    # sample goes to (drawn alike for every seed before 2026-12-07, afternoon).
    text += (
        f"driver: {{one_sample_a_period: {'false' if every_process else 'true'}, draw_seed: {seed}, "
        f"rhythm_ms: {rhythm_ms:g}}}\n"
    )
    bill = run(None, text, seed=seed, seconds=seconds)
    ratios = {}
    for role, uid in (("victim", VICTIM), ("tenant", ATTACKER), ("third", THIRD)):
        if bill.ran.get(uid, 0.0) > 0.5:
            ratios[role] = bill.pods.get(uid, 0.0) / bill.ran[uid]
    if name == "shorter-than-a-look":
        # No look sees its processes: its work can be no pod's; it must be in the unattributed.
        ratios["tenant"] = (bill.pods.get(ATTACKER, 0.0) + bill.unattributed_sm.get("unexplained", 0.0)) / bill.ran[
            ATTACKER
        ]
    if name == "own-mps-two-pods":
        # The tenant's two pods' SM is the GPU's `mps` unattributed: shown, not billed.
        hidden = bill.ran[ATTACKER] + bill.ran[THIRD]
        ratios["tenant"] = (
            bill.pods.get(ATTACKER, 0.0) + bill.pods.get(THIRD, 0.0) + bill.unattributed_sm.get("mps", 0.0)
        ) / hidden
        ratios.pop("third", None)
    return name, offset, seed, ratios, bill.imbalance, dict(bill.unattributed_sm)


def evaluate(
    seeds: int,
    offsets: int,
    processes: int,
    every_process: bool = False,
    only: list[str] | None = None,
    rhythm_ms: float = 0.0,
) -> list[tuple[str, float, int, dict[str, float], float, dict[str, float]]]:
    jobs = [
        (name, round(2.0 * k / offsets, 3), seed, every_process, rhythm_ms)
        for name in only or cases()
        for k in range(offsets)
        for seed in range(1, seeds + 1)
    ]
    with multiprocessing.get_context("spawn").Pool(processes, initializer=_path, initargs=(sys.path,)) as pool:
        return pool.map(one, jobs, chunksize=1)


def _path(path: list[str]) -> None:
    sys.path[:] = path
    logging.disable(logging.WARNING)  # the agent's refusals, once a run: the table says what matters


def table(results: list[tuple[str, float, int, dict[str, float], float, dict[str, float]]]) -> str:
    lines = [
        "| case | kind | runs | victim: worst, median | tenant: worst, median "
        "| SM in no series (busy-s, worst) | goal met |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, case in cases().items():
        mine = [r for r in results if r[0] == name]
        if not mine:
            continue  # not asked for (--cases)
        victims = [r[3]["victim"] for r in mine if "victim" in r[3]]
        tenants = [r[3]["tenant"] for r in mine if "tenant" in r[3]]
        lost = max(r[4] for r in mine)
        if case.kind in ("attack", "unseen"):
            met = (not victims or max(victims) <= VICTIM_MOST) and (not tenants or min(tenants) >= TENANT_LEAST)
            v = f"{max(victims):.3f}, {statistics.median(victims):.3f}" if victims else "-"
            t = f"{min(tenants):.3f}, {statistics.median(tenants):.3f}" if tenants else "-"
        else:
            both = victims + tenants
            met = case.kind != "ordinary" or all(abs(x - 1) <= ORDINARY for x in both)
            v = f"{max(victims, key=lambda x: abs(x - 1)):.3f}, {statistics.median(victims):.3f}" if victims else "-"
            t = f"{max(tenants, key=lambda x: abs(x - 1)):.3f}, {statistics.median(tenants):.3f}" if tenants else "-"
        met = met and lost <= 1e-6
        lines.append(f"| {name} | {case.kind} | {len(mine)} | {v} | {t} | {lost:.3g} | {'yes' if met else '**no**'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--offsets", type=int, default=10)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--tree", type=Path, help="another checkout whose otel_vgpu/ runs (the 'before')")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cases", nargs="+", metavar="NAME", help="only these cases (default: every one)")
    parser.add_argument(
        "--every-process-a-period",
        action="store_true",
        help="a new sample for every process that ran in each period, not the recorded cadence "
        "(docs/scenario.md, driver.one_sample_a_period: false)",
    )
    parser.add_argument(
        "--rhythm-ms",
        type=float,
        default=0.0,
        help="the processes' kernels keep this rhythm and the tick's process takes the sample (driver.rhythm_ms)",
    )
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT)] if args.tree is None else [str(args.tree.resolve()), str(ROOT)]
    if args.tree is not None:
        # This checkout's simulated node and harness, the other's agent.
        import otel_vgpu  # noqa: PLC0415

        assert Path(otel_vgpu.__file__).resolve().is_relative_to(args.tree.resolve()), otel_vgpu.__file__
    if unknown := set(args.cases or ()) - set(cases()):
        parser.error(f"--cases: no case {', '.join(sorted(unknown))}; the cases: {', '.join(cases())}")
    began = time.monotonic()
    results = evaluate(
        args.seeds, args.offsets, args.processes, args.every_process_a_period, args.cases, args.rhythm_ms
    )
    report = table(results)
    print(report, end="")
    print(f"{len(results)} runs in {time.monotonic() - began:.0f} s", file=sys.stderr)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
