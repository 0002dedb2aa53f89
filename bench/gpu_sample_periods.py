"""What NVML keeps of utilization on this GPU: per process, and the GPU's own.

Runs two CUDA processes, one busy all the time and one bursty (kernels for
`--burst-ms` of each second), asks NVML every 50 ms for 6 s for the
per-process samples (`nvmlDeviceGetProcessUtilization` since 0) and the
GPU's utilization (`nvmlDeviceGetUtilizationRates`), and prints each new
sample as it appears: which process, how old its timestamp is, its value,
and the GPU's figure at that moment. Then how many samples NVML returns for
"everything it has" (since 0), and the spacing of the GPU's own sample buffer
(`nvmlDeviceGetSamples`). What it answers: whether NVML keeps a history of
process samples or only the latest, how often a process's sample is
refreshed, and whether the processes' figures add up to the GPU's.

Run as root, with PyTorch and CUDA, from the repository root; write the
output as a Markdown report with --out:

    python3 bench/gpu_sample_periods.py [--burst-ms 300] [--out bench/results/h200-nvml-samples.md]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.cuda_workloads import require_gpu, start_workload


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst-ms", type=float, default=300.0)
    parser.add_argument(
        "--first-ms", type=float, help="make the first process bursty too, with kernels this many ms of each second"
    )
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_gpu()
    import pynvml  # noqa: PLC0415

    first = "busy" if args.first_ms is None else f"bursty {args.first_ms:g} ms"
    second = f"bursty {args.burst_ms:g} ms"
    workloads = {
        first: start_workload("busy" if args.first_ms is None else "bursty", 0.5, burst_ms=args.first_ms or 0.0),
        second: start_workload("bursty", 0.5, burst_ms=args.burst_ms),
    }
    lines: list[str] = []
    try:
        time.sleep(3)
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        which = {process.pid: mode for mode, process in workloads.items()}
        lines += [
            f"GPU 0: {name}, driver {driver}; two processes: {first}, and {second} (kernels that many ms a second)",
            "",
            "| t | process | sample age | its SM | GPU's last period |",
            "|---|---|---|---|---|",
        ]
        last: dict[int, int] = {}
        started = time.time_ns() // 1000
        while time.time_ns() // 1000 - started < args.seconds * 1_000_000:
            now = time.time_ns() // 1000
            try:
                samples = list(pynvml.nvmlDeviceGetProcessUtilization(handle, 0))
            except pynvml.NVMLError_NotFound:
                samples = []
            gpu = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            for sample in samples:
                if last.get(sample.pid) != sample.timeStamp and sample.pid in which:
                    last[sample.pid] = sample.timeStamp
                    lines.append(
                        f"| {(now - started) / 1e6:.2f} s | {which[sample.pid]} | "
                        f"{(now - sample.timeStamp) / 1000:.0f} ms | {sample.smUtil} % | {gpu} % |"
                    )
            time.sleep(0.05)
        everything = list(pynvml.nvmlDeviceGetProcessUtilization(handle, 0))
        _, own = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        pynvml.nvmlShutdown()
    finally:
        for process in workloads.values():
            process.kill()
    stamps = sorted(int(sample.timeStamp) for sample in own)
    gaps = sorted((b - a) / 1000 for a, b in itertools.pairwise(stamps))
    lines += [
        "",
        f"per-process samples NVML returns since 0: {len(everything)} (for {len(workloads)} processes)",
        f"the GPU's own sample buffer (nvmlDeviceGetSamples): {len(own)} samples, "
        f"spacing {gaps[len(gaps) // 2]:.0f} ms (from {gaps[0]:.0f} to {gaps[-1]:.0f})"
        if gaps
        else "the GPU's own sample buffer: empty",
    ]
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if args.out:
        args.out.write_text(
            "# What NVML keeps of utilization samples\n\n"
            f"`python3 bench/gpu_sample_periods.py {' '.join(sys.argv[1:])}`, as root on a lent "
            "machine with one NVIDIA H200; each row is a new per-process sample as it appeared.\n\n" + report
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
