"""How each GPU is read in a sweep: the policy that decides, per GPU, what to ask NVML.

- per-process utilization over the window since that GPU's last sweep, and the
  GPU's own samples over the same window, so that the processes can be fitted
  under the GPU (gpu/sampling.py); a PID's samples from before the process that
  holds it now started are dropped (a reused PID inherits nothing);
- the compute mode, only on a GPU whose processes include MPS clients (collect/trust.py);
- a GPU that answers NOT_SUPPORTED for per-process utilization is left alone
  for `ask_again_s`, not failed every sweep;
- the energy counter is read every `energy_every_s`, not every sweep, and at the sweep after
  a process left the GPU: the energy its pod is owed is then split at once, and the pod's
  series, kept until the readers have it (collect/usage.py), need not wait for the next read;
- the GPU's own samples of its other engines (memory copy, the video engines) are
  read when an engine window closes, every `engine_every_s`, and only those of an
  engine some process used in the window (collect/engines.py carries the pods'
  figures to the close).

State is kept per GPU UUID (indexes can change across a driver reload). A
fake backend tests it (tests/unit/collect/test_reading.py); the sampler keeps the cache,
the driver pause and the reports.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from otel_vgpu.agent_health import Stage
from otel_vgpu.collect import ledger
from otel_vgpu.collect.aggregate import GpuReading
from otel_vgpu.collect.estimator import SETTLE_US, WAIT_US
from otel_vgpu.collect.gpm_reads import GPM_DEADLINE_S, GpmReads
from otel_vgpu.config import ASK_AGAIN_S, ENERGY_EVERY_S, ENGINE_EVERY_S
from otel_vgpu.gpu.backend import (
    AccountingRecord,
    Device,
    ErrorCode,
    GpuBackend,
    GpuError,
    GpuProcess,
    ProcessUse,
    UtilizationSample,
)
from otel_vgpu.gpu.sampling import MIN_WINDOW_US, SamplingWindows, mean_since, window_start
from otel_vgpu.pods.cgroups import PodRef

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SweepErrors:
    """Failures of one sweep: (stage, kind) -> message."""

    seen: dict[tuple[Stage, str], str] = field(default_factory=dict)
    ongoing: set[tuple[Stage, str]] = field(default_factory=set)
    """Failures still in force that this sweep did not ask about again: not counted, not recovered."""

    def add(self, stage: Stage, kind: str, message: str) -> None:
        self.seen.setdefault((stage, kind), message)


# A window closes at the first sweep this far into `engine_every_s`.
CLOSE_EARLY = 0.95
# How often, at most, the watch reads a GPU's per-process samples while a process is young: at
# every look of the default watch. The recorded driver stamps about one process a period on a
# GPU, and drops a process's sample when it ends: read every 0.5 s, a fresh process of the
# recordings that lived 1 s had its samples unread at 6 of 40 phases, and the simulated node's
# 1 s bursts lost one in eight (bench/results/bill-evaluation.md); every 0.25 s, none of the
# recorded ones. Each read costs 2 ms of CPU on an H200 (bench/results/h200-sweep-cost.md):
# a GPU whose tenants start a process a second costs at most 0.8 % of a core, a steady one nothing.
SAMPLE_EVERY_S = 0.25
# How long after it is first listed a process is young: the watch reads its samples.
YOUNG_US = 5_000_000
# How long after a change of a GPU's memory in use the watch lists it at every look: on an
# H200 a new process's context holds its memory 220 ms before NVML lists the process
# (bench/results/h200-memory-probe.md), so a listing at the change alone finds it not yet there.
LIST_AFTER_CHANGE_US = 1_000_000


@dataclass(frozen=True, slots=True)
class _Pending:
    """What a sweep read of a GPU's processes, kept until they are attributed (`settle`)."""

    now_us: int
    samples: tuple[UtilizationSample, ...]
    born: Mapping[int, int]
    periods: tuple[tuple[int, float], ...] | None
    records: tuple[AccountingRecord, ...] = ()
    """NVML's accounting of the processes that ended since the last read, where it is on."""


@dataclass(slots=True)
class _EngineWindow:
    """A GPU's open engine window: since when, and which engines its processes used in it."""

    opened: float
    since_us: int
    busy: set[str] = field(default_factory=set)


class Read(str, Enum):
    """What a sweep may read of a GPU beside its `Device` and its processes: each only
    where a family the agent publishes needs it (each family's `reads`, export/family.py;
    docs/metrics.md's reads table says which)."""

    PROCESS_USE = "process_use"
    """Per-process utilization samples."""
    GPU_SAMPLES = "gpu_samples"
    """The GPU's own utilization samples over the window."""
    ENERGY = "energy"
    """The energy counter."""
    ENGINE_SAMPLES = "engine_samples"
    """The GPU's own samples of its engines beside SM, when an engine window closes."""
    GPM = "gpm"
    """GPM's figures of the GPU and its MIG GPU instances, when a GPM window closes."""
    HEALTH = "health"
    """The GPU's health figures, every 10 s off the scrape's path (collect/device_health.py), not in sweeps."""
    XID_EVENTS = "xid_events"
    """NVML's XID events, waited on by a thread of their own (collect/xids.py)."""


Identify = Callable[[Sequence[int]], Mapping[int, ledger.Seen]]
"""Who each of these new processes is, by PID: its start and pod, read at first sight."""

Born = Callable[[Sequence[int]], Mapping[int, int]]
"""When each of these processes started, by PID, on the samples' clock (microseconds); a PID
absent is gone or unreadable (pods/attribution.py `Attributor.started_us`)."""


def _unborn(pids: Sequence[int]) -> Mapping[int, int]:
    return {}


class GpuReader:
    """Reads GPUs as the policy above says, keeping what it needs from one sweep to the next."""

    def __init__(
        self,
        backend: GpuBackend,
        clock: Callable[[], float] = time.monotonic,
        ask_again_s: float = ASK_AGAIN_S,
        energy_every_s: float = ENERGY_EVERY_S,
        reads: frozenset[Read] = frozenset(Read),
        engine_every_s: float = ENGINE_EVERY_S,
        sample_every_s: float = SAMPLE_EVERY_S,
        gpm_deadline_s: float = GPM_DEADLINE_S,
    ) -> None:
        """`reads`: what beside the device and its processes is read; the rest is never asked."""
        self._backend = backend
        self._reads = reads
        self._clock = clock
        self._ask_again_s = ask_again_s
        self._energy_every_s = energy_every_s
        self._windows = SamplingWindows()
        # GPUs whose NVML cannot tell per-process utilization (vGPU guests,
        # some older boards): left alone for `ask_again_s` after each NOT_SUPPORTED
        # (a driver upgrade or a mode change can bring it), not an error each sweep.
        self._no_process_utilization: dict[str, float] = {}
        self._energy_read_at: dict[str, float] = {}
        """When each GPU's energy counter was last read, by UUID; absent: never, or it has none."""
        self._gpu_seen: dict[str, int] = {}
        """The newest GPU utilization sample read, by GPU UUID."""
        self._engine_every_s = engine_every_s
        self._engine_windows: dict[str, _EngineWindow] = {}
        """Each GPU's open engine window, by UUID."""
        self._listed: dict[str, frozenset[tuple[int, int | None]]] = {}
        """The processes each GPU listed at its last sweep, (PID, start), by UUID."""
        self._gpm = GpmReads(backend, clock, engine_every_s * CLOSE_EARLY, gpm_deadline_s)
        """Each GPU's GPM windows, which last as engine windows do, and the threads they are read on."""
        self._ledgers: dict[str, ledger.GpuLedger] = {}
        """Each GPU's processes' lives (collect/ledger.py), by UUID."""
        self._pending: dict[str, _Pending] = {}
        self._periods: dict[str, tuple[tuple[int, float], ...]] = {}
        self._window_began: dict[str, int] = {}
        self._uuids: dict[int, str] = {}
        """Each GPU's UUID by index, as the last sweep read it: what the watch looks at."""
        self._sample_every_us = round(sample_every_s * 1e6)
        self._list_until: dict[str, int] = {}
        """Until when each GPU is listed at every look, after its memory in use changed."""
        self._memory_seen: dict[str, int] = {}
        """Each GPU's memory in use at its last listing, by UUID: the watch lists it anew on a change."""
        self.watch_listings = 0
        """How many times the watch has listed a GPU's processes."""
        self._watch_sampled: dict[str, int] = {}
        """When the watch last read each GPU's per-process samples, by UUID."""
        self.watch_samples = 0
        """How many times the watch has read per-process samples (each costs 2 ms on an H200)."""
        self._accounted: dict[str, dict[int, int | None]] = {}
        """By UUID, where accounting mode is on: each PID of its buffer, and the start of the
        ended process whose record was taken (None: in the buffer when the agent found it)."""

    def keep_only(self, gpu_uuids: Iterable[str]) -> None:
        """Forget the GPUs that are gone (their windows restart if they come back)."""
        keep = set(gpu_uuids)
        self._windows.keep_only(keep)
        self._listed = {uuid: pids for uuid, pids in self._listed.items() if uuid in keep}
        self._ledgers = {uuid: book for uuid, book in self._ledgers.items() if uuid in keep}
        self._engine_windows = {uuid: w for uuid, w in self._engine_windows.items() if uuid in keep}
        self._gpm.keep_only(keep)

    def read(self, index: int, errors: SweepErrors, born: Born = _unborn) -> GpuReading | None:
        """GPU `index` as this sweep reads it; None where the device itself could not be read.
        `born`: when its processes started, to drop their PIDs' older samples."""
        try:
            device = self._backend.device(index)
        except GpuError as error:
            errors.add(Stage.DEVICE, f"{index}:{error.code.value}", f"GPU {index}: {error}")
            return None
        self._uuids[index] = device.uuid
        if Read.GPU_SAMPLES in self._reads:
            device = self._with_window(index, device)
        try:
            processes: list[GpuProcess] | None = self._backend.processes(index)
        except GpuError as error:
            errors.add(Stage.PROCESSES, f"{index}:{error.code.value}", f"GPU {index}: {error}")
            processes = None
        started = born([p.pid for p in processes]) if processes is not None else {}
        if Read.ENERGY in self._reads:
            device = self._with_energy(index, device, errors, self._left(device.uuid, processes, started))
        if processes is None:
            return GpuReading(device=device, processes=None, use_by_pid=None)
        if any(p.mps_client for p in processes):
            device = self._with_compute_mode(index, device)
        if device.mig_mode or Read.PROCESS_USE not in self._reads:
            # NVML has no per-process utilization under MIG: not an error. Or no family needs it.
            return GpuReading(device=device, processes=processes, use_by_pid=None)
        unsupported_until = self._no_process_utilization.get(device.uuid)
        if unsupported_until is not None and self._clock() < unsupported_until:
            errors.ongoing.add((Stage.PROCESS_UTILIZATION, f"{index}:{ErrorCode.NOT_SUPPORTED.value}"))
            return GpuReading(device=device, processes=processes, use_by_pid=None)
        now = self._backend.now_us()
        # Back to what can still settle: NVML may show a sample well after its stamp (1.9 s on
        # an H200: docs/nvml-sampling.md), and the ledger knows each one it has. At a GPU's first
        # read, every sample a process's next may wait on (`WAIT_US`): NVML keeps each
        # process's newest, and one that waits seconds for its next (about one process a period
        # gets one) then holds its periods open rather than reading as idle (collect/ledger.py).
        if self._windows.collected(device.uuid):
            since = self._windows.start(device.uuid, now) - SETTLE_US
        else:
            since = now - WAIT_US
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
        self._window_began[device.uuid] = since
        self._windows.advance(device.uuid, now)
        self._no_process_utilization.pop(device.uuid, None)
        device, records = self._with_accounting(index, device, processes)
        self._pending[device.uuid] = _Pending(
            now, tuple(samples), started, self._periods.pop(device.uuid, None), records
        )
        return GpuReading(device=device, processes=processes, use_by_pid=None)

    def _with_accounting(
        self, index: int, device: Device, processes: Sequence[GpuProcess]
    ) -> tuple[Device, tuple[AccountingRecord, ...]]:
        """The device marked with whether NVML's accounting mode is on, and, where it is, the
        accounting of each process that ended since the last read. Only a PID new to the buffer,
        or one that the last look listed and this one does not, is asked about: one call per
        process that ended, never one per process in the buffer (4,000 on an H200). The buffer
        as the agent first finds it is history, and is not asked about at all."""
        try:
            pids = self._backend.accounting_pids(index)
        except GpuError:
            # Unknown this sweep: the samples and listings serve, and what the buffer held is
            # kept, so that the next read asks about what ended meanwhile.
            return device, ()
        if pids is None:
            self._accounted.pop(device.uuid, None)
            return dataclasses.replace(device, accounting_mode=False), ()
        device = dataclasses.replace(device, accounting_mode=True)
        done = self._accounted.get(device.uuid)
        buffered = set(pids)
        if done is None:
            self._accounted[device.uuid] = dict.fromkeys(buffered)
            return device, ()
        running = {p.pid for p in processes}
        book = self._ledgers.get(device.uuid)
        last_listed = set(book.listed) if book is not None else set()
        records = []
        for pid in sorted(buffered - running):
            if pid in done and pid not in last_listed:
                continue
            try:
                record = self._backend.accounting_stats(index, pid)
            except GpuError:
                continue
            if record is None or record.running or done.get(pid) == record.started_us:
                continue
            done[pid] = record.started_us
            records.append(record)
        for pid in set(done) - buffered:
            del done[pid]  # out of the circular buffer
        return device, tuple(records)

    def settle(self, reading: GpuReading, pods: Mapping[int, PodRef | None], starts: Mapping[int, int]) -> GpuReading:
        """The reading with what each process ran over the window (collect/ledger.py), once its
        processes are attributed (`pods`, by PID; `starts`: their start times, in clock ticks)
        and MPS judged (`reading.unknown_pids`). A reading without per-process samples is as read."""
        device = reading.device
        pending = self._pending.pop(device.uuid, None)
        if pending is None or reading.processes is None:
            self._ledgers.pop(device.uuid, None)
            return reading
        book = self._ledgers.setdefault(device.uuid, ledger.GpuLedger())
        processes = reading.processes
        ledger.listed(
            book,
            pending.now_us,
            [ledger.Seen(p.pid, starts.get(p.pid), pending.born.get(p.pid), pods.get(p.pid)) for p in processes],
        )
        refused = ledger.sampled(book, pending.samples, pending.now_us)
        ledger.accounted(book, pending.records)
        self._memory_seen[device.uuid] = device.memory_used
        ledger.unknown(book, reading.unknown_pids)
        periods = pending.periods
        if periods is None:
            # No sample buffer of the GPU's own: the window is one period, at its last figure.
            began = self._window_began.get(device.uuid, pending.now_us - MIN_WINDOW_US)
            # It settles at once: no later sample of the GPU's would change it.
            window = ledger.close(
                book, [(pending.now_us, device.utilization)], now_us=None, period_us=max(1, pending.now_us - began)
            )
        else:
            window = ledger.close(book, periods, pending.now_us)
        use_by_pid, earlier = ledger.means(window)
        if window.seconds > 0:
            book.shown = (use_by_pid, window.gpu_busy / window.seconds)
        else:
            # No period settled since the last sweep (sweeps closer together than the GPU's
            # period): the gauges keep the last window's figures, and the counters add nothing.
            use_by_pid = {pid: use for pid, use in book.shown[0].items() if pid in book.listed}
        if Read.ENGINE_SAMPLES in self._reads and device.engines:
            # The samples too: an MPS server's holds its clients' engines, which no pod is given.
            uses = [*use_by_pid.values(), *earlier.values(), *(sample.use for sample in pending.samples)]
            device = self._with_engine_window(device.index, device, uses, pending.now_us)
        return dataclasses.replace(
            reading,
            device=device,
            use_by_pid=use_by_pid,
            earlier_use=earlier,
            users=window.users,
            busy_seconds=window.gpu_busy,
            unexplained_seconds=window.unexplained,
            unattributed_seconds=window.unattributed,
            window_seconds=window.seconds,
            window_utilization=book.shown[1],
            reused_pids=refused,
        )

    def watch(self, index: int, identify: Identify) -> None:
        """One look at GPU `index` between sweeps (collect/process_watch.py): its processes listed, each
        new one attributed at first sight, while its /proc entry exists, and the GPU's samples
        read while a process listed is young, at most every `sample_every_s`."""
        uuid = self._uuids.get(index)
        if uuid is None or Read.PROCESS_USE not in self._reads or uuid in self._no_process_utilization:
            return
        book = self._ledgers.get(uuid)
        if book is None:
            return  # no window open: a MIG GPU, or one not swept yet
        try:
            used = self._backend.memory_used(index)
            now = self._backend.now_us()
            if used != self._memory_seen.get(uuid):
                self._memory_seen[uuid] = used
                self._list_until[uuid] = now + LIST_AFTER_CHANGE_US
            if now <= self._list_until.get(uuid, 0):
                self._list(index, book, now, identify)
            else:
                # Nothing came or went: a process holds a context, whose memory counts in the
                # GPU's. The listings, dearer with each process, wait for a change.
                ledger.confirmed(book, now)
        except GpuError:
            return  # the sweep says what fails
        self._sample_young(index, uuid, book, now)

    def _list(self, index: int, book: ledger.GpuLedger, now: int, identify: Identify) -> None:
        """GPU `index`'s processes listed by the watch into its ledger, a new one attributed."""
        processes = self._backend.processes(index)
        self.watch_listings += 1
        known = {pid: book.lives[key] for pid, key in book.listed.items() if key in book.lives}
        fresh = identify([p.pid for p in processes if p.pid not in known])
        seen = []
        for process in processes:
            life = known.get(process.pid)
            if life is not None:
                seen.append(ledger.Seen(process.pid, life.start, life.born_us, life.owner))
            else:
                seen.append(fresh.get(process.pid) or ledger.Seen(process.pid, None, None, None))
        ledger.listed(book, now, seen)

    def _sample_young(self, index: int, uuid: str, book: ledger.GpuLedger, now: int) -> None:
        """The GPU's per-process samples, where a process has been listed for less than
        `YOUNG_US`, at most every `sample_every_s`."""
        # A young process's samples are its only evidence, and NVML forgets them when the
        # process ends: one born just after a sweep may end before the next. Its figure is a
        # mean over 14.2 s (collect/trailing.py), which grows with what it ran: its newest is
        # worth reading while it may end soon. One listed for longer the sweeps read.
        unsampled = any(
            now - life.since_us < YOUNG_US for key in book.listed.values() if (life := book.lives.get(key)) is not None
        )
        last = self._watch_sampled.get(uuid, 0)
        if not unsampled or now - last < self._sample_every_us:
            return
        self._watch_sampled[uuid] = now
        try:
            samples = self._backend.utilization_samples(index, now - MIN_WINDOW_US)
        except GpuError:
            return
        self.watch_samples += 1
        ledger.sampled(book, samples, now)

    def _with_compute_mode(self, index: int, device: Device) -> Device:
        """The device with its compute mode, where NVML tells it (collect/trust.py decides on it)."""
        try:
            exclusive = self._backend.exclusive_process(index)
        except GpuError:
            return device  # unknown: the default mode's rules, which trust no more than they must
        return dataclasses.replace(device, exclusive_process=exclusive)

    def _with_engine_window(self, index: int, device: Device, uses: Iterable[ProcessUse], now_us: int) -> Device:
        """The device with the GPU's own figure of each engine over the window that closes in
        this sweep, if one does. The buffer of an engine that no process used in the window
        is not read: NVML splits an engine's time among the processes that ran on it, so none
        having any means the engine was idle, and the GPU's figure is 0."""
        window = self._engine_windows.get(device.uuid)
        if window is None:
            self._engine_windows[device.uuid] = _EngineWindow(self._clock(), now_us)
            return device
        window.busy.update(e for use in uses for e in device.engines if getattr(use, e) > 0)
        # A sweep a little early still closes the window: at a 2 s cadence one at 9.99 s
        # would otherwise stretch it to 12 s, and the counters, which step at each close,
        # would step unevenly.
        if self._clock() - window.opened < self._engine_every_s * CLOSE_EARLY:
            return device
        means: dict[str, float] = {}
        # Never over less than the last second, as SM's windows: NVML's samples are 200 ms apart.
        since = window_start(window.since_us, now_us)
        for engine in sorted(device.engines):
            if engine not in window.busy:
                means[engine] = 0.0
                continue
            try:
                samples = self._backend.gpu_utilization_samples(index, since, engine)
            except GpuError:
                continue  # unknown for this window: the pods' figures stand unfitted
            means[engine] = mean_since(samples, since) or 0.0
        self._engine_windows[device.uuid] = _EngineWindow(self._clock(), now_us)
        return dataclasses.replace(device, engine_window=means)

    def read_gpm(self, readings: Sequence[GpuReading], errors: SweepErrors) -> list[GpuReading]:
        """The readings with the GPM figures of each GPU whose GPM window closes in this sweep:
        every GPU at once, under one deadline (collect/gpm_reads.py)."""
        return self._gpm.read(readings, errors) if Read.GPM in self._reads else list(readings)

    def take_gpm_seconds(self) -> float | None:
        """How long the GPM reads since the last call took (collect/gpm_reads.py): the `gpm` reader's pass."""
        return self._gpm.take_seconds()

    def _left(self, uuid: str, processes: list[GpuProcess] | None, started: Mapping[int, int]) -> bool:
        """Whether a process listed on the GPU at its last sweep is not listed now (its PID
        gone, or held by a process that started since)."""
        if processes is None:
            return False
        now = frozenset((p.pid, started.get(p.pid)) for p in processes)
        before = self._listed.get(uuid, frozenset())
        self._listed[uuid] = now
        return bool(before - now)

    def _with_energy(self, index: int, device: Device, errors: SweepErrors, now_anyway: bool = False) -> Device:
        """The device with its energy counter, read every `energy_every_s` (and, with
        `now_anyway`, at once): one read cost 3.9 ms of CPU on an H200, more than the rest
        of a sweep of that GPU together (bench/results/h200-sweep-cost.md). Between reads the
        device is marked skipped, and the sweeps wait to have the next read's energy split
        over them."""
        read_at = self._energy_read_at.get(device.uuid)
        now = self._clock()
        if read_at is not None and now - read_at < self._energy_every_s and not now_anyway:
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
        # At the first sweep, far enough back that a window settles at once (collect/ledger.py):
        # the GPU keeps its samples of the seconds before (14 s on an H200).
        since = self._gpu_seen.get(device.uuid, now - MIN_WINDOW_US - SETTLE_US)
        try:
            samples = self._backend.gpu_utilization_samples(index, since)
        except GpuError:
            return device
        mean = mean_since(samples, since)
        if mean is None:
            # No period ended since the last read (sweeps closer than the GPU's period): the
            # ledger settles what it holds as time passes.
            self._periods[device.uuid] = ()
            return device
        self._gpu_seen[device.uuid] = max(stamp for stamp, _ in samples)
        self._periods[device.uuid] = tuple((stamp, value) for stamp, value in samples if stamp > since)
        return dataclasses.replace(device, utilization_window=mean)
