"""Each GPU's health and efficiency figures, declared once: how NVML gives each (a health
figure's read: its call by name, arguments, the element of the answer it takes, scale and what
means absent; a GPM metric's ID), the unit each is published in and its family's name as a
scrape shows it, what it means, and the dcgm-exporter field it answers.

Health figures are read every 10 s off the scrape's path (collect/device_health.py), not every sweep: each is
one NVML call of under a millisecond (nvmlDeviceGetClockInfo, GetTemperatureV, GetPowerUsage,
GetFieldValues...), and nobody reads a temperature every 2 s. Efficiency figures come from
GPM (GPU Performance Monitoring, Hopper and newer: nvmlGpmSampleGet, nvmlGpmMetricsGet), read
once per engine window (collect/reading.py), over the window. Everything else follows from
these tables: the families (export/figure_families.py), the NVML reads (gpu/nvml_health.py),
the simulated values (sim/ answers each figure of the table), the dcgm-exporter names
(scripts/gen-dcgm-rules.py) and the docs' tables. How to add a figure: docs/layout.md,
"Adding a figure".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from otel_vgpu.conventions import Form, Kind, errors, temperature
from otel_vgpu.gpu.backend import ABSENT, ErrorCode

# nvml.h's arguments of the health reads: nvmlClockType_t, nvmlTemperatureSensors_t,
# nvmlMemoryErrorType_t and nvmlEccCounterType_t.
CLOCK_SM, CLOCK_MEM = 1, 2
TEMPERATURE_GPU = 0
ECC_CORRECTED, ECC_UNCORRECTED, ECC_VOLATILE = 0, 1, 0
# NVML field IDs (nvml.h): memory temperature, and the nanoseconds the clocks were held down
# by the power cap and by heat (the fields NVML names in place of the deprecated
# nvmlDeviceGetViolationStatus).
FIELD_MEMORY_TEMP = 82
FIELD_POWER_CAP_NS = 74
FIELD_THERMAL_NS = 269
# The compound reads (gpu/nvml_health.py `READS`): one call for several figures of different
# arguments, or a call asked only where another allows it.
FIELD_VALUES = "field_values"
"""nvmlDeviceGetFieldValues, once for every figure of this read, each its field ID in `args`."""
ECC = "ecc"
"""nvmlDeviceGetTotalEccErrors, only where nvmlDeviceGetEccMode (asked once a session) says ECC is on."""
# What nvidia-ml-py answers as a tuple, by call: each element named as nvml.h names the output
# parameter it holds, so that a figure `take`s its element by name. A struct's fields have
# their names already (nvidia-ml-py's ctypes structures, as nvml.h's).
TUPLES = {
    "nvmlDeviceGetRemappedRows": ("corrRows", "uncRows", "isPending", "failureOccurred"),
    "nvmlDeviceGetEncoderStats": ("sessionCount", "averageFps", "averageLatency"),
}


@dataclass(frozen=True, slots=True)
class HealthFigure:
    """One health figure of a GPU, in the unit it is published in."""

    name: str
    """Its family is `vgpu.gpu.<name>`."""
    unit: str
    """UCUM, as the family's (Hz, Cel, W, s, or an annotation such as {error})."""
    meaning: str
    prometheus_name: str = ""
    """Its family's name as a scrape shows it, written out so that a search for what a dashboard
    shows finds the figure (tests/unit/export/test_families.py holds it to the exposition's naming rules)."""
    counter: bool = False
    """It only grows while the driver stays loaded (a reload counts from 0 again)."""
    dcgm: str = ""
    """The dcgm-exporter field it answers (docs/coming-from.md); empty: none."""
    dcgm_scale: float = 1.0
    """This figure times `dcgm_scale` is the dcgm-exporter field's value (Hz to MHz: 1e-6; s to
    the violation fields' ns: 1e9, DCGM's dcgm_fields.h)."""
    call: str = ""
    """The NVML function that reads it, by its name in nvidia-ml-py (nvml.h's), asked with the
    GPU's handle and `args`."""
    args: tuple[int, ...] = ()
    """`call`'s arguments after the handle; for a compound `read`, what that read takes for this
    figure (a field ID)."""
    take: str = ""
    """The element of `call`'s answer that is the figure, where the answer holds several: a
    field of its struct, or an element of its tuple by the name `TUPLES` gives it. The figures
    of one call and arguments share that one call. Empty: the answer is the figure."""
    scale: float = 1.0
    """NVML's number times `scale` is the figure (MHz to Hz: 1e6); a scale under 1 (mW to W: 1e-3,
    ns to s: 1e-9) divides by its whole inverse, which rounds once (`published`)."""
    older: tuple[str, ...] = ()
    """The calls an older nvidia-ml-py has in place of `call`, taken in turn where it lacks the
    newer (nvmlDeviceGetTemperatureV, then nvmlDeviceGetTemperature)."""
    absent: frozenset[ErrorCode] = ABSENT
    """What NVML answers for a GPU or driver without the figure: it is left out, said once, and
    not asked again this NVML session. Any other error costs the figure that reading alone."""
    read: str = ""
    """The compound read that serves it with the others of the same `read` (`FIELD_VALUES`,
    `ECC`); empty: `call`, shared by the figures of the same call and arguments."""
    engine: str = ""
    """The engine (gpu/backend.py `ENGINES`) a GPU must have for the figure to be its: NVML
    answers a video engine's calls alike on a GPU without one (an H200 reads encoder
    utilization 0: bench/results/h200-engine-figures.md), so the figure is left out on a GPU
    that lacks the engine, as the engine's own families are. Empty: every GPU."""
    semconv: Form | None = None
    """Its family's form on the push with --otlp-names semconv (otel_vgpu/conventions.py); None:
    it keeps its name there."""

    def published(self, value: float) -> float:
        """NVML's number `value` in the unit the figure is published in."""
        return value * self.scale if self.scale >= 1 else value / round(1 / self.scale)

    def taken(self, answer: Any) -> Any:
        """The figure's element of its call's `answer` (`take`), NVML's number."""
        if not self.take:
            return answer
        if isinstance(answer, tuple | list):
            return answer[TUPLES[self.call].index(self.take)]
        return getattr(answer, self.take)


HEALTH_TABLE = (
    HealthFigure(
        "sm.clock",
        "Hz",
        "The SM clock (nvmlDeviceGetClockInfo, NVML_CLOCK_SM).",
        prometheus_name="vgpu_gpu_sm_clock_hertz",
        dcgm="DCGM_FI_DEV_SM_CLOCK",
        dcgm_scale=1e-6,
        call="nvmlDeviceGetClockInfo",
        args=(CLOCK_SM,),
        scale=1e6,
    ),
    HealthFigure(
        "memory.clock",
        "Hz",
        "The memory clock (nvmlDeviceGetClockInfo, NVML_CLOCK_MEM).",
        prometheus_name="vgpu_gpu_memory_clock_hertz",
        dcgm="DCGM_FI_DEV_MEM_CLOCK",
        dcgm_scale=1e-6,
        call="nvmlDeviceGetClockInfo",
        args=(CLOCK_MEM,),
        scale=1e6,
    ),
    HealthFigure(
        "temperature",
        "Cel",
        "The GPU die's temperature.",
        prometheus_name="vgpu_gpu_temperature_celsius",
        dcgm="DCGM_FI_DEV_GPU_TEMP",
        call="nvmlDeviceGetTemperatureV",
        args=(TEMPERATURE_GPU,),
        older=("nvmlDeviceGetTemperature",),
        semconv=temperature("gpu"),
    ),
    HealthFigure(
        "memory.temperature",
        "Cel",
        "The memory's temperature (NVML field NVML_FI_DEV_MEMORY_TEMP; HBM GPUs).",
        prometheus_name="vgpu_gpu_memory_temperature_celsius",
        dcgm="DCGM_FI_DEV_MEMORY_TEMP",
        call="nvmlDeviceGetFieldValues",
        args=(FIELD_MEMORY_TEMP,),
        read=FIELD_VALUES,
        semconv=temperature("memory"),
    ),
    HealthFigure(
        "power",
        "W",
        "Power drawn by the board (nvmlDeviceGetPowerUsage: a 1 s average on Ampere, GA100 aside, and newer).",
        prometheus_name="vgpu_gpu_power_watts",
        dcgm="DCGM_FI_DEV_POWER_USAGE",
        call="nvmlDeviceGetPowerUsage",
        scale=1e-3,
        semconv=Form("hw.power", "W", Kind.GAUGE, "Instantaneous power consumed by the component."),
    ),
    HealthFigure(
        "power.limit",
        "W",
        "The power limit the driver enforces, after every limiter (nvmlDeviceGetEnforcedPowerLimit).",
        prometheus_name="vgpu_gpu_power_limit_watts",
        dcgm="DCGM_FI_DEV_POWER_MGMT_LIMIT",
        call="nvmlDeviceGetEnforcedPowerLimit",
        scale=1e-3,
    ),
    HealthFigure(
        "pcie.replays",
        "{replay}",
        "PCIe replays: link-level retransmissions, a sign of a failing link or riser (nvmlDeviceGetPcieReplayCounter).",
        prometheus_name="vgpu_gpu_pcie_replays_total",
        counter=True,
        dcgm="DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        call="nvmlDeviceGetPcieReplayCounter",
    ),
    HealthFigure(
        "clock.event.reasons",
        "",
        "Why the clocks are below their maximum now, NVML's bitmask (nvmlDeviceGetCurrentClocksEventReasons): "
        "0x1 idle, 0x4 software power cap, 0x8 hardware slowdown, 0x10 sync boost, 0x20 software thermal, "
        "0x40 hardware thermal, 0x80 hardware power brake. docs/metrics.md has PromQL for each bit.",
        prometheus_name="vgpu_gpu_clock_event_reasons",
        dcgm="DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        call="nvmlDeviceGetCurrentClocksEventReasons",
        older=("nvmlDeviceGetCurrentClocksThrottleReasons",),
    ),
    HealthFigure(
        "power.violation",
        "s",
        "Time the clocks were held below their target by the power cap (NVML field "
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP, nanoseconds).",
        prometheus_name="vgpu_gpu_power_violation_seconds_total",
        counter=True,
        dcgm="DCGM_FI_DEV_POWER_VIOLATION",
        dcgm_scale=1e9,
        call="nvmlDeviceGetFieldValues",
        args=(FIELD_POWER_CAP_NS,),
        scale=1e-9,
        read=FIELD_VALUES,
    ),
    HealthFigure(
        "thermal.violation",
        "s",
        "Time the clocks were held below their target for heat (NVML field "
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, nanoseconds).",
        prometheus_name="vgpu_gpu_thermal_violation_seconds_total",
        counter=True,
        dcgm="DCGM_FI_DEV_THERMAL_VIOLATION",
        dcgm_scale=1e9,
        call="nvmlDeviceGetFieldValues",
        args=(FIELD_THERMAL_NS,),
        scale=1e-9,
        read=FIELD_VALUES,
    ),
    HealthFigure(
        "ecc.corrected",
        "{error}",
        "Corrected (single-bit) ECC errors since the driver loaded (nvmlDeviceGetTotalEccErrors, volatile); "
        "absent with ECC off.",
        prometheus_name="vgpu_gpu_ecc_corrected_total",
        counter=True,
        dcgm="DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        call="nvmlDeviceGetTotalEccErrors",
        args=(ECC_CORRECTED, ECC_VOLATILE),
        read=ECC,
        semconv=errors("corrected"),
    ),
    HealthFigure(
        "ecc.uncorrected",
        "{error}",
        "Uncorrected (double-bit) ECC errors since the driver loaded: data was lost, the GPU needs attention; "
        "absent with ECC off.",
        prometheus_name="vgpu_gpu_ecc_uncorrected_total",
        counter=True,
        dcgm="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        call="nvmlDeviceGetTotalEccErrors",
        args=(ECC_UNCORRECTED, ECC_VOLATILE),
        read=ECC,
        semconv=errors("uncorrected"),
    ),
    HealthFigure(
        "remapped.rows.correctable",
        "{row}",
        "Memory rows remapped after correctable errors (nvmlDeviceGetRemappedRows; Ampere and newer, not in MIG mode).",
        prometheus_name="vgpu_gpu_remapped_rows_correctable_total",
        counter=True,
        dcgm="DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        call="nvmlDeviceGetRemappedRows",
        take="corrRows",
    ),
    HealthFigure(
        "remapped.rows.uncorrectable",
        "{row}",
        "Memory rows remapped after uncorrectable errors.",
        prometheus_name="vgpu_gpu_remapped_rows_uncorrectable_total",
        counter=True,
        dcgm="DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        call="nvmlDeviceGetRemappedRows",
        take="uncRows",
    ),
    HealthFigure(
        "remapped.rows.pending",
        "",
        "1 while a row remap waits for the GPU's next reset to take effect, else 0.",
        prometheus_name="vgpu_gpu_remapped_rows_pending",
        call="nvmlDeviceGetRemappedRows",
        take="isPending",
    ),
    HealthFigure(
        "remapped.rows.failure",
        "",
        "1 when a row remap failed (the GPU has no spare rows left for that bank): replace or reset the GPU; else 0.",
        prometheus_name="vgpu_gpu_remapped_rows_failure",
        dcgm="DCGM_FI_DEV_ROW_REMAP_FAILURE",
        call="nvmlDeviceGetRemappedRows",
        take="failureOccurred",
    ),
    HealthFigure(
        "encoder.sessions",
        "{session}",
        "Encoding sessions open on the GPU's video encoders (NVENC), every process's (nvmlDeviceGetEncoderStats); "
        "none on a GPU without an encoder (A100, H100, H200).",
        prometheus_name="vgpu_gpu_encoder_sessions",
        call="nvmlDeviceGetEncoderStats",
        take="sessionCount",
        engine="encoder",
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
    io: str = ""
    """A byte rate whose bytes are also counted, its rate times each window summed as the busy
    seconds are (collect/gpm.py), and pushed only with --otlp-names semconv, as hw.gpu.io in this
    `network.io.direction`; empty: none."""
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
        io="transmit",
    ),
    GpmFigure(
        "pcie.receive",
        21,
        "PCIe traffic to the GPU (GPM PCIE_RX_PER_SEC)",
        unit="By/s",
        scale=MIB,
        dcgm="DCGM_FI_PROF_PCIE_RX_BYTES",
        io="receive",
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
GPM_BYTES = tuple(figure.name for figure in GPM_TABLE if figure.io)
# GPM's minimum interval between two samples (nvml.h, nvmlGpmMetricsGet: "should be greater than
# 100ms due to the internal sample refresh rate"); the driver does not refuse a shorter one, it
# answers 0, so the agent keeps to it.
GPM_MIN_INTERVAL_S = 0.1
# XID codes counted apart per GPU; past them, the rest are counted as xid="other": a GPU in an
# event storm names at most this many series.
MAX_XID_CODES = 32
