"""The CPU of each NVML call behind the health, GPM and XID families, on a real GPU.

Run on a GPU node from the repository root (no root needed; bench/README.md says what the GPU
scripts need):

    python3 bench/gpu_health_calls.py [--repeat 200] [--out results.md]

Each call on GPU 0, `--repeat` times, its thread's CPU time per call (time.thread_time: what the
agent's process pays, not the wall clock); then the agent's own readers (NvmlBackend.health,
.gpm and .xid_events with a zero timeout), so that the calls' sum and the reader's total can be
compared: the difference is Python's. Nothing on the GPU is reconfigured.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.cuda_workloads import require_gpu
from testkit.report import publish


def per_call_ms(call: Callable[[], Any], repeat: int, pause_s: float = 0.0) -> float | str:
    """The thread's CPU per call in ms, or the error NVML gave."""
    spent = 0.0
    for _ in range(repeat):
        if pause_s:
            time.sleep(pause_s)
        started = time.thread_time()
        try:
            call()
        except Exception as error:
            return f"{type(error).__name__}: {error}"
        spent += time.thread_time() - started
    return 1000 * spent / repeat


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_gpu()
    import pynvml as n  # noqa: PLC0415

    from otel_vgpu.collect.xids import XID_SLICE  # noqa: PLC0415
    from otel_vgpu.gpu.nvml import NvmlBackend  # noqa: PLC0415

    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    calls: dict[str, Callable[[], Any]] = {
        "nvmlDeviceGetClockInfo(SM)": lambda: n.nvmlDeviceGetClockInfo(h, 1),
        "nvmlDeviceGetClockInfo(MEM)": lambda: n.nvmlDeviceGetClockInfo(h, 2),
        "nvmlDeviceGetTemperature(GPU)": lambda: n.nvmlDeviceGetTemperature(h, 0),
        "nvmlDeviceGetPowerUsage": lambda: n.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h),
        "nvmlDeviceGetPcieReplayCounter": lambda: n.nvmlDeviceGetPcieReplayCounter(h),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
        "nvmlDeviceGetFieldValues(82, 74, 269)": lambda: n.nvmlDeviceGetFieldValues(h, [82, 74, 269]),
        "nvmlDeviceGetEccMode": lambda: n.nvmlDeviceGetEccMode(h),
        "nvmlDeviceGetTotalEccErrors(corrected)": lambda: n.nvmlDeviceGetTotalEccErrors(h, 0, 0),
        "nvmlDeviceGetTotalEccErrors(uncorrected)": lambda: n.nvmlDeviceGetTotalEccErrors(h, 1, 0),
        "nvmlDeviceGetRemappedRows": lambda: n.nvmlDeviceGetRemappedRows(h),
    }
    lines = [
        f"GPU: {n.nvmlDeviceGetName(h)}, driver {n.nvmlSystemGetDriverVersion()}; {args.repeat} calls each",
        "",
        "| call | CPU per call |",
        "|---|---|",
    ]
    total = 0.0
    for name, call in calls.items():
        cost = per_call_ms(call, args.repeat)
        total += cost if isinstance(cost, float) else 0.0
        lines.append(f"| {name} | {cost:.3f} ms |" if isinstance(cost, float) else f"| {name} | {cost} |")
    lines.append(f"| the calls above, summed | {total:.3f} ms |")
    n.nvmlShutdown()

    backend = NvmlBackend()
    backend.device_count()
    readers: dict[str, tuple[Callable[[], Any], float]] = {
        "NvmlBackend.health(0)": (lambda: backend.health(0), 0.0),
        # GPM answers only 0.1 s after the last sample: paced, as the agent's windows are.
        "NvmlBackend.gpm(0)": (lambda: backend.gpm(0), 0.11),
        "NvmlBackend.xid_events(0)": (lambda: backend.xid_events(0, XID_SLICE), 0.0),
    }
    for name, (call, pause) in readers.items():
        repeat = args.repeat if not pause else min(args.repeat, 50)
        cost = per_call_ms(call, repeat, pause)
        lines.append(f"| {name} | {cost:.3f} ms |" if isinstance(cost, float) else f"| {name} | {cost} |")
    backend.close()
    publish("The CPU of the health, GPM and XID calls, on a real GPU", lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
