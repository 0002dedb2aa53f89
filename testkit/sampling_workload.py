"""A CUDA process that runs a plan and writes down, itself, when its kernels ran: the truth
that bench/gpu_record_sampling.py sets beside what NVML said of it.

    python3 testkit/sampling_workload.py --truth FILE --start-at UNIX_TIME --plan '[[8, 100, 50], ...]'
    python3 testkit/sampling_workload.py --truth FILE --start-at UNIX_TIME --spawn '[[0.0, 1.0], ...]'

`--plan`: segments of [seconds, period ms, on ms]: kernels for `on` ms of every `period` ms
(on == period: busy, on == 0: the context kept, idle), then the process exits. `--spawn`:
children forked from this process (which imports PyTorch but never touches CUDA, so that a
child starts in a fraction of a second): [offset s, life s] each, a child creating its
context at `offset` after the start, busy for `life` seconds, then gone; a child whose offset
has passed when the one before it ends starts at once (back-to-back restarts).

The truth file is JSON: the process's (and each child's) PID, when its context was made,
when it exited, and each burst as [start, end, steps] in Unix seconds. A step is one bf16
8192² matrix product; its solo time is measured once, alone, by `--calibrate`, so that work is
steps x solo seconds whatever time-slicing did to the wall time. Runs where PyTorch and CUDA
are (the lent GPU machine), not in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

SIZE = 8192
BATCH = 10  # busy steps between synchronisations (about 17 ms of work on an H200)


def _context() -> tuple[Any, Any]:
    import torch  # noqa: PLC0415

    matrix = torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    return torch, matrix


def _run(torch: Any, matrix: Any, seconds: float, period_ms: float, on_ms: float, bursts: list[list[float]]) -> Any:
    """Kernels for `on_ms` of every `period_ms` over `seconds`: one burst noted a period, as
    [start, end, steps], its end after the last step's kernels finished."""
    end = time.time() + seconds
    period, on = period_ms / 1000, on_ms / 1000
    while (cycle := time.time()) < end:
        until = min(end, cycle + min(on, period))
        steps = 0
        # Busy: batches between synchronisations; a duty cycle: one step at a time, so that
        # its kernels stop when its `on` time is up.
        batch = BATCH if on >= period else 1
        while time.time() < until:
            for _ in range(batch):
                matrix = (matrix @ matrix).clamp_(-1, 1)
            torch.cuda.synchronize()
            steps += batch
        if steps:
            bursts.append([cycle, time.time(), steps])
        time.sleep(max(0.0, min(end, cycle + period) - time.time()))
    return matrix


def calibrate() -> float:
    """One step's time alone: the fastest of twelve timed batches."""
    torch, matrix = _context()
    best = float("inf")
    for _ in range(12):
        start = time.perf_counter()
        for _ in range(BATCH):
            matrix = (matrix @ matrix).clamp_(-1, 1)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / BATCH)
    return best


def plan(truth: str, start_at: float, segments: list[list[float]]) -> None:
    created = time.time()
    torch, matrix = _context()
    record: dict[str, Any] = {"pid": os.getpid(), "context": [created, time.time()], "bursts": []}
    print("ready", flush=True)
    time.sleep(max(0.0, start_at - time.time()))
    for seconds, period_ms, on_ms in segments:
        matrix = _run(torch, matrix, seconds, period_ms, on_ms, record["bursts"])
    record["exit"] = time.time()
    _write(truth, [record])


def spawn(truth: str, start_at: float, children: list[list[float]]) -> None:
    import torch  # noqa: PLC0415, F401  (imported before the forks: each child starts at once)

    print("ready", flush=True)
    records = []
    for offset, life in children:
        time.sleep(max(0.0, start_at + offset - time.time()))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            created = time.time()
            torch_, matrix = _context()
            record: dict[str, Any] = {"pid": os.getpid(), "context": [created, time.time()], "bursts": []}
            _run(torch_, matrix, life, 100, 100, record["bursts"])
            record["exit"] = time.time()
            os.write(write, json.dumps(record).encode())
            os.close(write)
            os._exit(0)
        os.close(write)
        chunks = []
        while chunk := os.read(read, 1 << 16):
            chunks.append(chunk)
        os.close(read)
        os.waitpid(pid, 0)
        records.append({**json.loads(b"".join(chunks)), "gone": time.time()})
    _write(truth, records)


def _write(truth: str, records: list[dict[str, Any]]) -> None:
    with open(truth + ".tmp", "w") as out:
        json.dump(records, out)
    os.replace(truth + ".tmp", truth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--truth")
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--plan")
    parser.add_argument("--spawn")
    parser.add_argument("--calibrate", action="store_true")
    args = parser.parse_args()
    if args.calibrate:
        print(f"{calibrate():.9f}", flush=True)
    elif args.spawn:
        spawn(args.truth, args.start_at, json.loads(args.spawn))
    else:
        plan(args.truth, args.start_at, json.loads(args.plan))


if __name__ == "__main__":
    main()
