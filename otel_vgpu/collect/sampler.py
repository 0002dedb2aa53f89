"""Sweeps: one read of every source, shared by every instrument and reader.

A sweep reads NVML once, attributes the processes, and aggregates. The
sampler hands the same snapshot to every caller while it is young enough, and
a caller that arrives while a sweep is running waits for that sweep instead
of starting another: however many scrapes and exports come at once, at most
one sweep is in flight.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from otel_vgpu.allocation.ratio import RatioSource
from otel_vgpu.allocation.shares import AllocationSource
from otel_vgpu.collect.aggregate import GpuReading, Snapshot, aggregate
from otel_vgpu.collect.usage import Usage, accumulate
from otel_vgpu.gpu.backend import Device, ErrorCode, GpuBackend, GpuError
from otel_vgpu.gpu.pidns import blind_gpus, blind_message, in_host_pid_namespace
from otel_vgpu.gpu.sampling import MIN_WINDOW_US, SamplingWindows, fit_under, mean_use_by_pid
from otel_vgpu.health import SWEEP_STAGES, Health, Stage
from otel_vgpu.pods.attribution import Attributor
from otel_vgpu.pods.directory import PodDirectory

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Errors:
    """Failures of one sweep: (stage, kind) -> message."""

    seen: dict[tuple[Stage, str], str] = field(default_factory=dict)
    ongoing: set[tuple[Stage, str]] = field(default_factory=set)
    """Failures still in force that this sweep did not ask about again: not counted, not recovered."""

    def add(self, stage: Stage, kind: str, message: str) -> None:
        self.seen.setdefault((stage, kind), message)


# How long a GPU that answered NOT_SUPPORTED for per-process utilization is left alone.
ASK_AGAIN_S = 300.0
# How often each GPU's energy counter is read: a read costs more CPU than the rest of a
# sweep of the GPU (3.9 ms on an H200, bench/results/h200-sweep-cost.md), and the energy
# between reads is split over the sweeps it covers, so reading it every sweep buys nothing
# but finer steps of the joules counters.
ENERGY_EVERY_S = 10.0

# The MPS server's command name: `nvidia-cuda-mps-server` cut to the
# kernel's 15 characters (TASK_COMM_LEN), as /proc/<pid>/stat gives it.
MPS_SERVER_COMMAND = "nvidia-cuda-mps-server"[:15]


def with_mps(reading: GpuReading, commands: Mapping[int, str]) -> GpuReading:
    """The reading with its MPS servers counted. NVML gives an MPS server
    every SM sample of its clients and the clients none (measured on an
    H200, driver 580): on such a GPU, per-process SM says nothing about
    pods, so it is left out; the device figure still holds."""
    servers = sum(1 for p in reading.processes or () if commands.get(p.pid) == MPS_SERVER_COMMAND)
    if not servers:
        return reading
    return dataclasses.replace(reading, use_by_pid=None, mps_servers=servers)


class Sampler:
    def __init__(
        self,
        backend: GpuBackend,
        *,
        attributor: Attributor,
        directory: PodDirectory,
        allocation: AllocationSource,
        ratio: RatioSource,
        health: Health | None = None,
        by_container: bool = False,
        clock: Callable[[], float] = time.monotonic,
        host_pid_namespace: bool | None = None,
        ask_again_s: float = ASK_AGAIN_S,
        on_driver_changed: Callable[[str], None] | None = None,
        idle_watts: float | None = None,
        energy_every_s: float = ENERGY_EVERY_S,
    ) -> None:
        """`host_pid_namespace`: whether the agent shares the host's PID
        namespace (None: unknown); by default read from /proc/self/ns/pid.
        `ask_again_s`: how long a GPU that cannot report per-process
        utilization is left alone before it is asked again.
        `on_driver_changed`: called with a message when NVML's library no
        longer matches the loaded driver, which no retry can mend.
        `idle_watts`: every GPU's idle power, for the energy split; None: learned.
        `energy_every_s`: how often each GPU's energy counter is read."""
        self._backend = backend
        self._attributor = attributor
        self._directory = directory
        self._allocation = allocation
        self._ratio = ratio
        self._health = health or Health()
        self._by_container = by_container
        self._clock = clock
        self._windows = SamplingWindows()
        # GPUs whose NVML cannot tell per-process utilization (vGPU guests,
        # some older boards): left alone for `ask_again_s` after each NOT_SUPPORTED
        # (a driver upgrade or a mode change can bring it), not an error each sweep.
        self._no_process_utilization: dict[str, float] = {}
        self._ask_again_s = ask_again_s
        self._announced: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._generation = 0
        self._latest: Snapshot | None = None
        self._last_success: float | None = None
        self._host_pid_namespace = in_host_pid_namespace() if host_pid_namespace is None else host_pid_namespace
        self._blind_uuids: frozenset[str] = frozenset()
        self._sweep_started: float | None = None
        self._paused: str | None = None
        self._usage = Usage()
        self._idle_watts = idle_watts
        self._energy_every_s = energy_every_s
        self._energy_read_at: dict[str, float] = {}
        """When each GPU's energy counter was last read, by UUID; absent: never, or it has none."""
        self._gpu_seen: dict[str, int] = {}
        """The newest GPU utilization sample read, by GPU UUID."""
        self._on_driver_changed = on_driver_changed
        self.sweeps = 0

    def stuck_for(self) -> float:
        """How long the sweep in progress has run; 0 when none is."""
        started = self._sweep_started
        return 0.0 if started is None else max(0.0, self._clock() - started)

    def fresh(self, max_age: float) -> Snapshot | None:
        """The latest snapshot if it is no older than `max_age` seconds; never sweeps or waits."""
        latest = self._latest
        if latest is not None and self._clock() - latest.taken_at <= max_age:
            return latest
        return None

    @property
    def last_success(self) -> float | None:
        """Monotonic time of the last sweep that could enumerate the GPUs."""
        return self._last_success

    # --- driver upgrades ----------------------------------------------------------

    def pause(self, reason: str) -> None:
        """Let go of the driver until `resume`: NVML is shut down once the
        sweep in flight (if any) ends, and sweeps read no GPU meanwhile."""
        with self._lock:
            if self._paused is not None:
                return
            self._paused = reason
            self._backend.release()
            self._latest = None
        log.warning(
            "the GPU driver is being upgraded (node label %s): NVML released so that the driver can be "
            "unloaded; GPU and pod figures are left out until the label is lifted",
            reason,
        )

    def resume(self) -> None:
        """The driver may be used again; the next sweep initialises NVML."""
        with self._lock:
            if self._paused is None:
                return
            reason, self._paused = self._paused, None
            self._backend.resume()
            self._latest = None
        log.info("the GPU driver upgrade is over (%s lifted): using NVML again", reason)

    @property
    def paused(self) -> str | None:
        return self._paused

    def snapshot(self, max_age: float) -> Snapshot:
        """A snapshot no older than `max_age` seconds, sweeping if needed."""
        generation = self._generation
        with self._lock:
            latest = self._latest
            if latest is not None and (
                # A sweep finished while this caller waited for the lock:
                # it is as fresh as one this caller would start.
                self._generation != generation or self._clock() - latest.taken_at <= max_age
            ):
                return latest
            snapshot = self._sweep()
            self._latest = snapshot
            self._generation += 1
            return snapshot

    def _sweep(self) -> Snapshot:
        started = self._sweep_started = self._clock()
        try:
            return self._sweep_from(started)
        finally:
            self._sweep_started = None

    def _sweep_from(self, started: float) -> Snapshot:
        errors = _Errors()
        self.sweeps += 1
        try:
            snapshot = self._collect(errors)
        except Exception as error:  # keep serving; the traceback is logged once
            if not self._health.failing(Stage.SWEEP, type(error).__name__):
                log.exception("sweep failed unexpectedly")
            errors.add(Stage.SWEEP, type(error).__name__, f"{type(error).__name__}: {error}")
            snapshot = Snapshot(taken_at=self._clock(), ok=False)
        finished = self._clock()
        gpus, pods = snapshot.gpus, snapshot.pods
        if snapshot.ok:
            self._last_success = finished
            self._usage, gpus, pods = accumulate(self._usage, gpus, pods, finished, idle_watts=self._idle_watts)
        self._health.swept(finished - started)
        self._report(errors)
        self._report_blind(snapshot)
        return Snapshot(
            taken_at=finished,
            ok=snapshot.ok,
            gpus=gpus,
            pods=pods,
            errors=tuple((stage.value, message) for (stage, _), message in errors.seen.items()),
            blind=snapshot.blind,
            paused=snapshot.paused,
        )

    def _collect(self, errors: _Errors) -> Snapshot:
        self._ratio.refresh()
        if self._ratio.error is not None:
            message = f"{self._ratio.error} (keeping ratio {self._ratio.describe()})"
            errors.add(Stage.ALLOCATION_FILE, str(self._ratio.error), message)
        if self._paused is not None:
            # Not a failure: the driver is away on purpose, and nothing is counted.
            return Snapshot(taken_at=self._clock(), ok=False, paused=self._paused)
        try:
            count = self._backend.device_count()
        except GpuError as error:
            errors.add(Stage.DEVICE_COUNT, error.code.value, str(error))
            if error.code is ErrorCode.LIB_RM_VERSION_MISMATCH and self._on_driver_changed is not None:
                self._on_driver_changed(
                    "the NVIDIA driver changed under the agent: NVML's library (libnvidia-ml.so.1, given to the "
                    f"container when it started) does not match the loaded kernel module ({error}); exiting, so "
                    "that the container restarts with the new driver's library"
                )
            return Snapshot(taken_at=self._clock(), ok=False)

        readings: list[GpuReading] = []
        for index in range(count):
            reading = self._read_gpu(index, errors)
            if reading is not None:
                readings.append(reading)
        self._windows.keep_only(reading.device.uuid for reading in readings)
        blind = blind_gpus([(r.device, r.processes) for r in readings], self._host_pid_namespace)
        if blind:
            # What the driver hides is unknown, not zero: a blind GPU gets no
            # pod rows (no false idle allocations) and no unattributed figure.
            hidden = {gpu.uuid for gpu in blind}
            readings = [
                dataclasses.replace(r, processes=None, use_by_pid=None) if r.device.uuid in hidden else r
                for r in readings
            ]

        pids = [p.pid for reading in readings for p in reading.processes or ()]
        attribution = self._attributor.attribute(pids)
        for message in attribution.errors:
            errors.add(Stage.ATTRIBUTION, "unreadable", message)
        readings = [with_mps(reading, attribution.commands) for reading in readings]
        self._announce(readings)

        devices = [reading.device for reading in readings]
        allocation = self._allocation.allocation(devices)
        resolved = self._ratio.ratios(devices, allocation.replicas)
        for kind, message in resolved.problems:
            errors.add(Stage.RATIO, kind, message)
        gpus, pods = aggregate(
            readings,
            attribution.pods,
            self._directory.lookup,
            allocation,
            resolved.ratios,
            self._by_container,
        )
        return Snapshot(taken_at=self._clock(), ok=True, gpus=gpus, pods=pods, blind=blind)

    def _read_gpu(self, index: int, errors: _Errors) -> GpuReading | None:
        try:
            device = self._with_window(index, self._backend.device(index))
        except GpuError as error:
            errors.add(Stage.DEVICE, f"{index}:{error.code.value}", f"GPU {index}: {error}")
            return None
        device = self._with_energy(index, device, errors)
        try:
            processes = self._backend.processes(index)
        except GpuError as error:
            errors.add(Stage.PROCESSES, f"{index}:{error.code.value}", f"GPU {index}: {error}")
            return GpuReading(device=device, processes=None, use_by_pid=None)
        if device.mig_mode:
            # NVML has no per-process utilization under MIG: not an error.
            return GpuReading(device=device, processes=processes, use_by_pid=None)
        unsupported_until = self._no_process_utilization.get(device.uuid)
        if unsupported_until is not None and self._clock() < unsupported_until:
            errors.ongoing.add((Stage.PROCESS_UTILIZATION, f"{index}:{ErrorCode.NOT_SUPPORTED.value}"))
            return GpuReading(device=device, processes=processes, use_by_pid=None)
        now = self._backend.now_us()
        since = self._windows.start(device.uuid, now)
        try:
            samples = self._backend.utilization_samples(index, since)
        except GpuError as error:
            if error.code is ErrorCode.NOT_SUPPORTED:
                if device.uuid not in self._no_process_utilization:
                    log.warning(
                        "GPU %d (%s) cannot report per-process utilization; SM families omitted, asking again "
                        "every %g s",
                        index,
                        device.uuid,
                        self._ask_again_s,
                    )
                self._no_process_utilization[device.uuid] = self._clock() + self._ask_again_s
            errors.add(Stage.PROCESS_UTILIZATION, f"{index}:{error.code.value}", f"GPU {index}: {error}")
            return GpuReading(device=device, processes=processes, use_by_pid=None)
        self._windows.advance(device.uuid, now)
        self._no_process_utilization.pop(device.uuid, None)
        use_by_pid = fit_under(mean_use_by_pid(samples, since), device.utilization_window)
        return GpuReading(device=device, processes=processes, use_by_pid=use_by_pid)

    def _with_energy(self, index: int, device: Device, errors: _Errors) -> Device:
        """The device with its energy counter, read every `energy_every_s`: one read cost
        3.9 ms of CPU on an H200, more than the rest of a sweep of that GPU together
        (bench/results/h200-sweep-cost.md). Between reads the device is marked skipped,
        and the sweeps wait to have the next read's energy split over them."""
        read_at = self._energy_read_at.get(device.uuid)
        now = self._clock()
        if read_at is not None and now - read_at < self._energy_every_s:
            return dataclasses.replace(device, energy_skipped=True)
        try:
            energy_mj = self._backend.energy(index)
        except GpuError as error:
            errors.add(Stage.DEVICE, f"{index}:{error.code.value}", f"GPU {index}: energy counter: {error}")
            return dataclasses.replace(device, energy_skipped=read_at is not None)
        if energy_mj is None:
            self._energy_read_at.pop(device.uuid, None)
            return device
        self._energy_read_at[device.uuid] = now
        return dataclasses.replace(device, energy_mj=energy_mj)

    def _with_window(self, index: int, device: Device) -> Device:
        """The device with the mean of its own utilization samples since its previous
        sweep: what its busy seconds are counted from, since the last period's figure,
        sampled every few seconds, would alias against bursty work. Without samples
        (an old driver, MIG) the last period's figure serves."""
        if device.mig_mode:
            return device
        now = self._backend.now_us()
        since = self._gpu_seen.get(device.uuid, now - MIN_WINDOW_US)
        try:
            samples = self._backend.gpu_utilization_samples(index, since)
        except GpuError:
            return device
        fresh = [value for stamp, value in samples if stamp > since]
        if not fresh:
            return device
        self._gpu_seen[device.uuid] = max(stamp for stamp, _ in samples)
        return dataclasses.replace(device, utilization_window=sum(fresh) / len(fresh))

    def _announce(self, readings: list[GpuReading]) -> None:
        """Say once per GPU why its pods have no SM figures (MIG mode, an MPS server)."""
        for reading in readings:
            device = reading.device
            why = None
            if device.mig_mode:
                why = "is in MIG mode: NVML has no per-process SM there"
            elif reading.mps_servers:
                why = (
                    f"runs an MPS server (command {MPS_SERVER_COMMAND!r} in /proc/<pid>/stat): NVML gives its "
                    "clients' SM samples to the server"
                )
            if why is not None and (device.uuid, why) not in self._announced:
                self._announced.add((device.uuid, why))
                log.info("GPU %d (%s) %s; the pod SM families are left out for it", device.index, device.uuid, why)

    def _report_blind(self, snapshot: Snapshot) -> None:
        """One error line when the agent goes blind (or other GPUs join), one when it sees again."""
        uuids = frozenset(gpu.uuid for gpu in snapshot.blind)
        if uuids - self._blind_uuids:
            log.error("%s", blind_message(snapshot.blind))
        elif self._blind_uuids and not uuids and snapshot.ok:
            log.info("NVML lists the processes of every GPU in use again")
        if snapshot.ok:
            self._blind_uuids = uuids

    def _report(self, errors: _Errors) -> None:
        """Count every failure; log each kind once, when it starts and when it ends."""
        for (stage, kind), message in errors.seen.items():
            # An unexpected exception logged its traceback already.
            self._health.failed(stage, kind, f"{stage.value} failed: {message}", log=stage is not Stage.SWEEP)
        for stage in SWEEP_STAGES:
            still = {kind for (seen, kind) in (*errors.seen, *errors.ongoing) if seen is stage}
            self._health.recovered(stage, f"{stage.value} recovered ({{kinds}})", still=still)
