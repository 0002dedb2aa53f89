"""The floor of a per-process GPU exporter: the NVML and /proc calls one sweep makes, and nothing
else (bench/gpu_bench.py times them; bench/gpu_cost_side_by_side.py runs them on the agent's
cadence as a process of their own, whose CPU is the reference the agent's is quoted against).

    python3 -m testkit.raw_sweep [--every 2] [--bill]

With `--bill`, also the reads the agent's bill needs beyond them: each sweep the GPU's own SM
samples over the window (the periods the per-process figures are fitted under,
docs/chargeback.md), and the energy counter every 10 s (the pods' joules): the floor of an
exporter that bills what this agent bills.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

# The energy counter's cadence in the agent (otel_vgpu/config.py ENERGY_EVERY_S, not imported:
# the floor's memory is Python's and NVML's alone).
ENERGY_EVERY_S = 10.0


def bill_reads(nvml: Any, handles: list[Any], since: list[int], energy: bool) -> None:
    """The GPU's own SM samples since the last sweep, and with `energy` the energy counter: what
    billing the pods reads beyond a listing of their use. `since` is the window
    `raw_collection` read, before it moves it."""
    for index, handle in enumerate(handles):
        try:  # noqa: SIM105
            nvml.nvmlDeviceGetSamples(handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, since[index])
        except nvml.NVMLError:
            pass
        if energy:
            try:  # noqa: SIM105
                nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            except nvml.NVMLError:
                pass


def raw_collection(nvml: Any, handles: list[Any], since: list[int]) -> None:
    """The NVML and /proc calls of one collection, and nothing else."""
    nvml.nvmlDeviceGetCount()
    for index, handle in enumerate(handles):
        nvml.nvmlDeviceGetMemoryInfo(handle)
        nvml.nvmlDeviceGetUtilizationRates(handle)
        nvml.nvmlDeviceGetUUID(handle)
        nvml.nvmlDeviceGetName(handle)
        try:  # noqa: SIM105 - the floor carries no overhead of its own
            nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:
            pass
        pids = [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        pids += [p.pid for p in nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)]
        try:  # noqa: SIM105
            nvml.nvmlDeviceGetProcessUtilization(handle, since[index])
        except nvml.NVMLError:
            pass
        since[index] = time.time_ns() // 1000 - 1_000_000
        for pid in set(pids):
            try:
                with open(f"/proc/{pid}/stat", "rb") as handle_file:
                    handle_file.read()
            except OSError:
                pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between sweeps (the agent's default)")
    parser.add_argument("--bill", action="store_true", help="also the GPU's own samples and the energy counter")
    args = parser.parse_args()
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    since = [time.time_ns() // 1000 - 1_000_000 for _ in handles]
    print("ready", flush=True)
    next_at = energy_at = time.monotonic()
    while True:
        if args.bill:
            energy = time.monotonic() >= energy_at
            energy_at += ENERGY_EVERY_S if energy else 0.0
            bill_reads(pynvml, handles, since, energy)
        raw_collection(pynvml, handles, since)
        next_at += args.every
        time.sleep(max(0.0, next_at - time.monotonic()))


if __name__ == "__main__":
    main()
