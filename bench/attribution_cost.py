"""The attribution's part of a sweep: each GPU process's `/proc/<pid>/stat` read for its start
time (pods/attribution.py `Attributor.started_us`) and the pass that attributes them
(`Attributor.attribute`), their cgroups already cached as after a first sweep, on a proc tree
that bench/agent_cost.py kept (`--keep`): CPU per sweep, the fastest and the median of 7
rounds of 50 sweeps.

The package comes from `PYTHONPATH`, so that two trees can be measured by one script:

    cd OTHER-TREE && PYTHONPATH=. .venv/bin/python THIS-TREE/bench/attribution_cost.py /tmp/ac57b/8-gpus/proc
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from otel_vgpu.pods.attribution import Attributor, ProcReader

ROUNDS = 7
SWEEPS = 50
# Any instant on the samples' clock: the boot time is read from the tree's `uptime` against it.
NOW_US = 10**15


def sweep(attributor: Attributor, pids: list[int]) -> None:
    attributor.begin(NOW_US)
    attributor.started_us(pids)
    attributor.attribute(pids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("proc", type=Path, help="a proc tree (bench/agent_cost.py --keep DIR: DIR/<n>-gpus/proc)")
    args = parser.parse_args()
    pids = sorted(int(name) for name in os.listdir(args.proc) if name.isdigit())
    attributor = Attributor(ProcReader(args.proc))
    sweep(attributor, pids)  # the cgroups read once, as at the first sweep
    per_sweep = []
    for _ in range(ROUNDS):
        started = time.process_time()
        for _ in range(SWEEPS):
            sweep(attributor, pids)
        per_sweep.append((time.process_time() - started) / SWEEPS)
    print(
        f"{len(pids)} processes: {min(per_sweep) * 1e3:.2f} ms of CPU a sweep (fastest of {ROUNDS}), "
        f"median {statistics.median(per_sweep) * 1e3:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
