"""What NVML keeps of a process that has ended: its per-process samples, asked for after a kill.

Run as root on a GPU node, in the host's namespace (bench/results/h200-nvml-ended-samples.md):

    python3 bench/gpu_ended_samples.py

A busy PyTorch process runs 3 s and is killed; NVML's samples since before it started are
then asked for 0.05, 0.5, 2, 5 and 12 s apart, and whether it is still listed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

BUSY = r"""
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def samples(pynvml: Any, handle: Any, since_us: int) -> list[tuple[int, int, int]] | str:
    """(PID, timestamp, SM %) of every process's samples since `since_us`, or NVML's error."""
    try:
        return [(s.pid, s.timeStamp, s.smUtil) for s in pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)]
    except pynvml.NVMLError as error:
        return str(error)


def main() -> None:
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    process = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    t0 = int(time.time() * 1e6)
    time.sleep(3.0)

    def mine() -> list[tuple[int, int, int]] | str:
        found = samples(pynvml, handle, t0)
        return found if isinstance(found, str) else [s for s in found if s[0] == process.pid]

    alive = mine()
    print("alive, since t0:", alive[:5] if isinstance(alive, list) else alive)
    print("alive, count of samples for pid since t0:", len(alive) if isinstance(alive, list) else "-")
    kill_at = int(time.time() * 1e6)
    process.kill()
    process.wait()
    for delay in (0.05, 0.5, 2.0, 5.0, 12.0):
        time.sleep(delay)
        found = mine()
        listed = process.pid in [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        shown = found[:3] if isinstance(found, list) else found
        after = (time.time() * 1e6 - kill_at) / 1e6
        print(f"+{after:.2f}s after kill: listed={listed} samples={shown} (kill at {kill_at})")


if __name__ == "__main__":
    main()
