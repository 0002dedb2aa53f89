"""Sweeps: one read of every source, shared by every instrument and reader.

A sweep reads NVML once, attributes the processes, and aggregates. The
sampler hands the same snapshot to every caller while it is young enough, and
a caller that arrives while a sweep is running waits for that sweep instead
of starting another: however many scrapes and exports come at once, at most
one sweep is in flight.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence

from otel_vgpu.agent_health import SWEEP_STAGES, AgentHealth, Reader, Refusal, Stage
from otel_vgpu.allocation.ratio import RatioSource
from otel_vgpu.allocation.shares import AllocationSource
from otel_vgpu.collect.aggregate import GpuReading, GpuRow, Snapshot, aggregate
from otel_vgpu.collect.ledger import Seen
from otel_vgpu.collect.lost_gpus import GpuIdentity, after_sweep
from otel_vgpu.collect.reading import GpuReader, SweepErrors
from otel_vgpu.collect.trust import MPS_SERVER_COMMAND, bound_unknown, judge_mps
from otel_vgpu.collect.usage import Usage, accumulate
from otel_vgpu.config import DEFAULT_MPS_SERVER_NAMESPACES
from otel_vgpu.gpu.backend import ErrorCode, GpuBackend, GpuError
from otel_vgpu.gpu.pidns import blind_gpus, blind_message, in_host_pid_namespace
from otel_vgpu.pods.attribution import Attribution, Attributor
from otel_vgpu.pods.cgroups import PodRef
from otel_vgpu.pods.directory import PodDirectory

log = logging.getLogger(__name__)
# How long a driver upgrade's pause waits for the reads beside the sweeps to end.
PAUSE_WAIT_S = 5.0
# How long a collection waits for the sweep in flight before it serves the last one: a sweep
# takes milliseconds (bench/results/h200-sweep-cost.md), and Prometheus' scrape_timeout is 10 s.
SWEEP_WAIT_S = 2.0
# How long a sweep, or a look of the process watch, may run before its reader reads failed while
# it runs (vgpu_agent_reader_success): Prometheus' default scrape_timeout. A sweep takes
# milliseconds (bench/results/h200-sweep-cost.md), its GPM reads at most their 1 s deadline
# (collect/gpm_reads.py); one past this is stuck in a driver call, which no deadline can end,
# and /healthz fails only after `Limits.stuck_after_s`.
SWEEP_DEADLINE_S = 10.0

# A reader that has not collected for this long (a Prometheus that went away) no longer holds
# the ended pods' series (collect/usage.py) for itself.
READER_GONE_S = 600.0


class Sampler:
    def __init__(
        self,
        backend: GpuBackend,
        *,
        attributor: Attributor,
        directory: PodDirectory,
        allocation: AllocationSource,
        ratio: RatioSource,
        health: AgentHealth | None = None,
        by_container: bool = False,
        clock: Callable[[], float] = time.monotonic,
        host_pid_namespace: bool | None = None,
        on_driver_changed: Callable[[str], None] | None = None,
        idle_watts: float | None = None,
        reader: GpuReader | None = None,
        mps_server_namespaces: Collection[str] = DEFAULT_MPS_SERVER_NAMESPACES,
        sweep_deadline_s: float = SWEEP_DEADLINE_S,
    ) -> None:
        """`host_pid_namespace`: whether the agent shares the host's PID
        namespace (None: unknown); by default read from /proc/self/ns/pid.
        `on_driver_changed`: called with a message when NVML's library no
        longer matches the loaded driver, which no retry can mend.
        `idle_watts`: every GPU's idle power, for the energy split; None: learned.
        `reader`: how each GPU is read (collect/reading.py); by default with its
        default cadences and this sampler's clock.
        `mps_server_namespaces`: where a pod may run an MPS server (collect/trust.py).
        `sweep_deadline_s`: how long a sweep or a look may run before its reader reads failed."""
        self._backend = backend
        self._attributor = attributor
        self._directory = directory
        self._allocation = allocation
        self._ratio = ratio
        self._health = health or AgentHealth()
        self._by_container = by_container
        self._clock = clock
        self._reader = reader or GpuReader(backend, clock)
        self._announced: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._users = 0
        """Reads beside the sweeps in flight (`driver_use`)."""
        self._users_changed = threading.Condition()
        self._generation = 0
        self._latest: Snapshot | None = None
        self._host_pid_namespace = in_host_pid_namespace() if host_pid_namespace is None else host_pid_namespace
        self._blind_uuids: frozenset[str] = frozenset()
        self._sweep_started: float | None = None
        self._paused: str | None = None
        self._usage = Usage()
        self._known: dict[str, GpuIdentity] = {}
        """Every GPU a sweep has read, by UUID, under its last identity (collect/lost_gpus.py)."""
        self._lost: tuple[GpuIdentity, ...] = ()
        self._idle_watts = idle_watts
        self._on_driver_changed = on_driver_changed
        self._mps_server_namespaces = frozenset(mps_server_namespaces)
        self._readers: dict[str, tuple[int, float]] = {}
        """By reader (the scrape, the OTLP push): the sweep it last collected, and when."""
        self._sweep_deadline_s = sweep_deadline_s
        self.sweeps = 0
        self._driven = False
        """Whether sweeps are the agent's own (collect/sweeper.py): then no reader ever sweeps."""

    def drive(self) -> None:
        """Sweeps come from the agent's own sweeper from now on: a collection serves the last
        sweep, or waits for the one in flight, and never sweeps itself (docs/trust.md: no
        client moves a sweep instant), save the first, before the sweeper's."""
        self._driven = True

    def collected(self, reader: str, snapshot: Snapshot) -> None:
        """`reader` collects `snapshot`: the ended pods' series it holds are in its hands."""
        self._readers[reader] = (snapshot.generation, self._clock())

    def _collected_through(self) -> int | None:
        """The latest sweep every reader that still collects has collected; None: no reader does."""
        now = self._clock()
        active = [generation for generation, at in list(self._readers.values()) if now - at <= READER_GONE_S]
        return min(active) if active else None

    def stuck_for(self) -> float:
        """How long the sweep in progress has run; 0 when none is."""
        started = self._sweep_started
        return 0.0 if started is None else max(0.0, self._clock() - started)

    def fresh(self, max_age: float) -> Snapshot | None:
        """The latest snapshot if it is no older than `max_age` seconds; never sweeps or waits."""
        latest = self._latest
        if latest is not None and (self._driven or self._clock() - latest.taken_at <= max_age):
            return latest
        return None

    # --- driver upgrades ----------------------------------------------------------

    def pause(self, reason: str) -> None:
        """Let go of the driver until `resume`: NVML is shut down once the
        sweep in flight (if any) ends, and sweeps read no GPU meanwhile."""
        with self._lock:
            if self._paused is not None:
                return
            with self._users_changed:
                self._paused = reason
                # A read beside the sweeps (a GPU's health) that hangs in the driver must not
                # hold the upgrade forever: NVML is let go of after PAUSE_WAIT_S regardless.
                if not self._users_changed.wait_for(lambda: self._users == 0, timeout=PAUSE_WAIT_S):
                    log.warning("%d NVML reads in flight after %g s; letting go of NVML", self._users, PAUSE_WAIT_S)
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

    def latest(self) -> Snapshot | None:
        """The last sweep's snapshot, if it read the GPUs; never waits (a sweep in flight is not waited for)."""
        latest = self._latest
        return latest if latest is not None and latest.ok and self._paused is None else None

    @contextlib.contextmanager
    def driver_use(self) -> Iterator[GpuBackend | None]:
        """The backend, for a read beside the sweeps (NVML is thread-safe: nvml.h, "it is safe to
        make simultaneous NVML calls from multiple threads"); None while the driver is paused. A
        pause waits for the reads in use, at most `PAUSE_WAIT_S`, before it lets go of NVML."""
        with self._users_changed:
            paused = self._paused is not None
            if not paused:
                self._users += 1
        if paused:
            yield None
            return
        try:
            yield self._backend
        finally:
            with self._users_changed:
                self._users -= 1
                self._users_changed.notify_all()

    def gpu_indices(self) -> tuple[int, ...]:
        """The GPUs of the last sweep, read or lost, by index: those whose XID events the watch
        takes (collect/xids.py); none before the first sweep and while the driver is paused."""
        latest = self._latest
        if latest is None:
            return ()
        return tuple(sorted({gpu.index for gpu in latest.gpus} | {gpu.index for gpu in latest.lost}))

    def snapshot(self, max_age: float) -> Snapshot:
        """A snapshot no older than `max_age` seconds, sweeping if needed; with sweeps of the
        agent's own (`drive`), the last sweep's, or the one in flight's, whatever its age, but
        never after waiting more than `SWEEP_WAIT_S` for it."""
        generation, before = self._generation, self._latest
        # With sweeps of the agent's own, one stuck in a slow driver call (the first after a
        # driver upgrade, in nvmlInit, among them) is waited for at most SWEEP_WAIT_S: its
        # predecessor serves, or none, rather than a scrape that waits past its timeout and
        # loses every figure.
        if not self._lock.acquire(timeout=SWEEP_WAIT_S if self._driven else -1):
            return before if before is not None else Snapshot(taken_at=self._clock(), ok=False)
        try:
            latest = self._latest
            if latest is not None and (
                self._driven
                # A sweep finished while this caller waited for the lock:
                # it is as fresh as one this caller would start.
                or self._generation != generation
                or self._clock() - latest.taken_at <= max_age
            ):
                return latest
            return self._store(self._sweep())
        finally:
            self._lock.release()

    def sweep(self) -> Snapshot:
        """A sweep now: the sweeper's, on the agent's own cadence."""
        with self._lock:
            return self._store(self._sweep())

    def _store(self, snapshot: Snapshot) -> Snapshot:
        self._latest = snapshot
        self._generation += 1
        return snapshot

    def _sweep(self) -> Snapshot:
        started = self._sweep_started = self._clock()
        self._health.began(Reader.SWEEP, self._sweep_deadline_s)
        try:
            return self._sweep_from(started)
        finally:
            self._sweep_started = None

    def _sweep_from(self, started: float) -> Snapshot:
        errors = SweepErrors()
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
            self._usage, gpus, pods = accumulate(
                self._usage,
                gpus,
                pods,
                finished,
                idle_watts=self._idle_watts,
                generation=self.sweeps,
                collected_through=self._collected_through(),
            )
        self._health.swept(finished - started)
        self._passed(finished - started, errors)
        self._report(errors)
        self._report_blind(snapshot)
        lost = self._account_lost(gpus) if snapshot.paused is None else ()
        return Snapshot(
            taken_at=finished,
            ok=snapshot.ok,
            gpus=gpus,
            pods=pods,
            ended=tuple(e.row for e in self._usage.ended.values()) if snapshot.ok else (),
            generation=self.sweeps,
            errors=tuple((stage.value, message) for (stage, _), message in errors.seen.items()),
            blind=snapshot.blind,
            paused=snapshot.paused,
            lost=lost,
        )

    def _passed(self, seconds: float, errors: SweepErrors) -> None:
        """The sweep's pass, failed where it counted a failure, and its GPM reads' pass where it
        made any, failed where one failed: GPM's failures are the `gpm` reader's, not the sweep's."""
        self._health.passed(Reader.SWEEP, seconds, all(stage is Stage.GPM for stage, _ in errors.seen))
        gpm_s = self._reader.take_gpm_seconds()
        if gpm_s is not None:
            self._health.passed(Reader.GPM, gpm_s, not any(stage is Stage.GPM for stage, _ in errors.seen))

    def _collect(self, errors: SweepErrors) -> Snapshot:
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
        self._attributor.begin(self._backend.now_us())
        for index in range(count):
            reading = self._reader.read(index, errors, self._attributor.started_us)
            if reading is not None:
                readings.append(reading)
        # Every GPU's GPM read at once, under one deadline (collect/gpm_reads.py).
        readings = self._reader.read_gpm(readings, errors)
        self._reader.keep_only(reading.device.uuid for reading in readings)
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
        pods_by_pid, unknown = self._refuse(attribution)
        readings = [self._judge_mps(reading, pods_by_pid, attribution) for reading in readings]
        readings = [self._settle(reading, pods_by_pid, attribution) for reading in readings]
        self._announce(readings)

        devices = [reading.device for reading in readings]
        allocation = self._allocation.allocation(devices)
        for reason, key, why in allocation.refused:
            self._health.refused(reason, key, f"refused ({reason.value}): {why} (docs/trust.md)", log_each=True)
        if unknown:
            # Pods the API does not know hold no share: what they were given is nothing the agent knows of.
            allocation = dataclasses.replace(allocation, answered=allocation.answered | unknown)
        resolved = self._ratio.ratios(devices, allocation.replicas)
        for kind, message in resolved.problems:
            errors.add(Stage.RATIO, kind, message)
        gpus, pods = aggregate(
            readings,
            pods_by_pid,
            self._directory.lookup,
            allocation,
            resolved.ratios,
            self._by_container,
        )
        return Snapshot(taken_at=self._clock(), ok=True, gpus=gpus, pods=pods, blind=blind)

    def _refuse(self, attribution: Attribution) -> tuple[dict[int, PodRef | None], frozenset[str]]:
        """The attribution with what a tenant cannot decide refused (collect/trust.py): each
        refusal counted; the UIDs of the pods the API does not know that keep their rows."""
        nested = [pid for pid, ref in attribution.pods.items() if ref is not None and ref.names_another_pod]
        self._refuse_processes(
            Refusal.NESTED_POD_CGROUP,
            nested,
            attribution,
            "runs in a cgroup its container nested below itself and named like a pod; billed to its container's pod",
        )
        if not self._directory.knows_every_pod():
            return dict(attribution.pods), frozenset()
        pods_by_pid, unknown, dropped = bound_unknown(
            attribution.pods, lambda uid: self._directory.lookup(uid) is not None
        )
        self._refuse_processes(
            Refusal.UNKNOWN_POD,
            dropped,
            attribution,
            "belongs to a pod the Kubernetes API does not know, past the bound on such pods; its usage is unattributed",
        )
        return pods_by_pid, unknown

    def _refuse_processes(self, reason: Refusal, pids: Collection[int], attribution: Attribution, what: str) -> None:
        for pid in pids:
            start = attribution.starts.get(pid)
            self._health.refused(
                reason,
                f"{pid}:{start}",
                f"refused ({reason.value}): process {pid} ({attribution.commands.get(pid, '?')}) {what}",
            )

    def _judge_mps(
        self, reading: GpuReading, pods_by_pid: dict[int, PodRef | None], attribution: Attribution
    ) -> GpuReading:
        """The reading with MPS judged from NVML's clients (collect/trust.py), and the
        processes refused what they claim counted: a name the server's, samples of a PID's
        earlier holder."""
        judged, decoys = judge_mps(reading, pods_by_pid, attribution.commands, self._may_serve_mps)
        self._refuse_processes(
            Refusal.MPS_SERVER_NAME,
            decoys,
            attribution,
            "calls itself the MPS server on a GPU where it cannot be one; it is its pod's, as any process",
        )
        return judged

    def _settle(
        self, reading: GpuReading, pods_by_pid: dict[int, PodRef | None], attribution: Attribution
    ) -> GpuReading:
        """The reading with what every process ran over the window, those the watch alone saw
        included (collect/ledger.py); what ended processes of pods the API does not know ran
        is unattributed, as their listed processes' is past the bound."""
        settled = self._reader.settle(reading, pods_by_pid, attribution.starts)
        self._refuse_processes(
            Refusal.PID_REUSED,
            sorted(settled.reused_pids),
            attribution,
            "holds a PID whose NVML samples are older than it: they are the ended process's that held it "
            "before, and its pod's",
        )
        if not settled.earlier_use or not self._directory.knows_every_pod():
            return settled
        listed = {ref.pod_uid for ref in pods_by_pid.values() if ref is not None}
        kept = {
            ref: use
            for ref, use in settled.earlier_use.items()
            if ref.pod_uid in listed or self._directory.lookup(ref.pod_uid) is not None
        }
        return settled if len(kept) == len(settled.earlier_use) else dataclasses.replace(settled, earlier_use=kept)

    def watch(self) -> float:
        """One look at every GPU between sweeps (collect/process_watch.py): never beside a sweep, while
        the driver is paused, or before the first sweep. The seconds it took, once it had the
        sweeps' lock."""
        with self._lock:
            started = time.monotonic()
            latest = self._latest
            if self._paused is not None or latest is None or not latest.ok:
                return 0.0
            self._health.began(Reader.PROCESS_WATCH, self._sweep_deadline_s)
            try:
                for gpu in latest.gpus:
                    self._reader.watch(gpu.index, self._identify)
            except Exception:
                self._health.passed(Reader.PROCESS_WATCH, time.monotonic() - started, False)
                raise
            took = time.monotonic() - started
            self._health.passed(Reader.PROCESS_WATCH, took, True)
            return took

    def _identify(self, pids: Sequence[int]) -> dict[int, Seen]:
        found = {}
        for pid in pids:
            looked = self._attributor.look(pid)
            if looked is not None:
                found[pid] = Seen(pid, *looked)
        return found

    def _may_serve_mps(self, ref: PodRef) -> bool:
        """Whether a pod may run an MPS server: one in a namespace trusted with it."""
        meta = self._directory.lookup(ref.pod_uid)
        return meta is not None and meta.namespace in self._mps_server_namespaces

    def _announce(self, readings: list[GpuReading]) -> None:
        """Say once per GPU why its pods have no SM figures (MIG mode, an MPS server)."""
        for reading in readings:
            device = reading.device
            why = None
            if device.mig_mode:
                why = "is in MIG mode: NVML has no per-process SM there"
            elif reading.unknown_pids:
                why = (
                    f"runs MPS ({len(reading.unknown_pids)} clients and servers; {reading.mps_servers} server "
                    f"recognised, command {MPS_SERVER_COMMAND!r}): NVML gives its clients' SM samples to the server"
                )
            if why is not None and (device.uuid, why) not in self._announced:
                self._announced.add((device.uuid, why))
                log.info(
                    "GPU %d (%s) %s; the pod SM families are left out for the pods concerned",
                    device.index,
                    device.uuid,
                    why,
                )

    def _account_lost(self, gpus: Sequence[GpuRow]) -> tuple[GpuIdentity, ...]:
        """The GPUs known and not read in this sweep, each said once when it is lost and when it
        is read again. Not asked while the driver is paused: the agent let go of it on purpose,
        and no GPU is lost meanwhile."""
        before = {gpu.uuid for gpu in self._lost}
        self._known, self._lost = after_sweep(self._known, [gpu.device for gpu in gpus])
        for gpu in self._lost:
            if gpu.uuid not in before:
                log.warning(
                    "GPU %d (%s) cannot be read: vgpu_gpu_lost says so and its XID series stay, until it is read again",
                    gpu.index,
                    gpu.uuid,
                )
        back = before - {gpu.uuid for gpu in self._lost}
        for uuid in sorted(back):
            log.info("GPU %s is read again", uuid)
        return self._lost

    def _report_blind(self, snapshot: Snapshot) -> None:
        """One error line when the agent goes blind (or other GPUs join), one when it sees again."""
        uuids = frozenset(gpu.uuid for gpu in snapshot.blind)
        if uuids - self._blind_uuids:
            log.error("%s", blind_message(snapshot.blind))
        elif self._blind_uuids and not uuids and snapshot.ok:
            log.info("NVML lists the processes of every GPU in use again")
        if snapshot.ok:
            self._blind_uuids = uuids

    def _report(self, errors: SweepErrors) -> None:
        """Count every failure; log each kind once, when it starts and when it ends."""
        for (stage, kind), message in errors.seen.items():
            # An unexpected exception logged its traceback already.
            self._health.failed(stage, kind, f"{stage.value} failed: {message}", log=stage is not Stage.SWEEP)
        for stage in SWEEP_STAGES:
            still = {kind for (seen, kind) in (*errors.seen, *errors.ongoing) if seen is stage}
            self._health.recovered(stage, f"{stage.value} recovered ({{kinds}})", still=still)
