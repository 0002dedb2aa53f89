"""What the agent needs from a GPU backend (NVML, or the simulated node)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Device:
    index: int
    """NVML index on the host (PCI bus order, not CUDA's order)."""
    uuid: str
    model: str
    memory_total: int
    """Bytes."""
    memory_used: int
    """Bytes in use on the device, as NVML counts them (driver reservations included)."""
    utilization: float
    """Device SM utilization over NVML's last sample period, 0-1."""
    mig_uuids: tuple[str, ...] = ()
    """UUIDs of the MIG devices carved from this GPU (MIG mode only)."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    """The PID in the agent's PID namespace, where NVML translates it (the host's, with hostPID)."""
    used_memory: int | None
    """Bytes, or None where NVML cannot tell (MIG, WDDM)."""


@dataclass(frozen=True, slots=True)
class UtilizationSample:
    pid: int
    timestamp_us: int
    """CPU wall-clock time of the sample, in microseconds."""
    sm: float
    """SM utilization of the process over the sample period, 0-1."""


class GpuError(Exception):
    """A backend call failed. `code` is a short stable name (for logs and
    de-duplication), e.g. `GPU_IS_LOST`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class GpuBackend(Protocol):
    """One GPU source. Every call may raise GpuError."""

    def device_count(self) -> int: ...

    def device(self, index: int) -> Device: ...

    def processes(self, index: int) -> list[GpuProcess]:
        """Compute and graphics processes, each PID once."""
        ...

    def utilization_samples(self, index: int, since_us: int) -> list[UtilizationSample]:
        """Per-process samples newer than `since_us`; empty when there are none."""
        ...

    def now_us(self) -> int:
        """The clock the samples are stamped with."""
        ...

    def close(self) -> None: ...
