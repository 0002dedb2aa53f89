"""A CUDA process that runs a plan and writes down, itself, when its kernels ran: the truth
that bench/gpu_record_sampling.py sets beside what NVML said of it.

    python3 testkit/sampling_workload.py --truth FILE --start-at UNIX_TIME --plan '[[8, 100, 50], ...]'
    python3 testkit/sampling_workload.py --truth FILE --start-at UNIX_TIME --spawn '[[0.0, 1.0], ...]'
    python3 testkit/sampling_workload.py --truth FILE --start-at UNIX_TIME --dodge '[24, 25]'

`--plan`: segments of [seconds, period ms, on ms]: kernels for `on` ms of every `period` ms
(on == period: busy, on == 0: the context kept, idle), then the process exits. `--spawn`:
children forked from this process (which imports PyTorch but never touches CUDA, so that a
child starts in a fraction of a second): [offset s, life s] each, a child creating its
context at `offset` after the start, busy for `life` seconds, then gone; a child whose offset
has passed when the one before it ends starts at once (back-to-back restarts). `--dodge`:
[seconds, margin ms], a tenant that times itself to the driver's ticks, as any process that can
open the GPU can: it reads the stamps of the GPU's own utilization samples from NVML
(nvmlDeviceGetSamples; the recordings ran it as root), and runs kernels only from `margin` after one
tick to `margin` before the next, so that it is never on the GPU when the driver picks the
process a period's sample goes to (docs/nvml-sampling.md).

The truth file is JSON: the process's (and each child's) PID, when its context was made,
when it exited, and each burst as [start, end, steps] in Unix seconds. A step is one bf16
8192² matrix product; its solo time is measured once, alone, by `--calibrate`, so that work is
steps x solo seconds whatever time-slicing did to the wall time. Runs where PyTorch and CUDA
are (the lent GPU machine), not in the tests.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from collections.abc import Callable
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


def _ticks(pynvml: Any, handle: Any) -> list[int]:
    """The stamps (Unix microseconds) of the GPU utilization samples NVML holds now."""
    try:
        _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    except pynvml.NVMLError_NotFound:
        return []
    return sorted(int(sample.timeStamp) for sample in samples)


def _dodge(torch: Any, matrix: Any, seconds: float, margin_ms: float, bursts: list[list[float]]) -> Any:
    """Kernels between the driver's ticks only: each period, from `margin_ms` after the newest
    tick NVML shows to `margin_ms` before the one expected next (the newest plus the median
    spacing of the last ones), one step at a time so that they stop in time."""
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    end = time.time() + seconds
    margin = margin_ms / 1000
    while time.time() < end:
        ticks = _ticks(pynvml, handle)
        if len(ticks) < 3:
            time.sleep(0.05)
            continue
        gaps = sorted(b - a for a, b in itertools.pairwise(ticks[-9:]))
        period = gaps[len(gaps) // 2] / 1e6
        tick = ticks[-1] / 1e6
        while tick + period < time.time():  # a tick NVML has not shown yet
            tick += period
        start, until = tick + margin, min(end, tick + period - margin)
        time.sleep(max(0.0, start - time.time()))
        cycle, steps = time.time(), 0
        while time.time() < until:
            matrix = (matrix @ matrix).clamp_(-1, 1)
            torch.cuda.synchronize()
            steps += 1
        if steps:
            bursts.append([cycle, time.time(), steps])
        time.sleep(max(0.0, min(end, tick + period + margin) - time.time()))
    pynvml.nvmlShutdown()
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


def alone(truth: str, start_at: float, run: Callable[[Any, Any, list[list[float]]], Any]) -> None:
    """One process with its context made, `run` from `start_at` with the torch module, the
    matrix and the bursts to note, its truth written when it is done."""
    created = time.time()
    torch, matrix = _context()
    record: dict[str, Any] = {"pid": os.getpid(), "context": [created, time.time()], "bursts": []}
    print("ready", flush=True)
    time.sleep(max(0.0, start_at - time.time()))
    run(torch, matrix, record["bursts"])
    record["exit"] = time.time()
    _write(truth, [record])


def plan(truth: str, start_at: float, segments: list[list[float]]) -> None:
    def run(torch: Any, matrix: Any, bursts: list[list[float]]) -> None:
        for seconds, period_ms, on_ms in segments:
            matrix = _run(torch, matrix, seconds, period_ms, on_ms, bursts)

    alone(truth, start_at, run)


def dodge(truth: str, start_at: float, seconds: float, margin_ms: float) -> None:
    alone(truth, start_at, lambda torch, matrix, bursts: _dodge(torch, matrix, seconds, margin_ms, bursts))


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
    parser.add_argument("--dodge")
    parser.add_argument("--calibrate", action="store_true")
    args = parser.parse_args()
    if args.calibrate:
        print(f"{calibrate():.9f}", flush=True)
    elif args.dodge:
        dodge(args.truth, args.start_at, *json.loads(args.dodge))
    elif args.spawn:
        spawn(args.truth, args.start_at, json.loads(args.spawn))
    else:
        plan(args.truth, args.start_at, json.loads(args.plan))


if __name__ == "__main__":
    main()
