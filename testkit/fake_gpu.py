"""A GPU backend double for the reading policy's tests: one GPU with two processes, which
answers what it is set to and counts the calls it was asked."""

from __future__ import annotations

from dataclasses import dataclass, field

from otel_vgpu.gpu.backend import (
    AccountingRecord,
    Device,
    ErrorCode,
    GpuError,
    GpuProcess,
    HealthReading,
    MigDevice,
    UtilizationSample,
    XidEvent,
)

S = 1_000_000
GIB = 1024**3


@dataclass
class FakeBackend:
    """One GPU with two processes; the calls it was asked, and what it answers."""

    now: int = 100 * S
    samples: list[UtilizationSample] = field(default_factory=list)
    gpu_samples: list[tuple[int, float]] = field(default_factory=list)
    unsupported: bool = False
    migs: tuple[MigDevice, ...] = ()
    energy_mj: int | None = 5_000
    engines: frozenset[str] = frozenset()
    """The engines beside SM the GPU has."""
    engine_samples: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """The GPU's own samples of each engine."""
    gpm_figures: dict[str, float] | None = None
    """What each GPM read answers (after the first, which opens the window); None: no GPM."""
    memory: int = 10 * GIB
    """The memory in use its probe answers."""
    accounting: dict[int, AccountingRecord] | None = None
    """NVML's accounting buffer, by PID; None: accounting mode off."""
    calls: list[tuple[str, int]] = field(default_factory=list)
    """(call, since_us) of the sample reads; (call, 0) of the others."""

    def device_count(self) -> int:
        return 1

    def device(self, index: int) -> Device:
        return Device(index, "GPU-a", "H200", 141 * GIB, 10 * GIB, 0.5, migs=self.migs, engines=self.engines)

    def energy(self, index: int) -> int | None:
        self.calls.append(("energy", 0))
        return self.energy_mj

    def processes(self, index: int) -> list[GpuProcess]:
        self.calls.append(("listing", 0))
        return [GpuProcess(1, GIB), GpuProcess(2, GIB)]

    def accounting_pids(self, index: int) -> list[int] | None:
        return None if self.accounting is None else list(self.accounting)

    def accounting_stats(self, index: int, pid: int) -> AccountingRecord | None:
        self.calls.append(("accounting", pid))
        return None if self.accounting is None else self.accounting.get(pid)

    def memory_used(self, index: int) -> int:
        self.calls.append(("memory", 0))
        return self.memory

    def utilization_samples(self, index: int, since_us: int) -> list[UtilizationSample]:
        self.calls.append(("processes", since_us))
        if self.unsupported:
            raise GpuError(ErrorCode.NOT_SUPPORTED, "not supported")
        return [s for s in self.samples if s.timestamp_us > since_us]

    def gpu_utilization_samples(self, index: int, since_us: int, figure: str = "sm") -> list[tuple[int, float]]:
        self.calls.append(("gpu" if figure == "sm" else f"gpu:{figure}", since_us))
        samples = self.gpu_samples if figure == "sm" else self.engine_samples.get(figure, [])
        return [(t, v) for t, v in samples if t > since_us]

    def exclusive_process(self, index: int) -> bool | None:
        return False

    def health(self, index: int) -> HealthReading:
        self.calls.append(("health", 0))
        return HealthReading({"temperature": 40.0})

    def gpm(self, index: int, gpu_instance: int | None = None) -> dict[str, float] | None:
        self.calls.append(("gpm", 0 if gpu_instance is None else gpu_instance))
        first = sum(1 for name, _ in self.calls if name == "gpm") == 1
        return None if first or self.gpm_figures is None else dict(self.gpm_figures)

    def xid_events(self, index: int, most: int) -> list[XidEvent]:
        return []

    def now_us(self) -> int:
        return self.now

    def release(self) -> None: ...

    def resume(self) -> None: ...

    def close(self) -> None: ...


def asked(backend: FakeBackend, call: str) -> list[int]:
    return [since for name, since in backend.calls if name == call]
