"""The CPU of each NVML call a sweep and the process watch make of a GPU, measured in this
process on a real GPU: where a sweep's time goes on the driver, beside the floor's calls
(testkit/raw_sweep.py). Used by bench/gpu_sweep_cost.py and bench/gpu_thread_cpu.py.

The per-process and GPU sample reads are timed twice: over the last 2 s, as a sweep asks, and
from now (nothing to return), which tells the driver's fixed cost of a call from what it
returns; a sweep that asked less often would save the first and keep the second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# nvml.h's field of the energy counter, for nvmlDeviceGetFieldValues: the same figure through
# the field-value path, timed beside the direct call.
FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83


def calls_of_a_sweep(pynvml: Any, handle: Any) -> dict[str, Callable[[], object]]:
    """Each call by the name the table shows, as the agent (or the floor) makes it."""

    def since() -> int:
        """The last 2 s, from the moment of the call, as a sweep 2 s after the last asks."""
        return time.time_ns() // 1000 - 2_000_000

    def now_us() -> int:
        return time.time_ns() // 1000 + 1_000_000

    calls: dict[str, Callable[[], object]] = {
        "nvmlDeviceGetCount": pynvml.nvmlDeviceGetCount,
        "nvmlDeviceGetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle),
        "nvmlDeviceGetUUID": lambda: pynvml.nvmlDeviceGetUUID(handle),
        "nvmlDeviceGetName": lambda: pynvml.nvmlDeviceGetName(handle),
        "nvmlDeviceGetMigMode": lambda: pynvml.nvmlDeviceGetMigMode(handle),
        "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle),
        "nvmlDeviceGetTotalEnergyConsumption": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
        "nvmlDeviceGetFieldValues (energy)": lambda: pynvml.nvmlDeviceGetFieldValues(
            handle, [FI_DEV_TOTAL_ENERGY_CONSUMPTION]
        ),
        "nvmlDeviceGetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(handle),
        "nvmlDeviceGetComputeRunningProcesses": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
        "nvmlDeviceGetGraphicsRunningProcesses": lambda: pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle),
        "nvmlDeviceGetMPSComputeRunningProcesses": lambda: pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle),
        "nvmlDeviceGetAccountingMode": lambda: pynvml.nvmlDeviceGetAccountingMode(handle),
        "nvmlDeviceGetComputeMode": lambda: pynvml.nvmlDeviceGetComputeMode(handle),
        "nvmlDeviceGetProcessUtilization (last 2 s)": lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, since()),
        "nvmlDeviceGetProcessUtilization (from now)": lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, now_us()),
        "nvmlDeviceGetProcessesUtilizationInfo (last 2 s)": lambda: pynvml.nvmlDeviceGetProcessesUtilizationInfo(
            handle, since()
        ),
        "nvmlDeviceGetProcessesUtilizationInfo (from now)": lambda: pynvml.nvmlDeviceGetProcessesUtilizationInfo(
            handle, now_us()
        ),
        "nvmlDeviceGetSamples (GPU utilization, last 2 s)": lambda: pynvml.nvmlDeviceGetSamples(
            handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since()
        ),
        "nvmlDeviceGetSamples (GPU utilization, from now)": lambda: pynvml.nvmlDeviceGetSamples(
            handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, now_us()
        ),
    }
    return {name: call for name, call in calls.items() if _has(pynvml, name)}


def _has(pynvml: Any, name: str) -> bool:
    """Whether this nvidia-ml-py has the call (the v2 per-process call came with R550's)."""
    return hasattr(pynvml, name.split(" ", 1)[0])


def call_costs(pynvml: Any, repeat: int = 50, index: int = 0) -> list[str]:
    """A table of the CPU per call (user + system, this process) of each call of a sweep of GPU
    `index`, the mean of `repeat`; a call the GPU refuses is timed as it fails, and marked."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    lines = ["", f"| NVML call (GPU {index}) | CPU per call, mean of {repeat} |", "|---|---|"]
    for name, call in calls_of_a_sweep(pynvml, handle).items():
        failed = ""
        started = time.process_time()
        for _ in range(repeat):
            try:
                call()
            except pynvml.NVMLError as error:
                failed = f" ({error})"
        each = (time.process_time() - started) / repeat
        lines.append(f"| {name}{failed} | {each * 1000:.3f} ms |")
    return lines
