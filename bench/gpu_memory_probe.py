"""Whether a GPU's memory in use tells, as soon as the process list does, that a process came
or went: what the process watch's probe relies on (collect/process_watch.py lists a GPU's processes
only when nvmlDeviceGetMemoryInfo's `used` changed).

Run as root on a node with an NVIDIA GPU, CUDA and PyTorch, from the repository root:

    python3 bench/gpu_memory_probe.py --out bench/results/h200-memory-probe.md

Each round starts a fresh CUDA process (PyTorch: a context, 1 GiB held, a matrix product
loop for a second, then exit) while this script polls GPU 0 every `--poll-ms`: the memory in
use (nvmlDeviceGetMemoryInfo) and the compute process list. It records, for the process's
arrival and its departure, when the list first showed it (or stopped showing it) and when
the memory in use first changed, and prints the lags; then how often the memory in use
changes while 12 steady processes run and none comes or goes. Nothing on the GPU is
reconfigured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.cuda_workloads import WORKLOAD, require_gpu, start_workloads
from testkit.report import publish

ROUNDS = 6


def steady_changes(look: Callable[[], tuple[int, frozenset[int]]], seconds: float) -> list[str]:
    """How often the memory in use changes while no process comes or goes: 12 processes (a
    third compute-bound, a third memory-bound, a third idle, as the cost runs load the GPU),
    looked at every 0.25 s, as the watch looks."""
    started = start_workloads([("busy", "copy", "idle")[n % 3] for n in range(12)], 0.25)
    try:
        time.sleep(2.0)
        changes = looks = listing_changes = 0
        used, pids = look()
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            time.sleep(0.25)
            now_used, now_pids = look()
            looks += 1
            changes += now_used != used
            listing_changes += now_pids != pids
            used, pids = now_used, now_pids
    finally:
        for process in started:
            process.kill()
            process.wait()
    return [
        f"With 12 steady processes, looked at every 0.25 s for {seconds:g} s: the memory in use changed at "
        f"{changes} of {looks} looks, the process list at {listing_changes}.",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--poll-ms", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--steady-seconds", type=float, default=10.0, help="0: no steady part")
    args = parser.parse_args()
    require_gpu()
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def look() -> tuple[int, frozenset[int]]:
        used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        return used, frozenset(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))

    lines = [
        f"GPU: {pynvml.nvmlDeviceGetName(handle)}, driver {pynvml.nvmlSystemGetDriverVersion()}; "
        f"polled every {args.poll_ms:g} ms",
        "",
        "| round | listed at (s after start) | memory changed at | arrival lag (memory - list, ms) "
        "| gone from the list | memory changed at | departure lag (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    arrivals, departures = [], []
    for round_ in range(args.rounds):
        base_used, _ = look()
        started = time.monotonic()
        # Spawned, not waited for: its context comes up while this polls.
        process = subprocess.Popen(
            [sys.executable, "-c", WORKLOAD, "once", "1.0"],
            env={**os.environ, "ONCE_S": "1.0"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        listed_at = memory_at = None
        pid = process.pid
        while process.poll() is None or listed_at is None or memory_at is None:
            used, pids = look()
            now = time.monotonic() - started
            if listed_at is None and pid in pids:
                listed_at = now
            if memory_at is None and used != base_used:
                memory_at = now
            if process.poll() is not None and now > 60:
                break
            time.sleep(args.poll_ms / 1000)
        # Departure: the process has exited; when did the list drop it, and the memory fall back?
        ended = time.monotonic() - started
        gone_at = freed_at = None
        last_used, _ = look()
        while gone_at is None or freed_at is None:
            used, pids = look()
            now = time.monotonic() - started
            if gone_at is None and pid not in pids:
                gone_at = now
            if freed_at is None and used != last_used and used <= base_used + 64 * 2**20:
                freed_at = now
            if now - ended > 10:
                break
            time.sleep(args.poll_ms / 1000)
        process.wait()
        arrival = None if listed_at is None or memory_at is None else (memory_at - listed_at) * 1000
        departure = None if gone_at is None or freed_at is None else (freed_at - gone_at) * 1000
        arrivals += [arrival] if arrival is not None else []
        departures += [departure] if departure is not None else []
        lines.append(f"| {round_} | {listed_at} | {memory_at} | {arrival} | {gone_at} | {freed_at} | {departure} |")
    lines += [
        "",
        f"arrival lag, memory after list: median {statistics.median(arrivals) if arrivals else None} ms, "
        f"max {max(arrivals) if arrivals else None} ms",
        f"departure lag, memory after list: median {statistics.median(departures) if departures else None} ms, "
        f"max {max(departures) if departures else None} ms",
    ]
    if args.steady_seconds > 0:
        lines += ["", *steady_changes(look, args.steady_seconds)]
    pynvml.nvmlShutdown()
    publish("When the memory in use tells of a process, on a real GPU", lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
