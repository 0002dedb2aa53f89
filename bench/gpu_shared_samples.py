"""What NVML's per-process samples say of a process that shares its GPU by time-slicing,
against the work the process counted itself: the figure the ledger splits a shared period by
(collect/ledger.py), read alone and beside a busy neighbour.

Run as root on a node with an NVIDIA GPU, CUDA and PyTorch, from the repository root:

    python3 bench/gpu_shared_samples.py [--seconds 10] --out bench/results/h200-shared-samples.md

A steady process (bf16 matrix products for 30 % of every 100 ms, its GPU seconds of work
written twice a second: testkit/cuda_workloads.py) runs alone for `--seconds`, then beside a
busy one for as long. Each phase reports the steady process's mean per-process SM sample
(nvmlDeviceGetProcessUtilization, read every 0.5 s), the share of the time it counted as its
own work, and the GPU's own utilization. Nothing on the GPU is reconfigured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.cuda_workloads import require_gpu, start_workloads, work_of
from testkit.report import publish


def phase(handle: object, pid: int, work: Path, seconds: float) -> tuple[float, float, float]:
    """The steady process's mean SM sample, its counted work per second, and the GPU's mean
    utilization, over `seconds`."""
    import pynvml  # noqa: PLC0415

    samples, device = [], []
    work_before, started = work_of(work), time.monotonic()
    seen = int(time.time() * 1e6)
    while time.monotonic() - started < seconds:
        time.sleep(0.5)
        try:
            for sample in pynvml.nvmlDeviceGetProcessUtilization(handle, seen):
                if sample.pid == pid:
                    samples.append(sample.smUtil / 100)
        except pynvml.NVMLError:
            pass  # no sample newer than `seen`
        seen = int(time.time() * 1e6) - 250_000
        device.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100)
    elapsed = time.monotonic() - started
    rate = (work_of(work) - work_before) / elapsed
    return (statistics.mean(samples) if samples else float("nan")), rate, statistics.mean(device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_gpu()
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    work = Path(tempfile.mkdtemp()) / "steady-work"
    (steady,) = start_workloads(["steady"], 1.0, {"WORK_FILE": str(work)}, burst_ms=300)
    busy = None
    try:
        time.sleep(2.0)
        alone = phase(handle, steady.pid, work, args.seconds)
        (busy,) = start_workloads(["busy"], 1.0)
        time.sleep(2.0)
        shared = phase(handle, steady.pid, work, args.seconds)
    finally:
        for process in (steady, busy):
            if process is not None:
                process.kill()
                process.wait()
        pynvml.nvmlShutdown()
    lines = [
        "| the steady process (30 % of every 100 ms) | its NVML SM sample | its own work, s per s | GPU utilization |",
        "|---|---|---|---|",
        f"| alone | {alone[0]:.3f} | {alone[1]:.3f} | {alone[2]:.3f} |",
        f"| beside a busy process | {shared[0]:.3f} | {shared[1]:.3f} | {shared[2]:.3f} |",
        "",
        f"Beside the busy process its sample reads {shared[0] / max(1e-9, shared[1]):.2f}x the work it counted "
        f"(alone {alone[0] / max(1e-9, alone[1]):.2f}x).",
    ]
    publish("A time-sliced process's NVML samples against its own work, on a real GPU", lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
