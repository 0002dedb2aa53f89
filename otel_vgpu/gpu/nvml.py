"""The GPU backend on a real node: NVML through nvidia-ml-py.

Without the library at all the agent refuses to start; any other failure to initialise is
retried with backoff, and a session lost mid-run is initialised anew, without a restart
(gpu/nvml_session.py, through which every call below asks NVML by name).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from otel_vgpu.config import DEFAULT_BACKOFF, Backoff
from otel_vgpu.gpu.backend import (
    ABSENT,
    ENGINE_TABLE,
    ENGINES,
    SM_SAMPLE_FIELD,
    SM_SAMPLING_TYPE,
    AccountingRecord,
    Device,
    ErrorCode,
    GpuError,
    GpuProcess,
    HealthReading,
    MigDevice,
    ProcessUse,
    UtilizationSample,
    XidEvent,
)
from otel_vgpu.gpu.nvml_health import GpmSamples, XidEventSets, read_health
from otel_vgpu.gpu.nvml_session import ANY_ERROR, DRIVER, EMPTY, NO_LIBRARY, NO_SAMPLES, NvmlSession, Scope

log = logging.getLogger(__name__)


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine. The message is one line for the user."""


def _load_pynvml() -> ModuleType:
    try:
        import pynvml  # noqa: PLC0415 - imported only on a real node
    except ImportError as error:  # pragma: no cover - it is a dependency
        raise NvmlUnavailable(f"the nvidia-ml-py package is not installed ({error})") from None
    module: ModuleType = pynvml
    return module


# nvmlSamplingType_t (nvml.h): the GPU's own sample buffer of each figure (gpu/backend.py declares the engines').
SAMPLING_TYPES = {"sm": SM_SAMPLING_TYPE, **{engine.name: engine.sampling_type for engine in ENGINE_TABLE}}
# Each engine a GPU may lack: its count in a GPU-instance profile (nvmlGpuInstanceProfileInfo_v2_t),
# and the call that gives its utilization.
ENGINE_FIELDS = {
    engine.name: (engine.profile_field, engine.utilization_call or "")
    for engine in ENGINE_TABLE
    if engine.profile_field is not None
}
# What only the per-process call of R550 and newer (nvmlDeviceGetProcessesUtilizationInfo) gives.
V2_ONLY = frozenset(engine.name for engine in ENGINE_TABLE if engine.newer_call_only)
# The per-process call of R550 and newer, and the older one it replaces.
PROCESSES_V2, PROCESSES_V1 = "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"
# A listing NVML sized, then found too small because processes started in
# between: asked again this many times.
LISTING_ATTEMPTS = 3
# Compute, graphics and (where the library and driver have it) MPS client processes; the first
# every driver has, and the last lists MPS clients.
LISTINGS = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses",
)
MPS_LISTING = LISTINGS[2]
# nvmlComputeMode_t (nvml.h): one context at a time, which MPS makes its server's.
COMPUTEMODE_EXCLUSIVE_PROCESS = 3
# nvmlEnableState_t's NVML_FEATURE_ENABLED (nvml.h).
FEATURE_ENABLED = 1


class NvmlBackend:
    """Reads devices, processes and process utilization from NVML.

    `nvml` is the nvidia-ml-py module; tests pass a double with the same
    functions and error classes, since no GPU is available to them.
    """

    def __init__(
        self,
        nvml: ModuleType | Any = None,
        clock: Callable[[], float] = time.monotonic,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self._nvml = nvml if nvml is not None else _load_pynvml()
        self._handles: dict[int, Any] = {}
        self._minors: dict[int, int | None] = {}
        self._identities: dict[int, tuple[str, str, str | None]] = {}
        """(UUID, name, PCI bus id) by index: fixed while the NVML session lives (a GPU's index can
        change only across a re-initialisation, which forgets them); two driver calls
        fewer per GPU and sweep."""
        self._driver_version: str | None = None
        """nvmlSystemGetDriverVersion's answer, once per NVML session: a driver changes only
        across a re-initialisation."""
        self._session_figures: dict[tuple[int, str], Any] = {}
        """What holds for an NVML session, by (GPU index, figure): the ECC mode, the memory the
        driver reserves."""
        self._engines: dict[int, frozenset[str]] = {}
        """The engines each GPU has, by index: fixed while the NVML session lives."""
        self._mig_handles: dict[int, list[tuple[Any, str | None]]] = {}
        self._mig_static: dict[str, tuple[str, int | None, int | None, int | None]] = {}
        self._session = NvmlSession(self._nvml, clock, backoff, let_go=self._let_go, forget=self._forget_handles)
        self._query, self._call = self._session.query, self._session.call
        self._gpm = GpmSamples(self._nvml, self._session, clock)
        self._xids = XidEventSets(self._session, self._identified)
        try:
            self._session.initialise()
        except GpuError as error:
            if error.code in NO_LIBRARY:
                raise NvmlUnavailable(
                    f"NVML (libnvidia-ml.so.1, from the NVIDIA driver) could not be initialised: "
                    f"{error}; on a machine without a GPU use --simulate"
                ) from None
            log.warning("NVML could not be initialised (%s); retrying with backoff", error)

    @property
    def ready(self) -> bool:
        return self._session.ready

    def _forget_handles(self) -> None:
        """What holds for one NVML session, dropped as one starts or ends."""
        self._session_figures.clear()
        self._handles.clear()
        self._minors.clear()
        self._identities.clear()
        self._driver_version = None
        self._engines.clear()
        self._mig_handles.clear()
        self._mig_static.clear()

    def release(self) -> None:
        self._session.release()

    def resume(self) -> None:
        self._session.resume()

    def device_count(self) -> int:
        self._session.ensure()
        return int(self._call("nvmlDeviceGetCount"))

    def device(self, index: int) -> Device:
        handle = self._handle(index)
        # v1 (nvmlMemory_t): its `used` is the "Sum of Reserved and Allocated device memory"
        # (nvml.h), what the processes allocated and what the driver reserves (`_reserved`).
        memory = self._call("nvmlDeviceGetMemoryInfo", handle)
        uuid, model, bus_id = self._identity(index, handle)
        migs = self._migs(index, handle)
        return Device(
            index=index,
            uuid=uuid,
            model=model,
            memory_total=int(memory.total),
            memory_used=int(memory.used),
            # NVML has no device utilization for a GPU in MIG mode.
            utilization=None if migs else self._utilization(handle),
            minor_number=self._minor_number(index, handle),
            migs=migs,
            engines=frozenset() if migs else self._engines_of(index, handle),
            memory_reserved=self._reserved(index, handle),
            pci_bus_id=bus_id,
            driver_version=self._driver(),
        )

    def _driver(self) -> str | None:
        """nvmlSystemGetDriverVersion (nvml.h: "Retrieves the version of the system's graphics
        driver"), asked once per NVML session; None where it is not answered, which costs the GPU
        nothing but its info series' driver_version."""
        if self._driver_version is None:
            version = self._query(
                "nvmlSystemGetDriverVersion",
                default=None,
                scope=DRIVER,
                say="NVML gives no driver version here: vgpu_gpu_info has no driver_version",
            )
            self._driver_version = None if version is None else _text(version)
        return self._driver_version

    def _reserved(self, index: int, handle: Any) -> int | None:
        """nvmlDeviceGetMemoryInfo_v2's `reserved`: what the driver and firmware keep of the GPU's
        memory, part of v1's `used` (nvml.h's nvmlMemory_t: "Sum of Reserved and Allocated device
        memory"), which stays the published figure. v2's own `used` is not taken: nvml.h's
        nvmlMemory_v2_t calls it "Allocated device memory", its function's comment says it
        "includes" the reserved amount, and only v1's meaning is one nvml.h gives alike
        everywhere. A driver without v2 (before R510: FUNCTION_NOT_FOUND, or a version it does
        not know) or a GPU that does not give it (NOT_SUPPORTED) has no figure, and is not asked
        again this session; nor has an nvidia-ml-py without the structure. Read once a session:
        the reservation is the driver's own, the same idle and under load (615.0625 MiB on an
        H200 with driver 580: bench/results/h200-memory-identity.md), so a sweep makes one memory
        call a GPU, not two."""
        key = (index, "memory_reserved")
        if key in self._session_figures:
            reserved: int | None = self._session_figures[key]
            return reserved
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        if version is None:
            return None
        # nvidia-ml-py's nvmlDeviceGetMemoryInfo with a version calls nvmlDeviceGetMemoryInfo_v2,
        # a symbol the driver may lack (its FUNCTION_NOT_FOUND).
        memory = self._query(
            "nvmlDeviceGetMemoryInfo",
            handle,
            version,
            default=None,
            absent=ABSENT | {ErrorCode.ARGUMENT_VERSION_MISMATCH},
            scope=Scope(gpu=index, figure="memory_reserved"),
            say=f"GPU {index}'s driver has no nvmlDeviceGetMemoryInfo_v2: vgpu_gpu_memory_reserved_bytes is left out",
        )
        reserved = self._session_figures[key] = None if memory is None else int(memory.reserved)
        return reserved

    def energy(self, index: int) -> int | None:
        return self._energy(index, self._handle(index))

    def memory_used(self, index: int) -> int:
        # nvmlDeviceGetMemoryInfo: 0.007 ms on an H200, where the three process listings cost
        # 0.09 ms and more with each process (bench/results/h200-sweep-cost.md).
        return int(self._call("nvmlDeviceGetMemoryInfo", self._handle(index)).used)

    def _identity(self, index: int, handle: Any) -> tuple[str, str, str | None]:
        identity = self._identities.get(index)
        if identity is None:
            uuid = _text(self._call("nvmlDeviceGetUUID", handle))
            name = _text(self._call("nvmlDeviceGetName", handle))
            # nvmlDeviceGetPciInfo (nvidia-ml-py: _v3): nvml.h's nvmlPciInfo_t `busId`, "The tuple
            # domain:bus:device.function PCI identifier", 00000000:3B:00.0, as DCGM gives it to
            # dcgm-exporter's pci_bus_id; not `busIdLegacy`, whose domain has 4 digits.
            pci = self._query(
                "nvmlDeviceGetPciInfo",
                handle,
                default=None,
                scope=Scope(gpu=index),
                say=f"GPU {index} gives no PCI info: its vgpu_gpu_info has no pci_bus_id",
            )
            identity = self._identities[index] = (uuid, name, None if pci is None else _text(pci.busId))
        return identity

    def _energy(self, index: int, handle: Any) -> int | None:
        """nvmlDeviceGetTotalEnergyConsumption; a GPU without the counter (before Volta, some
        vGPU guests) is not asked again in this NVML session."""
        energy = self._query(
            "nvmlDeviceGetTotalEnergyConsumption",
            handle,
            default=None,
            scope=Scope(gpu=index),
            say=f"GPU {index} has no energy counter: its energy families are left out",
        )
        return None if energy is None else int(energy)

    def _utilization(self, handle: Any) -> float | None:
        rates = self._query("nvmlDeviceGetUtilizationRates", handle, default=None)
        return None if rates is None else float(rates.gpu) / 100.0

    def _engines_of(self, index: int, handle: Any) -> frozenset[str]:
        """Which of `ENGINES` GPU `index` has (`_engines_held`) and the driver reports per
        process: not those only R550's per-process call gives, where the driver lacks it."""
        engines = self._engines_held(index, handle)
        if self._session.lacks(PROCESSES_V2, Scope(gpu=index)):
            return engines - V2_ONLY
        return engines

    def _engines_held(self, index: int, handle: Any) -> frozenset[str]:
        """Which of `ENGINES` GPU `index` has, asked once per session.

        NVML answers the video engines' calls alike on a GPU that has the engine and on
        one that has none (an H200 reads encoder 0, capacity 100: bench/results/
        h200-engine-figures.md). A GPU that can be partitioned (MIG: A100, A30, H100, H200,
        B200) tells what it holds through its GPU-instance profiles, whatever its MIG mode:
        the largest profile holds every engine, so a count of 0 in all of them means no
        such engine (the H200's: 7 decoders, 7 JPEG, 1 optical flow, 0 encoders). On a
        GPU without profiles (T4, L4, A10, L40S) NVML's word is taken: an engine whose
        utilization call is not supported is absent. Memory copy is on every GPU."""
        engines = self._engines.get(index)
        if engines is None:
            counts = self._profile_engine_counts(handle)
            if not counts:
                counts = {
                    engine: int(bool(call) and self._query(call, handle, default=None) is not None)
                    for engine, (_, call) in ENGINE_FIELDS.items()
                }
            engines = self._engines[index] = frozenset(e for e in ENGINES if counts.get(e, 1) > 0)
        return engines

    def _profile_engine_counts(self, handle: Any) -> dict[str, int]:
        """The most of each video engine a GPU-instance profile of this GPU holds; {} where NVML
        has no profile for it (no MIG, or a driver without the call). Asked once per session."""
        counts: dict[str, int] = {}
        profiles = int(getattr(self._nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))
        for profile in range(profiles):
            info = self._query("nvmlDeviceGetGpuInstanceProfileInfo", handle, profile, default=None, absent=ANY_ERROR)
            if info is None:
                continue
            for engine, (field, _) in ENGINE_FIELDS.items():
                counts[engine] = max(counts.get(engine, 0), int(getattr(info, field)))
        return counts

    def _minor_number(self, index: int, handle: Any) -> int | None:
        if index not in self._minors:
            minor = self._query("nvmlDeviceGetMinorNumber", handle, default=None)
            self._minors[index] = None if minor is None else int(minor)
        return self._minors[index]

    def _migs(self, index: int, handle: Any) -> tuple[MigDevice, ...]:
        """The MIG devices of a GPU in MIG mode, () otherwise. Their handles
        are kept for `processes`, which lists per MIG device: on the parent's
        handle NVML lists processes only to a privileged caller."""
        nvml = self._nvml
        self._mig_handles[index] = []
        # A GPU without MIG (or a driver without the call) is not asked again this session.
        mode = self._query("nvmlDeviceGetMigMode", handle, default=None, scope=Scope(gpu=index))
        if mode is None or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
            return ()
        migs = []
        for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle))):
            mig = self._query("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, default=None, absent=EMPTY)
            if mig is None:
                continue
            uuid = _text(self._call("nvmlDeviceGetUUID", mig))
            memory = self._call("nvmlDeviceGetMemoryInfo", mig)
            static = self._mig_static.get(uuid)
            if static is None:
                static = self._mig_static[uuid] = self._mig_identity(handle, mig)
            profile, gpu_instance, profile_id, placement = static
            migs.append(
                MigDevice(
                    uuid=uuid,
                    profile=profile,
                    memory_total=int(memory.total),
                    memory_used=int(memory.used),
                    gpu_instance_id=gpu_instance,
                    profile_id=profile_id,
                    placement_start=placement,
                )
            )
            self._mig_handles[index].append((mig, uuid))
        return tuple(migs)

    def _mig_identity(self, parent: Any, mig: Any) -> tuple[str, int | None, int | None, int | None]:
        """What names a MIG device and does not change while it exists:
        profile, GPU instance ID, profile ID and placement start. The last
        two need the GPU instance's handle, which NVML may refuse to an
        unprivileged caller; they are then unknown, not an error."""
        profile = mig_profile(_text(self._call("nvmlDeviceGetName", mig)))
        gpu_instance = self._query("nvmlDeviceGetGpuInstanceId", mig, default=None, absent=ANY_ERROR)
        if gpu_instance is None:
            return profile, None, None, None
        instance = self._query("nvmlDeviceGetGpuInstanceById", parent, gpu_instance, default=None, absent=ANY_ERROR)
        info = None
        if instance is not None:
            info = self._query("nvmlGpuInstanceGetInfo", instance, default=None, absent=ANY_ERROR)
        if info is None:
            return profile, int(gpu_instance), None, None
        return profile, int(gpu_instance), int(info.profileId), int(info.placement.start)

    def processes(self, index: int) -> list[GpuProcess]:
        handle = self._handle(index)
        migs = self._mig_handles.get(index) or [(handle, None)]
        merged: dict[int, GpuProcess] = {}
        for device_handle, mig_uuid in migs:
            for listing in LISTINGS:
                client = listing == MPS_LISTING
                for info in self._listing(listing, device_handle):
                    pid = int(info.pid)
                    used = None if info.usedGpuMemory is None else int(info.usedGpuMemory)
                    previous = merged.get(pid)
                    # A process on several lists (CUDA and graphics contexts,
                    # MPS clients) holds one allocation that NVML reports in
                    # each: count it once, a client if the MPS list has it.
                    if previous is None or (previous.used_memory is None and used is not None):
                        was_client = previous is not None and previous.mps_client
                        previous = merged[pid] = GpuProcess(pid, used, mig_uuid, was_client)
                    if client and not previous.mps_client:
                        merged[pid] = dataclasses.replace(previous, mps_client=True)
        return list(merged.values())

    def exclusive_process(self, index: int) -> bool | None:
        mode = self._query("nvmlDeviceGetComputeMode", self._handle(index), default=None, scope=Scope(gpu=index))
        return None if mode is None else int(mode) == COMPUTEMODE_EXCLUSIVE_PROCESS

    def accounting_pids(self, index: int) -> list[int] | None:
        """nvmlDeviceGetAccountingPids where nvmlDeviceGetAccountingMode says accounting is on
        (nvml.h: "accounting mode needs to be on"); a GPU without it answers NOT_SUPPORTED."""
        handle = self._handle(index)
        mode = self._query("nvmlDeviceGetAccountingMode", handle, default=None, scope=Scope(gpu=index))
        if mode is None or int(mode) != FEATURE_ENABLED:
            return None
        pids = self._query("nvmlDeviceGetAccountingPids", handle, default=None)
        return None if pids is None else [int(pid) for pid in pids]

    def accounting_stats(self, index: int, pid: int) -> AccountingRecord | None:
        """nvmlDeviceGetAccountingStats: NOT_FOUND where the buffer has no such PID (nvml.h)."""
        stats = self._query(
            "nvmlDeviceGetAccountingStats", self._handle(index), pid, default=None, absent=ABSENT | EMPTY
        )
        if stats is None:
            return None
        return AccountingRecord(
            pid=pid,
            started_us=int(stats.startTime),
            seconds=int(stats.time) / 1000.0,
            running=bool(stats.isRunning),
            sm=_percent(stats.gpuUtilization),
            memory_copy=_percent(stats.memoryUtilization),
        )

    def utilization_samples(self, index: int, since_us: int) -> list[UtilizationSample]:
        """Per-process samples from nvmlDeviceGetProcessesUtilizationInfo where the driver has
        it (R550 and newer: JPEG and optical flow beside the rest), else from
        nvmlDeviceGetProcessUtilization; the two cost the same (2.7 ms on an H200)."""
        handle = self._handle(index)
        try:
            # A library, driver or GPU without it: noted for this session, the older call serves.
            samples = self._query(PROCESSES_V2, handle, since_us, default=None, scope=Scope(gpu=index))
            if samples is None:
                samples = self._call(PROCESSES_V1, handle, since_us)
        except GpuError as error:
            if error.code in NO_SAMPLES:  # no process had a sample since `since_us`: all idle
                return []
            raise
        return [
            UtilizationSample(pid=int(sample.pid), timestamp_us=int(sample.timeStamp), use=_use(sample))
            for sample in samples
        ]

    def gpu_utilization_samples(self, index: int, since_us: int, figure: str = "sm") -> list[tuple[int, float]]:
        """nvmlDeviceGetSamples of `figure`'s buffer (NVML_GPU_UTILIZATION_SAMPLES for SM, MEMORY,
        ENC, DEC, JPG, OFA for the engines): a sample each period NVML keeps (200 ms on an
        H200, 71 of them: 14 s), the percent of it in which that engine was busy."""
        handle = self._handle(index)
        _, samples = self._query(
            "nvmlDeviceGetSamples",
            handle,
            SAMPLING_TYPES[figure],
            since_us,
            default=(None, []),
            absent=NO_SAMPLES,
        )
        return [(int(sample.timeStamp), min(1.0, float(sample.sampleValue.uiVal) / 100.0)) for sample in samples]

    def now_us(self) -> int:
        # NVML stamps process samples with the CPU's wall clock in microseconds.
        return time.time_ns() // 1000

    def close(self) -> None:
        self._session.close()

    def _let_go(self) -> None:
        """What NVML allocated for the agent, freed before the session ends: the event set
        (after the wait in progress, which holds its lock, at most its timeout) and the GPM
        samples."""
        with self._xids.lock:
            self._xids.free()
            self._gpm.free()

    # --- health, efficiency, events (gpu/nvml_health.py) ------------------------------

    def health(self, index: int) -> HealthReading:
        handle = self._handle(index)
        engines = functools.partial(self._engines_held, index, handle)
        return read_health(handle, index, self._session, self._session_figures, engines=engines)

    def gpm(self, index: int, gpu_instance: int | None = None) -> dict[str, float] | None:
        return self._gpm.read(self._handle(index), index, gpu_instance)

    def xid_events(self, index: int, most: int) -> list[XidEvent]:
        return self._xids.take(index, most)

    def _identified(self, index: int) -> tuple[Any, str]:
        """GPU `index`'s handle and UUID, for its event set: both kept for the NVML session, so
        that a GPU lost since it was first read still names its events."""
        handle = self._handle(index)
        return handle, self._identity(index, handle)[0]

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            self._handles[index] = handle
        return handle

    def _listing(self, name: str, handle: Any) -> Any:
        # A driver without the graphics or MPS listing (the compute one it has): the other
        # lists serve, and it is not asked again this session.
        absent = frozenset() if name == LISTINGS[0] else ABSENT
        for attempt in range(LISTING_ATTEMPTS):
            try:
                return self._query(name, handle, default=[], absent=absent, scope=DRIVER)
            except GpuError as error:
                if error.code is not ErrorCode.INSUFFICIENT_SIZE or attempt == LISTING_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover


def _percent(value: Any) -> float:
    """An accounting figure in percent, 0-1; NVML_VALUE_NOT_AVAILABLE (all ones) reads 0."""
    percent = int(value)
    return 0.0 if percent > 100 else percent / 100.0


def _use(sample: Any) -> ProcessUse:
    """One per-process sample's figures, 0-1; JPEG and optical flow only in the newer call's."""
    return ProcessUse(
        sm=float(getattr(sample, SM_SAMPLE_FIELD)) / 100.0,
        **{engine.name: float(getattr(sample, engine.sample_field, 0)) / 100.0 for engine in ENGINE_TABLE},
    )


def mig_profile(name: str) -> str:
    """`NVIDIA H100 80GB HBM3 MIG 1g.10gb` -> `1g.10gb`: NVML names a MIG
    device after its parent, then `MIG`, then the profile."""
    _, sep, profile = name.rpartition(" MIG ")
    return profile.strip() if sep else name.strip()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
