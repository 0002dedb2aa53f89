"""NVML's per-process samples against each process's start, as the agent computes it.

Run as root on a GPU node from the repository root (bench/README.md says what the GPU scripts need):

    python3 bench/gpu_sample_birth.py [--gap 15] [--out results.md]

Two compute-bound processes on GPU 0, the second started `--gap` seconds after the first; then,
every half second for 3 s, each process's newest NVML sample and how far it is stamped after
the start the agent computes for it (pods/attribution.py: the boot time from /proc/uptime and
the start's clock ticks from /proc/<pid>/stat). The agent keeps a PID's samples only when they
are stamped a sample period (200 ms) or more after that start (collect/ledger.py
`BORN_SLACK_US`): a negative or small margin here means a running process's work is
dropped as an ended one's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otel_vgpu.collect.ledger import BORN_SLACK_US as SAMPLE_PERIOD_US
from otel_vgpu.pods.attribution import CLOCK_TICKS, ProcReader
from testkit.cuda_workloads import require_gpu, start_workloads
from testkit.report import publish


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gap", type=float, default=15.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_gpu()
    import pynvml as n  # noqa: PLC0415

    n.nvmlInit()
    handle = n.nvmlDeviceGetHandleByIndex(0)
    reader = ProcReader(Path("/proc"))
    (first,) = start_workloads(["busy"], 1.0)
    time.sleep(args.gap)
    (second,) = start_workloads(["busy"], 1.0)
    time.sleep(5)
    names = {first.pid: "first", second.pid: "second"}
    lines = [
        f"driver {n.nvmlSystemGetDriverVersion()}; the second process started {args.gap:g} s after the first",
        "",
        "| t | process | SM | sample stamped after its computed start | kept (>= 200 ms) |",
        "|---|---|---|---|---|",
    ]
    try:
        started = time.monotonic()
        while (t := time.monotonic() - started) < 3.0:
            now_us = time.time_ns() // 1000
            boot_us = reader.boot_us(now_us)
            samples = n.nvmlDeviceGetProcessUtilization(handle, now_us - 1_000_000)
            for sample in samples:
                if sample.pid not in names:
                    continue
                stat = reader.stat(sample.pid)
                if stat is None or boot_us is None:
                    continue
                born_us = boot_us + stat[0] * 1_000_000 // CLOCK_TICKS
                margin = (sample.timeStamp - born_us) / 1e6
                kept = sample.timeStamp >= born_us + SAMPLE_PERIOD_US
                lines.append(f"| {t:.1f} s | {names[sample.pid]} | {sample.smUtil} % | {margin:.3f} s | {kept} |")
            time.sleep(0.5)
    finally:
        for process in (first, second):
            process.kill()
        n.nvmlShutdown()
    publish("NVML's samples against the processes' starts", lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
