"""Soak: 5,000 pods and 100,000 processes come and go through the simulated node.

The agent runs as a process on a churning scenario (100 pods alive at a time,
each for 1 s, 20 processes each, PIDs wrapping so they are reused) and is
scraped back to back. Every couple of seconds the run records the agent's
resident memory, open file descriptors, and the pod series in the scrape.

    .venv/bin/python bench/soak.py [--pods 5000]

tests/system/test_reliability.py runs a shorter soak (testkit/soak.py) and asserts on its figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.procstat import compile_bytecode
from testkit.soak import run_soak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--live", type=int, default=100)
    parser.add_argument("--processes", type=int, default=20)
    args = parser.parse_args()
    compile_bytecode()  # the figures are the agent's, not Python compiling its imports
    soak = run_soak(args.pods, args.live, 1.0, args.processes)
    print(f"{soak.scrapes} scrapes; {soak.pods_seen} pods seen of {args.pods}; at most {soak.max_live_pods} at once")
    print(f"scrapes whose pods were not those alive at one moment: {len(soak.wrong_scrapes)}")
    print(f"{'s':>6} {'RSS MiB':>8} {'fds':>5} {'pod series':>11} {'pods':>5} {'sweeps':>7}")
    for s in soak.samples:
        print(f"{s.seconds:6.1f} {s.rss_mib:8.1f} {s.open_fds:5d} {s.pod_series:11d} {s.live_pods:5d} {s.sweeps:7.0f}")
    # What holds on any machine: memory and descriptors flat once the first pods are in (the
    # first sample past 2 s is the reference), whatever number of scrapes a machine manages.
    warm = next((s for s in soak.samples if s.seconds >= 2.0), soak.samples[0])
    end = soak.samples[-1]
    print(
        f"at the end, RSS {end.rss_mib / warm.rss_mib:.3f}x and open fds {end.open_fds / warm.open_fds:.2f}x "
        f"their values at {warm.seconds:.0f} s"
    )


if __name__ == "__main__":
    main()
