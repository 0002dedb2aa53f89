"""What the agent needs from a GPU backend (NVML, or the simulated node)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Protocol


@dataclass(frozen=True, slots=True)
class MigDevice:
    """A MIG device (GPU instance + compute instance) carved from a GPU."""

    uuid: str
    """`MIG-<uuid>`: what the device plugin and NVML name it by."""
    profile: str
    """Its profile as nvidia-smi spells it, e.g. `1g.18gb` (from the NVML name)."""
    memory_total: int
    memory_used: int
    gpu_instance_id: int | None = None
    """GKE names MIG devices `nvidia<minor>/gi<id>` by it."""
    profile_id: int | None = None
    """GPU instance profile ID and placement start: the NVIDIA DRA driver's
    name for a MIG device holds both. None where NVML would not tell."""
    placement_start: int | None = None


@dataclass(frozen=True, slots=True)
class Device:
    index: int
    """NVML index on the host (PCI bus order, not CUDA's order)."""
    uuid: str
    model: str
    memory_total: int
    """Bytes."""
    memory_used: int
    """Bytes in use on the device: nvmlDeviceGetMemoryInfo's (v1) `used`, which nvml.h's nvmlMemory_t
    calls the "Sum of Reserved and Allocated device memory", the driver's reservation included."""
    utilization: float | None
    """Device SM utilization over NVML's last sample period, 0-1; None where
    NVML cannot tell (a GPU in MIG mode)."""
    minor_number: int | None = None
    """The N of /dev/nvidiaN: GKE's device plugin and the NVIDIA DRA driver name GPUs by it."""
    migs: tuple[MigDevice, ...] = ()
    """The MIG devices carved from this GPU (MIG mode only)."""
    utilization_window: float | None = None
    """Mean of the GPU's own utilization samples since the previous sweep, 0-1 (the
    sampler fills it in); None where NVML gave none."""
    energy_mj: int | None = None
    """The GPU's energy counter, millijoules since the driver loaded (Volta and newer), as the
    sampler read it (`GpuBackend.energy`); None where NVML has none, or it was not read."""
    energy_skipped: bool = False
    """The GPU has an energy counter that this sweep did not read (it is read less often
    than the sweeps run: one read costs more than the rest of a sweep)."""
    engines: frozenset[str] = frozenset()
    """Which of `ENGINES` the GPU has and the driver reports per process: an H200 has no
    encoder, and a driver before R550 gives no JPEG or optical-flow figure per process."""
    engine_window: Mapping[str, float] | None = None
    """The mean of the GPU's own samples of each of its engines over the engine window that
    closed in this sweep, 0-1 (collect/reading.py fills it in); None in a sweep that closed none."""
    gpm_window: Mapping[str, float] | None = None
    """Its GPM figures (gpu/device_figures.py `GPM_TABLE`) over the GPM window that closed in this
    sweep, read by collect/gpm_reads.py; None in a sweep that closed none, or without GPM."""
    gpm_seconds: float = 0.0
    """The length of that window."""
    gpm_instances: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    """Under MIG: each GPU instance's GPM figures over the same window, by GPU instance ID."""
    exclusive_process: bool | None = None
    """Whether its compute mode is EXCLUSIVE_PROCESS (one context at a time: under MPS, the
    server's), as the NVIDIA device plugin's MPS daemon sets it; read only on a GPU whose
    processes include MPS clients (collect/reading.py), None elsewhere."""
    accounting_mode: bool | None = None
    """Whether NVML's accounting mode is on (an administrator's `nvidia-smi -am 1`), as the
    sweep read it (collect/reading.py); None where it was not asked (MIG, no per-process figures)."""
    memory_reserved: int | None = None
    """Bytes the driver and firmware keep for themselves, part of `memory_used`:
    nvmlDeviceGetMemoryInfo_v2's `reserved` (nvmlMemory_v2_t: "Device memory (in bytes) reserved
    for system use (driver or firmware)"); None where the driver or nvidia-ml-py has no v2."""
    pci_bus_id: str | None = None
    """nvmlDeviceGetPciInfo's `busId`, domain:bus:device.function as "00000000:3B:00.0" (nvml.h's
    nvmlPciInfo_t: "The tuple domain:bus:device.function PCI identifier"), the form dcgm-exporter's
    pci_bus_id label writes; None where NVML would not tell."""
    driver_version: str | None = None
    """The driver's version, nvmlSystemGetDriverVersion ("580.159.04"): one per node, read once per
    NVML session; None where NVML would not tell."""

    @property
    def mig_mode(self) -> bool:
        return bool(self.migs)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    """The PID in the agent's PID namespace, where NVML translates it (the host's, with hostPID)."""
    used_memory: int | None
    """Bytes, or None where NVML cannot tell (WDDM)."""
    mig_uuid: str | None = None
    """The MIG device the process runs on; None on a GPU not in MIG mode."""
    mps_client: bool = False
    """NVML lists it among the GPU's MPS clients (nvmlDeviceGetMPSComputeRunningProcesses):
    the driver's word, which no process name changes. NVML gives its SM samples to its server."""


@dataclass(frozen=True, slots=True)
class ProcessUse:
    """What one process (or a pod's processes together) used of a GPU over a period, each
    figure 0-1, as NVML's per-process samples give them. A figure added here is summed per
    pod, averaged over windows and capped like the others (gpu/sampling.py,
    collect/aggregate.py), whatever it measures."""

    sm: float = 0.0
    """Share of the GPU's SMs (smUtil)."""
    memory_copy: float = 0.0
    """Share of the time device memory was being read or written (memUtil)."""
    encoder: float = 0.0
    """Share of the video encoders' time (NVENC, encUtil)."""
    decoder: float = 0.0
    """Share of the video decoders' time (NVDEC, decUtil)."""
    jpeg: float = 0.0
    """Share of the JPEG decoders' time (NVJPG, jpgUtil; R550 and newer)."""
    optical_flow: float = 0.0
    """Share of the optical-flow accelerator's time (OFA, ofaUtil; R550 and newer)."""

    # Field by field, not by `USE_FIGURES`: these run per process per sweep, and a dict of
    # getattr calls costs three times as much. tests/unit/gpu/test_sampling.py checks each names every figure.
    def plus(self, other: ProcessUse) -> ProcessUse:
        return ProcessUse(
            self.sm + other.sm,
            self.memory_copy + other.memory_copy,
            self.encoder + other.encoder,
            self.decoder + other.decoder,
            self.jpeg + other.jpeg,
            self.optical_flow + other.optical_flow,
        )

    def capped(self) -> ProcessUse:
        """Each figure at most 1: processes that together ask for more than a whole GPU get all of it."""
        return ProcessUse(
            min(1.0, self.sm),
            min(1.0, self.memory_copy),
            min(1.0, self.encoder),
            min(1.0, self.decoder),
            min(1.0, self.jpeg),
            min(1.0, self.optical_flow),
        )


USE_FIGURES = tuple(f.name for f in fields(ProcessUse))

use_figures = operator.attrgetter(*USE_FIGURES)
"""A `ProcessUse`'s figures as a tuple, in the order of `USE_FIGURES` (its fields'): one C call
where the ledger reads every figure of every sample and life at each sweep."""


@dataclass(frozen=True, slots=True)
class AccountingRecord:
    """NVML's accounting of one process over its whole life (nvmlAccountingStats_t, nvml.h:
    "accounting stats capture GPU utilization and other statistics across the lifetime of a
    process", kept after it ends in a circular buffer), where an administrator turned
    accounting mode on (`nvidia-smi -am 1`; the agent never does)."""

    pid: int
    started_us: int
    """startTime: when it started, a CPU timestamp in microseconds (the samples' clock)."""
    seconds: float
    """time: how long its compute context was active, in seconds; 0 while it runs."""
    running: bool
    """isRunning."""
    sm: float
    """gpuUtilization: the share of its life in which one or more of its kernels ran, 0-1."""
    memory_copy: float
    """memoryUtilization: the share of its life in which device memory was read or written, 0-1."""


@dataclass(frozen=True, slots=True)
class Engine:
    """One of a GPU's engines beside its SMs, declared once, with what each part of the agent
    needs of it: NVML's names (gpu/nvml.py), the help texts (export/figure_families.py), the
    simulated node's scenario fields (sim/pod_fields.py). Its figure is the `ProcessUse` field
    of its name; a field of ProcessUse with no declaration here fails tests/unit/export/test_families.py."""

    name: str
    meaning: str
    """What its figure is, for the help texts."""
    sampling_type: int
    """NVML's nvmlSamplingType_t of the GPU's own buffer of it (nvml.h)."""
    sample_field: str
    """Its field in NVML's per-process samples (nvmlProcessUtilizationSample_t, ...InfoV1)."""
    profile_field: str | None = None
    """Its count in nvmlGpuInstanceProfileInfo_v2_t, which says whether a GPU has it; None: every GPU has it."""
    utilization_call: str | None = None
    """The NVML call a GPU without it refuses, asked where the GPU has no profiles."""
    newer_call_only: bool = False
    """Given per process only by nvmlDeviceGetProcessesUtilizationInfo (drivers R550 and newer)."""
    per_pod: bool = True
    """Published per pod (collect/engines.py): not memory copy, export/figure_families.py's
    POD_ENGINES says why."""
    task: str | None = None
    """Its `hw.gpu.task` on the push with --otlp-names semconv (otel_vgpu/conventions.py), its
    utilization pushed as hw.gpu.utilization; None: none, the figure keeps its name (memory
    copy is the memory's busy time, not the fraction of memory used that
    hw.gpu.memory.utilization is)."""


# nvmlSamplingType_t of the SMs' own buffer, and the per-process samples' field for them.
SM_SAMPLING_TYPE = 1
SM_SAMPLE_FIELD = "smUtil"
ENGINE_TABLE: tuple[Engine, ...] = (
    Engine(
        "memory_copy",
        "the time device memory was being read or written (NVML's MEMORY samples): high on a GPU "
        "whose pods are bound by memory bandwidth, such as LLMs decoding",
        sampling_type=2,
        sample_field="memUtil",
        per_pod=False,
    ),
    Engine(
        "encoder",
        "the video encoders' (NVENC) time",
        sampling_type=3,
        sample_field="encUtil",
        profile_field="encoderCount",
        utilization_call="nvmlDeviceGetEncoderUtilization",
        task="encoder",
    ),
    Engine(
        "decoder",
        "the video decoders' (NVDEC) time",
        sampling_type=4,
        sample_field="decUtil",
        profile_field="decoderCount",
        utilization_call="nvmlDeviceGetDecoderUtilization",
        task="decoder",
    ),
    Engine(
        "jpeg",
        "the JPEG decoders' (NVJPG) time (drivers R550 and newer)",
        sampling_type=8,
        sample_field="jpgUtil",
        profile_field="jpegCount",
        utilization_call="nvmlDeviceGetJpgUtilization",
        newer_call_only=True,
        task="jpeg",
    ),
    Engine(
        "optical_flow",
        "the optical-flow accelerator's (OFA) time (drivers R550 and newer)",
        sampling_type=9,
        sample_field="ofaUtil",
        profile_field="ofaCount",
        utilization_call="nvmlDeviceGetOfaUtilization",
        newer_call_only=True,
        task="optical_flow",
    ),
)
ENGINES = tuple(engine.name for engine in ENGINE_TABLE)
"""The figures beside SM, each of one engine of the GPU: per pod over engine windows
(collect/engines.py), and only on a GPU that has the engine (`Device.engines`)."""


@dataclass(frozen=True, slots=True)
class XidEvent:
    """An XID error NVML reported for a GPU (nvmlEventTypeXidCriticalError): `xid` is its code,
    999 where the driver does not know it (nvml.h, nvmlEventData_t)."""

    index: int
    uuid: str
    xid: int


@dataclass(frozen=True, slots=True)
class UtilizationSample:
    pid: int
    timestamp_us: int
    """CPU wall-clock time of the sample, in microseconds."""
    use: ProcessUse
    """What the process used over the sample's period."""


class ErrorCode(str, Enum):
    """NVML's return codes (`nvmlReturn_t` in nvml.h), by name, with their
    numbers. The only error codes the agent knows: the NVML seam (nvml_session.py)
    maps NVML's numbers to them, the simulated node and scenario files name
    them, the sampler decides on them."""

    UNINITIALIZED = "UNINITIALIZED"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_SUPPORTED = "NOT_SUPPORTED"
    NO_PERMISSION = "NO_PERMISSION"
    ALREADY_INITIALIZED = "ALREADY_INITIALIZED"
    NOT_FOUND = "NOT_FOUND"
    INSUFFICIENT_SIZE = "INSUFFICIENT_SIZE"
    INSUFFICIENT_POWER = "INSUFFICIENT_POWER"
    DRIVER_NOT_LOADED = "DRIVER_NOT_LOADED"
    TIMEOUT = "TIMEOUT"
    IRQ_ISSUE = "IRQ_ISSUE"
    LIBRARY_NOT_FOUND = "LIBRARY_NOT_FOUND"
    FUNCTION_NOT_FOUND = "FUNCTION_NOT_FOUND"
    CORRUPTED_INFOROM = "CORRUPTED_INFOROM"
    GPU_IS_LOST = "GPU_IS_LOST"
    RESET_REQUIRED = "RESET_REQUIRED"
    OPERATING_SYSTEM = "OPERATING_SYSTEM"
    LIB_RM_VERSION_MISMATCH = "LIB_RM_VERSION_MISMATCH"
    IN_USE = "IN_USE"
    MEMORY = "MEMORY"
    NO_DATA = "NO_DATA"
    VGPU_ECC_NOT_SUPPORTED = "VGPU_ECC_NOT_SUPPORTED"
    INSUFFICIENT_RESOURCES = "INSUFFICIENT_RESOURCES"
    FREQ_NOT_SUPPORTED = "FREQ_NOT_SUPPORTED"
    ARGUMENT_VERSION_MISMATCH = "ARGUMENT_VERSION_MISMATCH"
    DEPRECATED = "DEPRECATED"
    NOT_READY = "NOT_READY"
    GPU_NOT_FOUND = "GPU_NOT_FOUND"
    INVALID_STATE = "INVALID_STATE"
    RESET_TYPE_NOT_SUPPORTED = "RESET_TYPE_NOT_SUPPORTED"
    UNKNOWN = "UNKNOWN"
    """Also what a number this table does not know (a newer driver's) becomes."""


# NVML's numbers for them (nvml.h; tests/unit/gpu/test_nvml.py checks them against nvidia-ml-py).
NVML_RETURN_VALUES: dict[int, ErrorCode] = {
    **{number: code for number, code in enumerate(list(ErrorCode)[:-1], start=1)},
    999: ErrorCode.UNKNOWN,
}
# What NVML answers for a call this driver (FUNCTION_NOT_FOUND: an older library) or
# this GPU (NOT_SUPPORTED: no counter, no MIG, a vGPU guest) does not have.
ABSENT = frozenset({ErrorCode.NOT_SUPPORTED, ErrorCode.FUNCTION_NOT_FOUND})


class GpuError(Exception):
    """A backend call failed with `code`; the message says what failed, for people."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class FailedRead:
    """One read of a GPU's health that failed, and the figures it would have given."""

    figures: tuple[str, ...]
    """By name (gpu/device_figures.py `HEALTH_TABLE`): one, or those of a read that gives several."""
    error: GpuError


@dataclass(frozen=True, slots=True)
class HealthReading:
    """A GPU's health figures read now, by name, in their units; and the reads that failed, whose
    figures are left out of this reading alone."""

    figures: dict[str, float]
    failed: tuple[FailedRead, ...] = ()


class GpuBackend(Protocol):
    """One GPU source. Every call may raise GpuError."""

    def device_count(self) -> int: ...

    def device(self, index: int) -> Device: ...

    def energy(self, index: int) -> int | None:
        """The GPU's energy counter in millijoules since the driver loaded; None where it has none."""
        ...

    def processes(self, index: int) -> list[GpuProcess]:
        """Compute and graphics processes, each PID once; on a GPU in MIG
        mode, listed per MIG device (`device` was called first)."""
        ...

    def memory_used(self, index: int) -> int:
        """The GPU's memory in use, in bytes: what the process watch probes between its
        listings, since a process that comes (its context) or goes changes it."""
        ...

    def utilization_samples(self, index: int, since_us: int) -> list[UtilizationSample]:
        """Per-process samples newer than `since_us`; empty when there are none."""
        ...

    def gpu_utilization_samples(self, index: int, since_us: int, figure: str = "sm") -> list[tuple[int, float]]:
        """The GPU's own samples of `figure` (SM, or one of `ENGINES`) newer than `since_us`: (timestamp, 0-1)."""
        ...

    def exclusive_process(self, index: int) -> bool | None:
        """Whether the GPU's compute mode is EXCLUSIVE_PROCESS; None where NVML cannot tell."""
        ...

    def accounting_pids(self, index: int) -> list[int] | None:
        """The PIDs NVML's accounting buffer holds for the GPU, running or ended
        (nvmlDeviceGetAccountingPids); None where accounting mode is off or the GPU has none."""
        ...

    def accounting_stats(self, index: int, pid: int) -> AccountingRecord | None:
        """NVML's accounting of process `pid` on the GPU (nvmlDeviceGetAccountingStats: of the
        latest process to hold the PID); None where the buffer has none."""
        ...

    def health(self, index: int) -> HealthReading:
        """The GPU's health figures now (gpu/device_figures.py `HEALTH_TABLE`), in their units;
        a figure the GPU or driver does not have is absent (said once, never 0), and one whose
        read failed otherwise is absent from this reading, with its failure. GpuError is the
        GPU's or the session's (lost), which every figure shares."""
        ...

    def gpm(self, index: int, gpu_instance: int | None = None) -> dict[str, float] | None:
        """The GPU's GPM figures (`GPM_TABLE`, in their units) since the previous call for the
        same GPU or MIG GPU instance; None on the first call, and where the GPU has no GPM."""
        ...

    def xid_events(self, index: int, most: int) -> list[XidEvent]:
        """Up to `most` of the XID errors queued for GPU `index`, oldest first, without waiting;
        [] when none is, and while the driver is released. Each GPU's are queued apart, so that
        one GPU's storm holds back no other GPU's. GpuError is that GPU's alone (GPU_IS_LOST).
        Safe to call from one thread beside the others."""
        ...

    def now_us(self) -> int:
        """The clock the samples are stamped with."""
        ...

    def release(self) -> None:
        """Let go of the driver (NVML shut down, its device files closed), so
        that it can be unloaded; calls raise GpuError until `resume`."""
        ...

    def resume(self) -> None:
        """The driver may be used again: the next call initialises it at once."""
        ...

    def close(self) -> None: ...
