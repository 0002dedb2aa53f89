"""Each GPU's health and efficiency figures, declared once: what NVML calls them, the unit
each is published in, what it means, and the dcgm-exporter field it answers.

Health figures are read every 10 s off the scrape's path (collect/device_health.py), not every sweep: each is
one NVML call of under a millisecond (nvmlDeviceGetClockInfo, GetTemperatureV, GetPowerUsage,
GetFieldValues...), and nobody reads a temperature every 2 s. Efficiency figures come from
GPM (GPU Performance Monitoring, Hopper and newer: nvmlGpmSampleGet, nvmlGpmMetricsGet), read
once per engine window (collect/reading.py), over the window. A family per figure follows
from these tables (export/families.py), as do the simulated node's values (sim/health.py)
and the dcgm-exporter names (scripts/gen-dcgm-rules.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HealthFigure:
    """One health figure of a GPU, in the unit it is published in."""

    name: str
    """Its family is `vgpu.gpu.<name>`."""
    unit: str
    """UCUM, as the family's (Hz, Cel, W, s, or an annotation such as {error})."""
    meaning: str
    counter: bool = False
    """It only grows while the driver stays loaded (a reload counts from 0 again)."""
    dcgm: str = ""
    """The dcgm-exporter field it answers (docs/coming-from.md); empty: none."""
    dcgm_scale: float = 1.0
    """This figure times `dcgm_scale` is the dcgm-exporter field's value (Hz to MHz: 1e-6; s to
    the violation fields' ns: 1e9, DCGM's dcgm_fields.h)."""


HEALTH_TABLE = (
    HealthFigure(
        "sm.clock",
        "Hz",
        "The SM clock (nvmlDeviceGetClockInfo, NVML_CLOCK_SM).",
        dcgm="DCGM_FI_DEV_SM_CLOCK",
        dcgm_scale=1e-6,
    ),
    HealthFigure(
        "memory.clock",
        "Hz",
        "The memory clock (nvmlDeviceGetClockInfo, NVML_CLOCK_MEM).",
        dcgm="DCGM_FI_DEV_MEM_CLOCK",
        dcgm_scale=1e-6,
    ),
    HealthFigure("temperature", "Cel", "The GPU die's temperature.", dcgm="DCGM_FI_DEV_GPU_TEMP"),
    HealthFigure(
        "memory.temperature",
        "Cel",
        "The memory's temperature (NVML field NVML_FI_DEV_MEMORY_TEMP; HBM GPUs).",
        dcgm="DCGM_FI_DEV_MEMORY_TEMP",
    ),
    HealthFigure(
        "power",
        "W",
        "Power drawn by the board (nvmlDeviceGetPowerUsage: a 1 s average on Ampere, GA100 aside, and newer).",
        dcgm="DCGM_FI_DEV_POWER_USAGE",
    ),
    HealthFigure(
        "power.limit",
        "W",
        "The power limit the driver enforces, after every limiter (nvmlDeviceGetEnforcedPowerLimit).",
        dcgm="DCGM_FI_DEV_POWER_MGMT_LIMIT",
    ),
    HealthFigure(
        "pcie.replays",
        "{replay}",
        "PCIe replays: link-level retransmissions, a sign of a failing link or riser (nvmlDeviceGetPcieReplayCounter).",
        counter=True,
        dcgm="DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    ),
    HealthFigure(
        "clock.event.reasons",
        "",
        "Why the clocks are below their maximum now, NVML's bitmask (nvmlDeviceGetCurrentClocksEventReasons): "
        "0x1 idle, 0x4 software power cap, 0x8 hardware slowdown, 0x10 sync boost, 0x20 software thermal, "
        "0x40 hardware thermal, 0x80 hardware power brake. docs/metrics.md has PromQL for each bit.",
        dcgm="DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    ),
    HealthFigure(
        "power.violation",
        "s",
        "Time the clocks were held below their target by the power cap (NVML field "
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP, nanoseconds).",
        counter=True,
        dcgm="DCGM_FI_DEV_POWER_VIOLATION",
        dcgm_scale=1e9,
    ),
    HealthFigure(
        "thermal.violation",
        "s",
        "Time the clocks were held below their target for heat (NVML field "
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, nanoseconds).",
        counter=True,
        dcgm="DCGM_FI_DEV_THERMAL_VIOLATION",
        dcgm_scale=1e9,
    ),
    HealthFigure(
        "ecc.corrected",
        "{error}",
        "Corrected (single-bit) ECC errors since the driver loaded (nvmlDeviceGetTotalEccErrors, volatile); "
        "absent with ECC off.",
        counter=True,
        dcgm="DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    ),
    HealthFigure(
        "ecc.uncorrected",
        "{error}",
        "Uncorrected (double-bit) ECC errors since the driver loaded: data was lost, the GPU needs attention; "
        "absent with ECC off.",
        counter=True,
        dcgm="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ),
    HealthFigure(
        "remapped.rows.correctable",
        "{row}",
        "Memory rows remapped after correctable errors (nvmlDeviceGetRemappedRows; Ampere and newer, not in MIG mode).",
        counter=True,
        dcgm="DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    ),
    HealthFigure(
        "remapped.rows.uncorrectable",
        "{row}",
        "Memory rows remapped after uncorrectable errors.",
        counter=True,
        dcgm="DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    ),
    HealthFigure(
        "remapped.rows.pending",
        "",
        "1 while a row remap waits for the GPU's next reset to take effect, else 0.",
    ),
    HealthFigure(
        "remapped.rows.failure",
        "",
        "1 when a row remap failed (the GPU has no spare rows left for that bank): replace or reset the GPU; else 0.",
        dcgm="DCGM_FI_DEV_ROW_REMAP_FAILURE",
    ),
)
HEALTH_FIGURES = tuple(figure.name for figure in HEALTH_TABLE)


@dataclass(frozen=True, slots=True)
class GpmFigure:
    """One GPM metric (nvmlGpmMetricId_t, nvml.h), in the unit it is published in."""

    name: str
    """Its families are `vgpu.gpu.<name>` and, where `per_pod`, `vgpu.pod.<name>`."""
    metric_id: int
    meaning: str
    unit: str = "1"
    scale: float = 0.01
    """NVML's value times `scale` is the figure: percent (0-100) to 0-1, MiB/s to bytes/s."""
    per_pod: bool = True
    """Given to the pod that had its GPU (or MIG instance) alone over the window."""
    busy: bool = False
    """Also a busy-seconds counter per GPU, as SM has."""
    nvlink: bool = False
    """Only on a GPU with NVLink."""
    dcgm: str = ""
    dcgm_scale: float = 1.0


MIB = 1024 * 1024
GPM_TABLE = (
    GpmFigure(
        "graphics.active",
        1,
        "the share of time any graphics or compute context was active (GPM GRAPHICS_UTIL)",
        dcgm="DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    ),
    GpmFigure(
        "sm.active",
        2,
        "the share of SMs busy, averaged over the window (GPM SM_UTIL); unlike utilization, a kernel on one SM "
        "reads small",
        dcgm="DCGM_FI_PROF_SM_ACTIVE",
    ),
    GpmFigure(
        "sm.occupancy",
        3,
        "the warps resident on the SMs against the most they hold (GPM SM_OCCUPANCY)",
        dcgm="DCGM_FI_PROF_SM_OCCUPANCY",
    ),
    GpmFigure(
        "tensor.active",
        5,
        "the share of time the SMs' tensor cores were busy, any precision (GPM ANY_TENSOR_UTIL)",
        busy=True,
        dcgm="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ),
    GpmFigure(
        "dram.active",
        10,
        "the DRAM bandwidth used against its theoretical maximum (GPM DRAM_BW_UTIL)",
        busy=True,
        dcgm="DCGM_FI_PROF_DRAM_ACTIVE",
    ),
    GpmFigure(
        "fp64.active",
        11,
        "the share of time the FP64 pipes were busy (GPM FP64_UTIL)",
        dcgm="DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    ),
    GpmFigure(
        "fp32.active",
        12,
        "the share of time the FP32 pipes were busy (GPM FP32_UTIL)",
        dcgm="DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    ),
    GpmFigure(
        "fp16.active",
        13,
        "the share of time the FP16 pipes were busy (GPM FP16_UTIL)",
        dcgm="DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    ),
    GpmFigure(
        "pcie.transmit",
        20,
        "PCIe traffic from the GPU (GPM PCIE_TX_PER_SEC)",
        unit="By/s",
        scale=MIB,
        dcgm="DCGM_FI_PROF_PCIE_TX_BYTES",
    ),
    GpmFigure(
        "pcie.receive",
        21,
        "PCIe traffic to the GPU (GPM PCIE_RX_PER_SEC)",
        unit="By/s",
        scale=MIB,
        dcgm="DCGM_FI_PROF_PCIE_RX_BYTES",
    ),
    GpmFigure(
        "nvlink.transmit",
        61,
        "NVLink traffic from the GPU, all links (GPM NVLINK_TOTAL_TX_PER_SEC)",
        unit="By/s",
        scale=MIB,
        per_pod=False,
        nvlink=True,
        dcgm="DCGM_FI_PROF_NVLINK_TX_BYTES",
    ),
    GpmFigure(
        "nvlink.receive",
        60,
        "NVLink traffic to the GPU, all links (GPM NVLINK_TOTAL_RX_PER_SEC)",
        unit="By/s",
        scale=MIB,
        per_pod=False,
        nvlink=True,
        dcgm="DCGM_FI_PROF_NVLINK_RX_BYTES",
    ),
)
GPM_BUSY = tuple(figure.name for figure in GPM_TABLE if figure.busy)
# GPM's minimum interval between two samples (nvml.h, nvmlGpmMetricsGet: "should be greater than
# 100ms due to the internal sample refresh rate"); the driver does not refuse a shorter one, it
# answers 0, so the agent keeps to it.
GPM_MIN_INTERVAL_S = 0.1
# XID codes counted apart per GPU; past them, the rest are counted as xid="other": a GPU in an
# event storm names at most this many series.
MAX_XID_CODES = 32
