"""The simulated GPU node: a GPU backend driven by a scenario, with its proc tree, kubelet and faults.

Only NVML and the host are simulated. The node answers as NVML would (devices, process
listings, per-process and device samples, energy, accounting) from who runs when
(sim/processes.py); keeps a proc tree shaped like a kubelet's node's (sim/proc_tree.py), so
the agent's real proc reader, cgroup parser and attribution cache run on it; answers as the
kubelet's pod-resources API and the Kubernetes API would (sim/kubelet.py); and fails or
slows calls as the scenario or a test says (sim/faults.py).

The simulated processes live in the host's PID namespace. Like drivers from
535.113 on (the scenario's `driver.pid_namespace_filter`, on by default), the
node lists them only to an agent that shares that namespace: an agent in a
PID namespace of its own (`unshare --pid`, a container without `--pid=host`)
sees the devices busy and holding memory, and no process.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from otel_vgpu.allocation.shares import Allocation, KubeletView
from otel_vgpu.gpu.backend import (
    ENGINES,
    USE_FIGURES,
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
from otel_vgpu.gpu.pidns import in_host_pid_namespace
from otel_vgpu.pods.directory import StaticDirectory
from otel_vgpu.sim import kubelet
from otel_vgpu.sim.device_figure_values import SimulatedHealth
from otel_vgpu.sim.faults import Faults
from otel_vgpu.sim.proc_tree import ProcTree, new_root
from otel_vgpu.sim.processes import Picks, Process, Workload, busy, dodgers, own_uses, uses, whole_percent
from otel_vgpu.sim.scenario import PIPES, MigSpec, Scenario

MIG_RESERVED_BYTES = 64 * 1024 * 1024
# The simulated GPUs' power: idle, and at full SM use (an H200's board limit, 700 W).
IDLE_WATTS = 75.0
FULL_WATTS = 700.0
# The energy counter integrates the power of the periods since its last read, at most this many.
ENERGY_PERIODS_KEPT = 300
# In the proc tree's directory, beside the PIDs: the file the simulated driver keeps open.
DRIVER_FILE = "nvidiactl"
# As NVML does on an H200 with driver 580 (bench/results/h200-nvml-samples.md):
# it keeps the latest utilization sample of each process, refreshed every
# 200 ms sample period in which the process ran, and gives the GPU's
# utilization over its last period. The simulated driver's periods are on one
# grid, and a process's latest busy period is looked for up to 50 periods back.
SAMPLE_PERIOD_US = 200_000
SAMPLES_KEPT = 50
# A process's figure: the mean of its use over this many periods up to its sample's, in whole
# percent rounded down (docs/nvml-sampling.md: 85 % of a lone process's figures on an H100).
SMOOTHED_PERIODS = 71
# Sample periods whose running processes are remembered (`_alive`): four seconds, what a sweep's
# samples reach back at the sweeper's longest wait (1.5 x 2 s) and a second more. Older periods
# are worked out again if asked for (a GPM window's, say), since on a churning node thousands of
# processes run in a second. Each GPU's figure of a period is remembered longer (`_busy`), as
# far as its energy counter reaches.
ALIVE_KEPT = 20
# Probes of the memory in use this close together are of one moment (`memory_used`).
PROBE_REUSE_S = 0.01
# How long before NVML lists a new process its context's memory counts in the GPU's memory in
# use: 218-227 ms on an H200, driver 580 (bench/results/h200-memory-probe.md).
MEMORY_LEAD_S = 0.22
BUSY_PERIODS_KEPT = ENERGY_PERIODS_KEPT + SAMPLES_KEPT
# The processes an accounting buffer holds: 4,000 on an H200 (nvidia-smi -q -d ACCOUNTING).
ACCOUNTING_KEPT = 4000


@dataclass(slots=True)
class _Accounted:
    """One process in a GPU's accounting buffer: its periods and what it ran in them."""

    started_us: int
    """The start of the first period it ran in (or of the first brought up)."""
    ends_at: float
    periods: int = 0
    sm: float = 0.0
    memory_copy: float = 0.0


class SimulatedNode:
    """A GPU backend, an allocation source and a proc tree for one scenario."""

    def __init__(
        self,
        scenario: Scenario,
        proc_root: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_us: Callable[[], int] = lambda: time.time_ns() // 1000,
        host_pid_namespace: bool | None = None,
    ) -> None:
        """`host_pid_namespace`: whether the agent shares the host's PID
        namespace; by default, whether this process does."""
        self.scenario = scenario
        if host_pid_namespace is None:
            host_pid_namespace = in_host_pid_namespace() is not False
        # What the driver hides from this caller: every simulated process, or none.
        self._hidden = scenario.driver.pid_namespace_filter and not host_pid_namespace
        self._owns_root = proc_root is None
        self.proc_root = proc_root or new_root()
        self._clock = clock
        self._wall_clock_us = wall_clock_us
        self._started = clock()
        self._wall_started_us = wall_clock_us()
        self._lock = threading.Lock()
        self._tree = ProcTree(self.proc_root)
        self._workload = Workload()
        self._state_at: float | None = None
        self._listed_now: set[int] = set()
        """The GPUs listed since the processes were last brought to the present."""
        self._probed_at = -math.inf
        """When the memory in use was last probed: a listing after it is of a moment no older."""
        self._probed: list[int] = []
        self._processes: list[Process] = []
        self._faults = Faults()
        # The simulated driver's control file, held open while the driver is
        # in use, as NVML holds /dev/nvidiactl: what a driver upgrade waits on.
        self.driver_file = self.proc_root / DRIVER_FILE
        self.proc_root.mkdir(parents=True, exist_ok=True)
        self.driver_file.touch()
        self._driver: IO[bytes] | None = None
        self._released = False
        # Each GPU's energy counter, as NVML's: millijoules since the driver loaded.
        self._energy_mj = [0.0] * len(scenario.gpus)
        self._energy_at: list[float | None] = [None] * len(scenario.gpus)
        self._alive_at: dict[int, list[Process]] = {}
        # Each GPU's processes' uses by period: every sweep and look asks for the same again.
        self._uses_at: dict[tuple[int, int], dict[tuple[int, int], ProcessUse]] = {}
        """By sample period (its end, on the samples' clock): the processes that ran in it, from
        the scenario itself, whether or not any listing saw them."""
        self._alive_lock = threading.Lock()
        self._accounts: dict[int, dict[tuple[int, int], _Accounted]] = {}
        """Each GPU's accounting buffer, where its accounting mode is on, by (PID, start time)."""
        self._accounted_to: dict[int, int] = {}
        self._busy_at: dict[int, dict[str, tuple[float, ...]]] = {}
        """Every GPU's figure of each engine by sample period, as worked out (`_busy`)."""
        self._health = SimulatedHealth(scenario, self.now, self._running_at, IDLE_WATTS, FULL_WATTS)
        self.refresh()

    # The scenario's time: seconds since the node started.
    def now(self) -> float:
        return self._clock() - self._started

    def directory(self) -> StaticDirectory:
        return kubelet.directory(self.scenario)

    def fail(self, call: str, index: int, code: ErrorCode | str | None) -> None:
        """Make `call` ('device', 'processes', 'utilization_samples') fail on
        GPU `index` with `code` from now on, or succeed again with None: a
        scenario fault switched on and off by a test."""
        self._faults.switch(call, index, code)

    # --- AllocationSource ---------------------------------------------------

    def allocation(self, gpus: Sequence[Device]) -> Allocation:
        """What a kubelet with the NVIDIA device plugin (and DRA driver)
        would answer for the scenario now, counted by the agent's own rules."""
        # The time of the sweep's process listing, so shares and processes
        # describe the same moment.
        t = self._state_at if self._state_at is not None else self.now()
        return kubelet.allocation(self.scenario, t, gpus)

    def kubelet_view(self, t: float) -> KubeletView:
        """pod-resources' List and GetAllocatableResources for the scenario at time `t`."""
        return kubelet.kubelet_view(self.scenario, t)

    # --- GpuBackend -----------------------------------------------------------

    def device_count(self) -> int:
        if self._released:
            raise GpuError(ErrorCode.UNINITIALIZED, "simulated NVML released while the GPU driver is paused")
        self._maybe_fail("device_count", None)
        if self._driver is None:
            self._driver = self.driver_file.open("rb")
        self.refresh()
        return len(self.scenario.gpus)

    def release(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None
        self._released = True

    def resume(self) -> None:
        """The driver back, reloaded: its energy and other volatile counters start again from 0,
        as NVML's do."""
        self._released = False
        self._energy_mj = [0.0] * len(self.scenario.gpus)
        self._energy_at = [None] * len(self.scenario.gpus)
        self._health.reloaded()

    def health(self, index: int) -> HealthReading:
        self._in_session()
        self._maybe_fail("health", index)
        return self._health.health(index)

    def gpm(self, index: int, gpu_instance: int | None = None) -> dict[str, float] | None:
        self._in_session()
        self._maybe_fail("gpm", index)
        return self._health.gpm(self.scenario.gpus[index], gpu_instance)

    def xid_events(self, index: int, most: int) -> list[XidEvent]:
        if self._released or self._driver is None:
            return []  # paused, or not opened yet: no event set
        self._maybe_fail("xid_events", index)
        return self._health.xid_events(index, most)

    def _in_session(self) -> None:
        if self._released:
            raise GpuError(ErrorCode.UNINITIALIZED, "simulated NVML released while the GPU driver is paused")

    def _running_at(self, t: float) -> list[Process]:
        """The processes running at scenario time `t` (in the sample period that holds it),
        those ended since included, whether or not the agent ever listed them."""
        stamp = self._wall_started_us + round(t * 1e6)
        return self._alive(-(-stamp // SAMPLE_PERIOD_US) * SAMPLE_PERIOD_US)

    def _alive(self, stamp_us: int) -> list[Process]:
        """The processes that ran in the sample period ending at `stamp_us`, as the scenario
        says: a process that lived between two listings still ran, and the GPU's own figures,
        its energy and its samples count it, as a real driver's do."""
        found = self._alive_at.get(stamp_us)
        if found is None:
            t = self._period_time(stamp_us)
            found = [p for p in self._processes_at(t) if p.starts_at <= t < p.ends_at]
            with self._alive_lock:
                self._alive_at[stamp_us] = found
                while len(self._alive_at) > ALIVE_KEPT:
                    del self._alive_at[min(self._alive_at)]
        return found

    def device(self, index: int) -> Device:
        self._maybe_fail("device", index)
        gpu = self.scenario.gpus[index]
        mine = [p for p in self._processes if p.gpu == index]
        busy = self._busy(index, "sm", self._latest_period())
        context = self.scenario.driver.context_memory
        migs = tuple(_mig_device(mig, [p for p in mine if p.mig == mig.uuid], context) for mig in gpu.migs)
        return Device(
            index=index,
            uuid=gpu.uuid,
            model=gpu.model,
            memory_total=gpu.memory_total,
            # NVML's v1 used: the driver's reservation, what the processes hold and their
            # contexts' memory, which no listing gives them (the scenario's check keeps it all
            # within the GPU's memory; churn aside).
            memory_used=min(gpu.memory_total, gpu.reserved + sum(p.memory + context for p in mine)),
            # NVML gives no device utilization in MIG mode; else its last sample period's.
            utilization=None if migs else busy,
            minor_number=gpu.minor,
            migs=migs,
            engines=frozenset() if migs else gpu.engines,
            memory_reserved=gpu.reserved if self.scenario.driver.memory_info_v2 else None,
            pci_bus_id=pci_bus_id(index),
            driver_version=self.scenario.driver.version,
        )

    def energy(self, index: int) -> int:
        """The energy counter: idle watts plus the SMs' share of the rest, integrated over
        the simulated driver's periods since the last read (at most the last minute's)."""
        now = self.now()
        last = self._energy_at[index]
        if last is not None and now > last:
            latest = self._latest_period()
            periods = max(1, min(ENERGY_PERIODS_KEPT, round((now - last) * 1e6 / SAMPLE_PERIOD_US)))
            busy = [self._busy(index, "sm", latest - k * SAMPLE_PERIOD_US) for k in range(periods)]
            watts = IDLE_WATTS + (FULL_WATTS - IDLE_WATTS) * sum(busy) / len(busy)
            self._energy_mj[index] += watts * (now - last) * 1000
        self._energy_at[index] = now
        return int(self._energy_mj[index])

    def processes(self, index: int) -> list[GpuProcess]:
        """The processes on the GPU now, as the driver lists them at the time of the call. A GPU
        listed again is listed anew (the watch's next look), and the node brought to the present
        first; the other GPUs are listed at that moment too, so that one sweep's or one look's
        listings, and the kubelet's view beside them, are of one moment."""
        self._maybe_fail("processes", index)
        if index in self._listed_now or (self._state_at is not None and self._state_at < self._probed_at):
            self.refresh()
        self._listed_now.add(index)
        return [GpuProcess(p.pid, p.memory, p.mig, p.mps == "client") for p in self._visible() if p.gpu == index]

    def memory_used(self, index: int) -> int:
        """The GPU's memory in use at the time of the call: its driver's part and what the
        processes running then hold, their contexts' memory with their own."""
        self._maybe_fail("device", index)
        t = self.now()
        if t - self._probed_at > PROBE_REUSE_S:
            # One look probes every GPU in turn: the moment is worked out once for all of them.
            self._probed_at = t
            held = [gpu.reserved for gpu in self.scenario.gpus]
            context = self.scenario.driver.context_memory
            for p in self._processes_at(t):
                if p.starts_at <= t < p.ends_at:
                    held[p.gpu] += p.memory + context
            # A process's context holds its memory before the driver lists the process, as on
            # the H200 (bench/results/h200-memory-probe.md).
            for p in self._processes_at(t + MEMORY_LEAD_S):
                if t < p.starts_at <= t + MEMORY_LEAD_S:
                    held[p.gpu] += p.memory + context
            self._probed = held
        return min(self.scenario.gpus[index].memory_total, self._probed[index])

    def exclusive_process(self, index: int) -> bool:
        return self.scenario.gpus[index].compute_mode == "exclusive_process"

    def accounting_pids(self, index: int) -> list[int] | None:
        """The PIDs of the accounting buffer, where the GPU's accounting mode is on: every
        process that ran on it since the node started (the last `ACCOUNTING_KEPT`)."""
        self._maybe_fail("accounting", index)
        if not self.scenario.gpus[index].accounting:
            return None
        return [] if self._hidden else [pid for pid, _ in self._account(index)]

    def accounting_stats(self, index: int, pid: int) -> AccountingRecord | None:
        """The accounting of the latest process to hold `pid`, as NVML's: its lifetime's share
        of periods with its kernels running, in whole percent, and its context's time once it
        ended (0 while it runs)."""
        self._maybe_fail("accounting", index)
        found = [life for (each, _), life in self._account(index).items() if each == pid]
        if not found or self._hidden:
            return None
        life = max(found, key=lambda life: life.started_us)
        ended = life.ends_at <= self.now()
        periods = max(1, life.periods)
        # Its context's time on the driver's grid: the periods it ran in, as `ran` counts them.
        return AccountingRecord(
            pid=pid,
            started_us=life.started_us,
            seconds=periods * SAMPLE_PERIOD_US / 1e6 if ended else 0.0,
            running=not ended,
            sm=round(100 * life.sm / periods) / 100,
            memory_copy=round(100 * life.memory_copy / periods) / 100,
        )

    def _account(self, index: int) -> dict[tuple[int, int], _Accounted]:
        """GPU `index`'s accounting buffer, brought to the last complete sample period: what each
        process ran in each period since it was last brought up (at most the last minute's)."""
        book = self._accounts.setdefault(index, {})
        latest = self._latest_period()
        done = self._accounted_to.get(index, latest - SAMPLE_PERIOD_US)
        stamp = max(done, latest - ENERGY_PERIODS_KEPT * SAMPLE_PERIOD_US) + SAMPLE_PERIOD_US
        while stamp <= latest:
            alive = [p for p in self._alive(stamp) if p.gpu == index]
            for process, use in zip(alive, uses(alive, self._period_time(stamp)), strict=True):
                key = (process.pid, process.start_time)
                life = book.get(key)
                if life is None:
                    life = book[key] = _Accounted(stamp - SAMPLE_PERIOD_US, process.ends_at)
                    while len(book) > ACCOUNTING_KEPT:
                        del book[next(iter(book))]
                life.periods += 1
                life.sm += use.sm
                life.memory_copy += use.memory_copy
            stamp += SAMPLE_PERIOD_US
        self._accounted_to[index] = latest
        return book

    def utilization_samples(self, index: int, since_us: int) -> list[UtilizationSample]:
        """Each PID's latest sample, as NVML keeps it: stamped at the last period in which the
        process that held the PID then ran, its figure the mean of its use over the
        `SMOOTHED_PERIODS` up to it, in whole percent (docs/nvml-sampling.md); on a
        driver that keeps them (`driver.ended_samples_s`), that of a process that has ended
        since, its PID maybe reused. Under MPS the server's sample is its clients' use and its
        own; the clients have none."""
        self._maybe_fail("utilization_samples", index)
        if self.scenario.gpus[index].migs:
            raise GpuError(ErrorCode.NOT_SUPPORTED, "simulated: no per-process utilization in MIG mode")
        if self._hidden:
            return []
        # Who ran in each period shares the GPU, ended processes included; whose samples NVML
        # still has: the running ones', and the ended ones' the driver keeps.
        now = self.now()
        kept_since = now - self.scenario.driver.ended_samples_s
        latest = self._latest_period()
        newest: dict[int, tuple[int, tuple[int, int]]] = {}
        by_period: dict[int, dict[tuple[int, int], ProcessUse]] = {}

        def period(stamp: int) -> dict[tuple[int, int], ProcessUse]:
            found = by_period.get(stamp)
            if found is None:
                found = by_period[stamp] = self._period_uses(index, stamp)
            return found

        # Where the driver keeps no ended process's sample, only those running now have one: once
        # each has its newest, older periods hold nothing more (a churning node runs thousands).
        running = None
        if self.scenario.driver.ended_samples_s <= 0:
            alive = self._alive(latest)
            running = {p.pid for p in alive if p.gpu == index and p.mps != "client" and p.starts_at <= now < p.ends_at}
        kept = {
            (p.pid, p.start_time)
            for p in self._processes_at(self._scenario_time(latest))
            if p.gpu == index and (p.starts_at <= now < p.ends_at or p.ends_at > kept_since)
        }
        driver = self.scenario.driver
        rhythm_us = round(driver.rhythm_ms * 1000) if driver.one_sample_a_period else 0
        picks = Picks(index, period, driver.draw_seed, rhythm_us, dodgers(self.scenario, self._alive, index))
        for stamp in (latest - k * SAMPLE_PERIOD_US for k in range(SAMPLES_KEPT)):
            if stamp <= since_us or (running is not None and running <= newest.keys()):
                break
            stamped = picks.taker(stamp) if driver.one_sample_a_period else None
            for key, use in period(stamp).items():
                # One sample per PID, its newest: an older one of the same PID is another
                # period's, or another holder's. NVML keeps the last period it ran in (at the
                # recorded cadence, the one it was drawn in: `stamped_in`).
                drawn = stamped is None or use.sm == 0 or key == stamped
                if key[0] in newest or not drawn or not any(getattr(use, f) > 0 for f in USE_FIGURES):
                    continue
                if key in kept or self._ended_kept(key, stamp, now, kept_since):
                    newest[key[0]] = (stamp, key)
        starts = {
            (p.pid, p.start_time): p.starts_at
            for at in {stamp for stamp, _ in newest.values()}
            for p in self._alive(at)
            if p.gpu == index
        }
        self._trim_uses(latest)
        samples = []
        for pid, (stamp, key) in newest.items():
            # The periods of its window it lived in: a process that began since has none before.
            start = starts.get(key, -math.inf)
            began = stamp - SMOOTHED_PERIODS * SAMPLE_PERIOD_US
            if math.isfinite(start):
                began = self._wall_started_us + round(start * 1e6) - SAMPLE_PERIOD_US
            lived = []
            for back in range(SMOOTHED_PERIODS):
                at = stamp - back * SAMPLE_PERIOD_US
                if at <= began:
                    break
                held = period(at).get(key)
                if held is not None:
                    lived.append(picks.credited(key, at, held))
            mean = ProcessUse(
                **{f: whole_percent(sum(getattr(u, f) for u in lived) / SMOOTHED_PERIODS) for f in USE_FIGURES}
            )
            samples.append(UtilizationSample(pid, stamp, mean))
        return samples

    def _ended_kept(self, key: tuple[int, int], stamp: int, now: float, kept_since: float) -> bool:
        """Whether the process `key` that ran in the period ending at `stamp` has a sample the
        driver still keeps: running now, or ended since `kept_since`."""
        return any(
            (p.pid, p.start_time) == key and (p.starts_at <= now < p.ends_at or p.ends_at > kept_since)
            for p in self._alive(stamp)
        )

    def _period_uses(self, index: int, stamp: int) -> dict[tuple[int, int], ProcessUse]:
        """What each process (PID, start time) of GPU `index` used in the period ending at
        `stamp`; an MPS server its clients' use and its own, a client none of its own."""
        found = self._uses_at.get((index, stamp))
        if found is not None:
            return found
        # Every GPU's at once, from one list of the processes alive then: a sweep asks each GPU
        # for the same periods (every kept one, at the recorded cadence), and the list is dear.
        by_gpu: dict[int, list[Process]] = {gpu: [] for gpu in range(len(self.scenario.gpus))}
        for process in self._alive(stamp):
            by_gpu.setdefault(process.gpu, []).append(process)
        every = {gpu: own_uses(alive, self._period_time(stamp)) for gpu, alive in by_gpu.items()}
        if stamp <= self._latest_period():
            with self._alive_lock:
                for gpu, mine in every.items():
                    self._uses_at.setdefault((gpu, stamp), mine)
        return every.get(index, {})

    def _trim_uses(self, latest: int) -> None:
        """Uses a figure no longer reaches let go; older than `ALIVE_KEPT` periods, only those of
        the processes alive now, where the driver keeps no ended process's sample."""
        trim, alive = self.scenario.driver.ended_samples_s <= 0, {(p.pid, p.start_time) for p in self._alive(latest)}
        with self._alive_lock:
            for (index, stamp), then in list(self._uses_at.items()):
                if stamp <= latest - (ALIVE_KEPT + SMOOTHED_PERIODS) * SAMPLE_PERIOD_US:
                    del self._uses_at[(index, stamp)]
                elif trim and stamp <= latest - ALIVE_KEPT * SAMPLE_PERIOD_US and not then.keys() <= alive:
                    self._uses_at[(index, stamp)] = {k: u for k, u in then.items() if k in alive}

    def gpu_utilization_samples(self, index: int, since_us: int, figure: str = "sm") -> list[tuple[int, float]]:
        """The GPU's figure for each period on the simulated driver's grid since `since_us`;
        an engine the GPU lacks reads 0, as NVML's buffers of one do."""
        self._maybe_fail("gpu_utilization_samples", index)
        if self.scenario.gpus[index].migs:
            raise GpuError(ErrorCode.NOT_SUPPORTED, "simulated: no device utilization in MIG mode")
        latest = self._latest_period()
        stamps = [latest - k * SAMPLE_PERIOD_US for k in range(SAMPLES_KEPT)]
        return [(stamp, self._busy(index, figure, stamp)) for stamp in reversed(stamps) if stamp > since_us]

    def _busy(self, index: int, figure: str, stamp_us: int) -> float:
        """GPU `index`'s figure of one engine over the period ending at `stamp_us`: what the
        processes running then used of it, the ended ones included. Worked out for every GPU
        at once, from one look at who ran then: the GPUs ask for the same periods in turn."""
        figures = self._busy_at.get(stamp_us)
        if figures is None:
            t = self._period_time(stamp_us)
            alive = self._alive(stamp_us)
            by_gpu = [[p for p in alive if p.gpu == gpu] for gpu in range(len(self.scenario.gpus))]
            used = {"sm", *(name for p in alive for name in (*p.engines, *p.pipes))}
            figures = self._busy_at[stamp_us] = {
                each: tuple(busy(mine, each, t, used) for mine in by_gpu) for each in ("sm", *ENGINES, *PIPES)
            }
            while len(self._busy_at) > BUSY_PERIODS_KEPT:
                del self._busy_at[next(iter(self._busy_at))]
        return figures[figure][index]

    def ran(self, index: int, start_s: float, end_s: float, pod_uid: str | None = None) -> float:
        """SM-busy seconds GPU `index` ran between two scenario times, by the scenario itself:
        its processes', or only those of pod `pod_uid` (its cgroup names it). The driver's
        truth, which the agent's bill is held to in tests and benchmarks."""
        first = self._wall_started_us + round(start_s * 1e6)
        stamp = -(-first // SAMPLE_PERIOD_US) * SAMPLE_PERIOD_US + SAMPLE_PERIOD_US
        last = self._wall_started_us + round(end_s * 1e6)
        underscored = None if pod_uid is None else pod_uid.replace("-", "_")
        total = 0.0
        while stamp <= last:
            alive = [p for p in self._alive(stamp) if p.gpu == index]
            t = self._period_time(stamp)
            for process, use in zip(alive, uses(alive, t), strict=True):
                if pod_uid is None or underscored is None or pod_uid in process.cgroup or underscored in process.cgroup:
                    total += use.sm * SAMPLE_PERIOD_US / 1e6
            stamp += SAMPLE_PERIOD_US
        return total

    def _latest_period(self) -> int:
        """The end of the simulated driver's last complete sample period."""
        return self.now_us() // SAMPLE_PERIOD_US * SAMPLE_PERIOD_US

    def _period_time(self, stamp_us: int) -> float:
        """The scenario time that stands for the sample period ending at `stamp_us`: its middle,
        so that a process counts in the periods it lived most of, as many before its start as
        after its end (at the end, a process that began with the period would count in the
        period before it too)."""
        return self._scenario_time(stamp_us - SAMPLE_PERIOD_US // 2)

    def _scenario_time(self, stamp_us: int) -> float:
        return (stamp_us - self._wall_started_us) / 1e6

    def now_us(self) -> int:
        return self._wall_clock_us()

    def _visible(self) -> list[Process]:
        return [] if self._hidden else self._processes

    def close(self) -> None:
        self.release()
        if self._owns_root:
            shutil.rmtree(self.proc_root, ignore_errors=True)

    # --- state ------------------------------------------------------------------

    def refresh(self) -> None:
        """Bring processes and the proc tree to the scenario's current time."""
        with self._lock:
            t = self.now()
            self._state_at = t
            self._listed_now = set()
            self._processes = list(self._processes_at(t))
            self._tree.write(self._processes, (self.now_us() - self._wall_started_us) / 1e6)

    def _processes_at(self, t: float) -> list[Process]:
        return self._workload.at(self.scenario, t)

    def _maybe_fail(self, call: str, index: int | None) -> None:
        self._faults.check(call, index, self.now(), self.scenario.faults)


def pci_bus_id(index: int) -> str:
    """The simulated GPU's PCI address, in nvmlPciInfo_t's `busId` form: one bus per GPU, 0x18
    apart from 0x18 on, as an 8-GPU HGX board's are spread over its switches; past ten GPUs, in
    the next PCI domain, so that no two GPUs share one."""
    return f"{index // 10:08X}:{0x18 * (index % 10 + 1):02X}:00.0"


def _mig_device(mig: MigSpec, processes: list[Process], context: int) -> MigDevice:
    return MigDevice(
        uuid=mig.uuid,
        profile=mig.profile,
        memory_total=mig.memory_total,
        memory_used=min(mig.memory_total, MIG_RESERVED_BYTES + sum(p.memory + context for p in processes)),
        gpu_instance_id=mig.gpu_instance_id,
        profile_id=mig.profile_id,
        placement_start=mig.placement_start,
    )
