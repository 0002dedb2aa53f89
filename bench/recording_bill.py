"""The bill over the real driver's recordings: each recording (tests/data/nvml-recordings/, made
on an H100 with driver 580 by bench/gpu_record_sampling.py) replayed through the ledger as the
agent reads NVML, against what each pod's processes noted they ran.

    .venv/bin/python bench/recording_bill.py [--phases 8] [--tree DIR] [--out FILE]

A sweep every 2 s lists the processes NVML listed then, reads each one's newest sample shown by
then (NVML keeps a process's newest and forgets it when the process ends) and settles the GPU's
periods it has shown (collect/ledger.py `close`, the agent's own code); the watch reads the
samples every 0.25 s while a process is young, as collect/reading.py does. `--phases` moves the
sweeps' phase over the 2 s. What each pod ran is its processes' kernel steps times one step's
solo time (testkit/recordings.py `Truth.work_s`) over the periods the bill settled.

Time-slicing stretches a process's wall time, not its work, so on a shared GPU the processes'
work adds up to less than the GPU's busy time (its switches): each pod's part of the bill is
held against its part of the work, as the GPU runs of bench/gpu_validate_bill.py are.
`--tree DIR` replays another checkout's otel_vgpu/ (the "before" of bench/results/).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", type=int, default=8)
    parser.add_argument("--tree", type=Path, help="another checkout whose otel_vgpu/ replays")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.tree is not None:
        # The other checkout's agent, this checkout's recordings and their reader.
        sys.path.insert(0, str(args.tree.resolve()))
        import otel_vgpu  # noqa: PLC0415

        assert Path(otel_vgpu.__file__).resolve().is_relative_to(args.tree.resolve()), otel_vgpu.__file__
    sys.path.insert(0, str(ROOT))
    from testkit.recordings import SWEEP_US, load, names, replayed_bill  # noqa: PLC0415

    lines = [
        "| recording | pod | share billed / share ran: worst, median | billed / ran: median |",
        "|---|---|---|---|",
    ]
    for name in names():
        if load(name).mps:
            continue  # an MPS server's sample holds its clients': `mps`, billed to no pod
        runs = [replayed_bill(name, SWEEP_US * k // args.phases) for k in range(args.phases)]
        for pod in sorted({pod for run in runs for pod in run}):
            shares, ratios = [], []
            for run in runs:
                all_billed = sum(b for b, _ in run.values())
                all_ran = sum(r for _, r in run.values())
                billed, ran = run.get(pod, (0.0, 0.0))
                if ran > 0.5 and all_billed > 0:
                    shares.append((billed / all_billed) / (ran / all_ran))
                    ratios.append(billed / ran)
            if shares:
                worst = max(shares, key=lambda x: abs(x - 1))
                share, ratio = statistics.median(shares), statistics.median(ratios)
                lines.append(f"| {name} | {pod} | {worst:.3f}, {share:.3f} | {ratio:.3f} |")
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
