"""The simulated GPU node: a GPU backend and a proc tree driven by a scenario.

Only NVML and the host are simulated. The node writes `<root>/<pid>/cgroup`
and `<root>/<pid>/stat` files shaped like a kubelet's (cgroup v1 and v2,
systemd and cgroupfs drivers, containerd, CRI-O and Docker), so the agent's
real proc reader, cgroup parser and attribution cache run on them.

The simulated processes live in the host's PID namespace. Like drivers from
535.113 on (the scenario's `driver.pid_namespace_filter`, on by default), the
node lists them only to an agent that shares that namespace: an agent in a
PID namespace of its own (`unshare --pid`, a container without `--pid=host`)
sees the devices busy and holding memory, and no process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import shutil
import tempfile
import threading
import time
import uuid as uuidlib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from otel_vgpu.allocation.hami import ANNOTATION as HAMI_ANNOTATION
from otel_vgpu.allocation.hami import parse_hami
from otel_vgpu.allocation.shares import Allocation, ClaimAssignment, DeviceAssignment, KubeletView, from_kubelet
from otel_vgpu.config import DEFAULT_RESOURCES, DRA_DRIVERS
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
from otel_vgpu.pods.directory import PodMeta, StaticDirectory
from otel_vgpu.sim.health import SimulatedHealth
from otel_vgpu.sim.scenario import PIPES, CgroupSpec, FaultSpec, GpuSpec, MigSpec, PodSpec, Scenario, pod_containers

# What a MIG device's own driver reservation is taken to be (a GPU's is its scenario's `reserved`).
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
_FIRST_PID = 4000
# The simulated node had been up this long when the scenario began: /proc/uptime, and the
# start times in /proc/<pid>/stat (clock ticks after boot), count from its boot.
UP_BEFORE_S = 10_000.0
# A pod that does not come and go started this long before the scenario began: its processes
# have samples from the first sweep on.
STARTED_BEFORE_S = 60.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# /proc/<pid>/stat fields 5-21 and 23-52, for the simulated processes.
_STAT_ZEROS = " ".join(["0"] * 17)
_STAT_TAIL = " ".join(["0"] * 30)
_CHURN_FIRST_PID = 100_000
# The PIDs of the processes of pods that restart them (`restarts`), under Linux's default
# pid_max (4,194,304 on 64-bit).
_RESTARTED_FIRST_PID = 1_000_000
_RESTARTED_PIDS = 3_000_000
# Churning pods whose processes are kept made, in live pods' worth (`_churn_processes`).
CHURNED_KEPT = 4
_CHURN_PIDS = 50_000
_V1_CONTROLLERS = ("cpu,cpuacct", "memory", "pids", "blkio", "devices", "freezer", "perf_event")
_RUNTIME_PREFIX = {"containerd": "cri-containerd", "crio": "crio", "docker": "docker"}


def container_id(pod: PodSpec, container: str) -> str:
    return _container_id(pod.namespace, pod.name, container)


@functools.lru_cache(maxsize=65536)
def _container_id(namespace: str, name: str, container: str) -> str:
    # Asked for every process each time the node works out who runs: a hash once per container.
    return hashlib.sha256(f"{namespace}/{name}/{container}".encode()).hexdigest()


def cgroup_path(spec: CgroupSpec, pod_uid: str, container: str) -> str:
    """The cgroup path a kubelet with this driver and runtime gives a container."""
    if spec.driver == "systemd":
        uid = pod_uid.replace("-", "_")
        if spec.qos == "guaranteed":
            parent = f"/kubepods.slice/kubepods-pod{uid}.slice"
        else:
            parent = f"/kubepods.slice/kubepods-{spec.qos}.slice/kubepods-{spec.qos}-pod{uid}.slice"
        return f"{parent}/{_RUNTIME_PREFIX[spec.runtime]}-{container}.scope"
    qos = "" if spec.qos == "guaranteed" else f"/{spec.qos}"
    leaf = f"crio-{container}" if spec.runtime == "crio" else container
    return f"/kubepods{qos}/pod{pod_uid}/{leaf}"


@functools.lru_cache(maxsize=65536)
def cgroup_file(spec: CgroupSpec, pod_uid: str, container: str, nested: str = "") -> str:
    """The whole `/proc/<pid>/cgroup` of a process in that container, or in a cgroup the
    container made below its own (`nested`, relative)."""
    path = cgroup_path(spec, pod_uid, container) + (f"/{nested}" if nested else "")
    if spec.version == 2:
        return f"0::{path}\n"
    lines = [f"{12 - i}:{controller}:{path}" for i, controller in enumerate(_V1_CONTROLLERS)]
    # Hierarchies a container is not placed in stay at the root, as on real nodes.
    lines += ["4:rdma:/", "3:hugetlb:/", "2:net_cls,net_prio:/"]
    lines.append(f"1:name=systemd:{path}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class _Process:
    pid: int
    start_time: int
    """Clock ticks after the node's boot, as /proc/<pid>/stat's field 22."""
    gpu: int
    memory: int
    sm: Callable[[float], float]
    cgroup: str
    mig: str | None = None
    command: str = "python3"
    engines: dict[str, Callable[[float], float]] = field(default_factory=dict)
    """Its use of each other engine over time, 0-1; absent: none."""
    mps: str = ""
    """server or client: its part in MPS, as the driver knows it."""
    starts_at: float = -math.inf
    """Scenario time it started: it has no sample from before."""
    ends_at: float = math.inf
    """Scenario time it ends: its last sample is from before, and NVML keeps it a while."""
    pipes: dict[str, Callable[[float], float]] = field(default_factory=dict)
    """What it keeps busy of the tensor cores and DRAM over time, 0-1 (GPM's figures)."""

    def wave(self, figure: str) -> Callable[[float], float]:
        """Its use of `figure` (SM, one of `ENGINES`, or of `PIPES`) over time."""
        if figure == "sm":
            return self.sm
        return self.engines.get(figure) or self.pipes.get(figure, _IDLE)


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
        # Named after the process that made it, so that one left behind names its owner.
        self.proc_root = proc_root or Path(
            tempfile.mkdtemp(prefix=f"{PROC_TREE_PREFIX}{os.getpid()}-", dir=_memory_backed_tmp())
        )
        self._clock = clock
        self._wall_clock_us = wall_clock_us
        self._started = clock()
        self._wall_started_us = wall_clock_us()
        self._lock = threading.Lock()
        self._written: dict[int, int] = {}  # pid -> start time on disk
        self._state_at: float | None = None
        self._listed_now: set[int] = set()
        self._probed_at = -math.inf
        self._probed: list[int] = []
        """When the memory in use was last probed: a listing after it is of a moment no older."""
        """The GPUs listed since the processes were last brought to the present."""
        self._processes: list[_Process] = []
        # Faults switched on by tests: the same FaultSpec as the scenario's own.
        self._faults: list[FaultSpec] = []
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
        self._alive_at: dict[int, list[_Process]] = {}
        """By sample period (its end, on the samples' clock): the processes that ran in it, from
        the scenario itself, whether or not any listing saw them."""
        self._alive_lock = threading.Lock()
        self._churned: dict[int, tuple[_Process, ...]] = {}
        """The churning pods' processes, by pod index, the newest pods' (`_churn_processes`)."""
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
        pods = {pod.uid: pod_meta(pod) for pod in self.scenario.pods if pod.in_directory}
        if self.scenario.churn is not None:
            for index in range(self.scenario.churn.pods):
                pod = self.churn_pod(index)
                pods[pod.uid] = PodMeta(pod.namespace, pod.name, containers={container_id(pod, "main"): "main"})
        return StaticDirectory(pods)

    def fail(self, call: str, index: int, code: ErrorCode | str | None) -> None:
        """Make `call` ('device', 'processes', 'utilization_samples') fail on
        GPU `index` with `code` from now on, or succeed again with None: a
        scenario fault switched on and off by a test."""
        self._faults = [f for f in self._faults if (f.call, f.gpu) != (call, index)]
        if code is not None:
            self._faults.append(FaultSpec(call=call, gpu=index, code=ErrorCode(code)))

    # --- AllocationSource ---------------------------------------------------

    def allocation(self, gpus: Sequence[Device]) -> Allocation:
        """What a kubelet with the NVIDIA device plugin (and DRA driver)
        would answer for the scenario now, counted by the agent's own rules."""
        # The time of the sweep's process listing, so shares and processes
        # describe the same moment.
        t = self._state_at if self._state_at is not None else self.now()
        return from_kubelet(self.kubelet_view(t), self._pods_at(t), gpus, DEFAULT_RESOURCES, DRA_DRIVERS)

    def kubelet_view(self, t: float) -> KubeletView:
        """pod-resources' List and GetAllocatableResources for the scenario at time `t`."""
        devices: list[DeviceAssignment] = []
        claims: list[ClaimAssignment] = []
        listed: list[tuple[str, str]] = []
        node = self.scenario.node_name or "sim-node"
        for pod in self.scenario.pods:
            if not pod.active(t):
                continue
            listed.append((pod.namespace, pod.name))
            container = pod_containers(pod.processes)[0]
            for index, count in pod.shares.items():
                gpu = self.scenario.gpus[index]
                # A scenario without replicas still gives each share its own replica ID.
                resource, ids = self._advertised(gpu, None, max(gpu.replicas or 1, count))
                devices.append(DeviceAssignment(pod.namespace, pod.name, container, resource, ids[:count]))
            for (index, position), count in pod.mig_shares.items():
                gpu = self.scenario.gpus[index]
                mig = gpu.migs[position]
                resource, ids = self._advertised(gpu, mig, max(mig.replicas, count))
                devices.append(DeviceAssignment(pod.namespace, pod.name, container, resource, ids[:count]))
            for claim in pod.claims:
                claims.append(
                    ClaimAssignment(
                        pod.namespace,
                        pod.name,
                        claim.container,
                        f"{pod.namespace}/{claim.claim}",
                        DRA_DRIVERS[0],
                        node,
                        claim.device,
                    )
                )
        for index in self.churn_pods(t):
            pod = self.churn_pod(index)
            gpu = self.scenario.gpus[index % len(self.scenario.gpus)]
            devices.append(DeviceAssignment(pod.namespace, pod.name, "main", "nvidia.com/gpu", (f"{gpu.uuid}::0",)))
            listed.append((pod.namespace, pod.name))
        return KubeletView(tuple(devices), tuple(claims), self._allocatable(), tuple(listed))

    def _allocatable(self) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
        gpus = self.scenario.gpus
        if all(gpu.replicas is None and not gpu.migs for gpu in gpus):
            return None
        found: dict[str, list[str]] = {}
        for gpu in gpus:
            advertised: list[tuple[str, tuple[str, ...]]] = []
            if gpu.migs:
                advertised += [self._advertised(gpu, mig, mig.replicas) for mig in gpu.migs]
            elif gpu.replicas is not None:
                advertised.append(self._advertised(gpu, None, gpu.replicas))
            for resource, ids in advertised:
                found.setdefault(resource, []).extend(ids)
        return tuple((resource, tuple(ids)) for resource, ids in found.items())

    def _advertised(self, gpu: GpuSpec, mig: MigSpec | None, replicas: int) -> tuple[str, tuple[str, ...]]:
        """The resource and device IDs the scenario's device plugin advertises
        for a GPU or one of its MIG devices: NVIDIA's (internal/rm/device_map.go,
        devices.go), GKE's (pkg/gpu/nvidia/manager.go, mig/mig.go) or HAMi's."""
        plugin = self.scenario.device_plugin
        if plugin.kind == "gke":
            base = f"nvidia{gpu.minor}" if mig is None else f"nvidia{gpu.minor}/gi{mig.gpu_instance_id}"
            ids = (base,) if replicas <= 1 else tuple(f"{base}/vgpu{k}" for k in range(replicas))
            return "nvidia.com/gpu", ids
        if plugin.kind == "hami":
            # pkg/device-plugin/nvidiadevice: every GPU as its UUID, a dash and a replica number.
            return "nvidia.com/gpu", tuple(f"{gpu.uuid}-{k}" for k in range(max(1, replicas)))
        if mig is None:
            return _replica_ids(gpu.uuid, replicas, "nvidia.com/gpu", plugin.rename_by_default)
        resource = _mig_resource(mig, plugin.mig_strategy)
        return _replica_ids(mig.uuid, replicas, resource, plugin.rename_by_default)

    def _pods_at(self, t: float) -> dict[str, PodMeta]:
        pods = {pod.uid: pod_meta(pod) for pod in self.scenario.pods if pod.in_directory and pod.active(t)}
        for index in self.churn_pods(t):
            pod = self.churn_pod(index)
            pods[pod.uid] = PodMeta(pod.namespace, pod.name)
        return pods

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

    def _running_at(self, t: float) -> list[_Process]:
        """The processes running at scenario time `t` (in the sample period that holds it),
        those ended since included, whether or not the agent ever listed them."""
        stamp = self._wall_started_us + round(t * 1e6)
        return self._alive(-(-stamp // SAMPLE_PERIOD_US) * SAMPLE_PERIOD_US)

    def _alive(self, stamp_us: int) -> list[_Process]:
        """The processes that ran in the sample period ending at `stamp_us`, as the scenario
        says: a process that lived between two listings still ran, and the GPU's own figures,
        its energy and its samples count it, as a real driver's do."""
        found = self._alive_at.get(stamp_us)
        if found is None:
            t = self._scenario_time(stamp_us)
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
            for process, use in zip(alive, uses(alive, self._scenario_time(stamp)), strict=True):
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
        """Each PID's latest sample, as NVML keeps it: the last period in which the process
        that held the PID then ran; on a driver that keeps them (`driver.ended_samples_s`),
        that of a process that has ended since, its PID maybe reused. Under MPS the server's
        sample is its clients' use and its own; the clients have none."""
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
        newest: dict[int, UtilizationSample] = {}
        for stamp in (latest - k * SAMPLE_PERIOD_US for k in range(SAMPLES_KEPT)):
            if stamp <= since_us:
                break
            alive = [p for p in self._alive(stamp) if p.gpu == index]
            if not alive:
                continue
            used = uses(alive, self._scenario_time(stamp))
            clients = _total([u for p, u in zip(alive, used, strict=True) if p.mps == "client"])
            for process, own in zip(alive, used, strict=True):
                # One sample per PID, its newest: an older one of the same PID is another
                # period's, or another holder's.
                if process.mps == "client" or process.pid in newest:
                    continue
                if not (process.starts_at <= now < process.ends_at or process.ends_at > kept_since):
                    continue
                use = _total([own, clients]) if process.mps == "server" else own
                if any(getattr(use, f) > 0 for f in USE_FIGURES):  # NVML keeps the last period it ran in
                    newest[process.pid] = UtilizationSample(process.pid, stamp, use)
        return list(newest.values())

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
            t = self._scenario_time(stamp_us)
            alive = self._alive(stamp_us)
            by_gpu = [[p for p in alive if p.gpu == gpu] for gpu in range(len(self.scenario.gpus))]
            figures = self._busy_at[stamp_us] = {
                each: tuple(min(1.0, sum(shares([p.wave(each) for p in mine], t))) for mine in by_gpu)
                for each in ("sm", *ENGINES, *PIPES)
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
            t = self._scenario_time(stamp)
            for process, use in zip(alive, uses(alive, t), strict=True):
                if pod_uid is None or underscored is None or pod_uid in process.cgroup or underscored in process.cgroup:
                    total += use.sm * SAMPLE_PERIOD_US / 1e6
            stamp += SAMPLE_PERIOD_US
        return total

    def _latest_period(self) -> int:
        """The end of the simulated driver's last complete sample period."""
        return self.now_us() // SAMPLE_PERIOD_US * SAMPLE_PERIOD_US

    def _scenario_time(self, stamp_us: int) -> float:
        return (stamp_us - self._wall_started_us) / 1e6

    def now_us(self) -> int:
        return self._wall_clock_us()

    def _visible(self) -> list[_Process]:
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
            self._sync_proc_tree()

    def start_ticks(self, t: float) -> int:
        """/proc/<pid>/stat's start time of a process started at scenario time `t`."""
        return max(1, round((UP_BEFORE_S + t) * CLOCK_TICKS))

    def _processes_at(self, t: float) -> list[_Process]:
        processes: list[_Process] = []
        pid = _FIRST_PID
        for pod in self.scenario.pods:
            for spec in pod.processes:
                pid += 1
                # A pod that has ended runs nothing, whatever the kubelet still lists.
                if not pod.running(t) or pod.phase in ("Succeeded", "Failed"):
                    continue
                cid = container_id(pod, spec.container)
                gpu = self.scenario.gpus[spec.gpu]
                # Pods that stay started before the scenario, each at its own moment, as on a node.
                started = pod.started(t) if pod.period_s is not None else -STARTED_BEFORE_S - _jitter(pod.uid)
                if spec.pid is not None:
                    own_pid = spec.pid
                elif pod.restarts:
                    # A restarted container's process is a new process to the kernel, which
                    # hands out the next free PID: fresh PIDs, cycle by cycle.
                    own_pid = _RESTARTED_FIRST_PID + (pod.cycle(t) * 1000 + pid - _FIRST_PID) % _RESTARTED_PIDS
                else:
                    own_pid = pid
                processes.append(
                    _Process(
                        pid=own_pid,
                        # A new cycle of a coming-and-going pod, or another pod,
                        # may reuse the PID; like a real one, its start time differs.
                        start_time=self.start_ticks(started),
                        gpu=spec.gpu,
                        memory=int(max(0.0, spec.memory.at(t))),
                        sm=_clamped(spec.sm.at),
                        cgroup=cgroup_file(pod.cgroup, pod.uid, cid, spec.nested),
                        mig=None if spec.mig is None else gpu.migs[spec.mig].uuid,
                        command=spec.command,
                        engines={engine: _clamped(wave.at) for engine, wave in spec.engines.items()},
                        mps=spec.mps,
                        starts_at=started,
                        ends_at=pod.ends(t),
                        pipes={pipe: _clamped(wave.at) for pipe, wave in spec.pipes.items()},
                    )
                )
        processes.extend(self._churn_at(t))
        for host in self.scenario.host_processes:
            pid += 1
            processes.append(
                _Process(
                    pid=pid,
                    start_time=10,
                    gpu=host.gpu,
                    memory=int(max(0.0, host.memory.at(t))),
                    sm=_clamped(host.sm.at),
                    cgroup=host.cgroup + "\n",
                    command=host.command,
                    engines={engine: _clamped(wave.at) for engine, wave in host.engines.items()},
                    mps=host.mps,
                    pipes={pipe: _clamped(wave.at) for pipe, wave in host.pipes.items()},
                )
            )
        return processes

    def churn_pods(self, t: float) -> range:
        """Indexes of the churning pods alive at scenario time `t`."""
        churn = self.scenario.churn
        if churn is None:
            return range(0)
        # One new pod every lifetime/live seconds; each lives lifetime_s.
        newest = int(t * churn.live / churn.lifetime_s)
        return range(max(0, newest - churn.live + 1), min(churn.pods, newest + 1))

    def churn_pod(self, index: int) -> PodSpec:
        return PodSpec(
            namespace=f"churn-{index % 10}",
            name=f"job-{index}",
            uid=f"{index:08x}-c0de-4000-8000-{index:012x}",
            cgroup=CgroupSpec(version=1 + index % 2, driver=("systemd", "cgroupfs")[index % 2]),
            processes=(),
        )

    def _churn_at(self, t: float) -> list[_Process]:
        churn = self.scenario.churn
        if churn is None:
            return []
        return [process for index in self.churn_pods(t) for process in self._churn_processes(index)]

    def _churn_processes(self, index: int) -> tuple[_Process, ...]:
        """Churning pod `index`'s processes, made once while the pod is among the newest: each
        period, listing and sample asks for the live pods' processes again."""
        made = self._churned.get(index)
        if made is not None:
            return made
        churn = self.scenario.churn
        assert churn is not None
        pod = self.churn_pod(index)
        cgroup = cgroup_file(pod.cgroup, pod.uid, container_id(pod, "main"))
        gpus = len(self.scenario.gpus)
        made = self._churned[index] = tuple(
            _Process(
                # PIDs wrap as on a real node, so reuse happens; the
                # start time tells the processes apart.
                pid=_CHURN_FIRST_PID + (index * churn.processes + k) % _CHURN_PIDS,
                start_time=self.start_ticks(index * churn.lifetime_s / churn.live) + k,
                gpu=(index + k) % gpus,
                memory=churn.memory,
                sm=_CHURN_SM,
                cgroup=cgroup,
            )
            for k in range(churn.processes)
        )
        while len(self._churned) > CHURNED_KEPT * churn.live:
            del self._churned[next(iter(self._churned))]
        return made

    def _sync_proc_tree(self) -> None:
        # os calls on strings: a churning soak writes thousands of these a second.
        root = str(self.proc_root)
        # /proc/uptime: seconds since boot (and idle time), as the kernel writes it.
        up = UP_BEFORE_S + (self.now_us() - self._wall_started_us) / 1e6
        with open(f"{root}/uptime.new", "w") as handle:
            handle.write(f"{up:.2f} 0.00\n")
        os.replace(f"{root}/uptime.new", f"{root}/uptime")
        wanted = {p.pid: p for p in self._processes}
        for pid in list(self._written):
            if pid not in wanted or wanted[pid].start_time != self._written[pid]:
                directory = f"{root}/{pid}"
                for name in ("cgroup", "stat"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{directory}/{name}")
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
                del self._written[pid]
        for pid, process in wanted.items():
            if pid in self._written:
                continue
            directory = f"{root}/{pid}"
            os.makedirs(directory, exist_ok=True)
            with open(f"{directory}/cgroup", "w") as handle:
                handle.write(process.cgroup)
            # Field 22 is the start time; the command name may hold spaces
            # and parentheses, as real ones can.
            with open(f"{directory}/stat", "w") as handle:
                handle.write(f"{pid} ({process.command}) S 1 {_STAT_ZEROS} {process.start_time} {_STAT_TAIL}\n")
            self._written[pid] = process.start_time

    def _maybe_fail(self, call: str, index: int | None) -> None:
        t = self.now()
        for fault in (*self._faults, *self.scenario.faults):
            if fault.active(call, index, t):
                if fault.delay_s > 0:
                    time.sleep(fault.delay_s)
                if fault.code is not None:
                    raise GpuError(fault.code, f"simulated {fault.code.value} (scenario fault)")


def mirror_uid(config_hash: str) -> str:
    """The UID the API gives a static pod's mirror: the kubelet creates the mirror as a copy
    of the static pod (pkg/kubelet/pod/mirror_client.go, CreateMirrorPod, annotations and
    kubernetes.io/config.hash kept), and the API server gives every pod it creates a UID of
    its own. Derived from the hash here, so that a simulated node is the same every run."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_OID, f"mirror/{config_hash}"))


def pod_meta(pod: PodSpec) -> PodMeta:
    """What the Kubernetes API would say of a simulated pod."""
    containers = pod_containers(pod.processes)
    hami = pod.annotations.get(HAMI_ANNOTATION)
    return PodMeta(
        pod.namespace,
        pod.name,
        containers={container_id(pod, name): name for name in containers},
        phase=pod.phase,
        uid=mirror_uid(pod.uid) if pod.static else pod.uid,
        # Checked when the scenario was loaded.
        stated=parse_hami(hami, (), containers) if hami else {},
    )


def _replica_ids(uuid: str, replicas: int, resource: str, rename: bool) -> tuple[str, tuple[str, ...]]:
    """The resource and IDs the device plugin advertises for one device (internal/rm/device_map.go)."""
    if replicas <= 1:
        return resource, (uuid,)
    return (f"{resource}.shared" if rename else resource), tuple(f"{uuid}::{k}" for k in range(replicas))


def _mig_resource(mig: MigSpec, strategy: str) -> str:
    return "nvidia.com/gpu" if strategy == "single" else f"nvidia.com/mig-{mig.profile}"


def pci_bus_id(index: int) -> str:
    """The simulated GPU's PCI address, in nvmlPciInfo_t's `busId` form: one bus per GPU, 0x18
    apart from 0x18 on, as an 8-GPU HGX board's are spread over its switches; past ten GPUs, in
    the next PCI domain, so that no two GPUs share one."""
    return f"{index // 10:08X}:{0x18 * (index % 10 + 1):02X}:00.0"


def _mig_device(mig: MigSpec, processes: list[_Process], context: int) -> MigDevice:
    return MigDevice(
        uuid=mig.uuid,
        profile=mig.profile,
        memory_total=mig.memory_total,
        memory_used=min(mig.memory_total, MIG_RESERVED_BYTES + sum(p.memory + context for p in processes)),
        gpu_instance_id=mig.gpu_instance_id,
        profile_id=mig.profile_id,
        placement_start=mig.placement_start,
    )


PROC_TREE_PREFIX = "otel-vgpu-proc-"


def _memory_backed_tmp() -> str | None:
    """A tmpfs for the proc tree where there is one, as /proc is in memory:
    on a disk-backed /tmp a churning scenario spends its time in mkdir."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _jitter(uid: str) -> float:
    """A pod's own moment in a thousand seconds, to the clock tick, the same every run."""
    return zlib.crc32(uid.encode()) % 100_000 / 100


def _constant(value: float) -> Callable[[float], float]:
    return lambda t: value


_IDLE = _constant(0.0)
_CHURN_SM = _constant(0.01)


def uses(processes: Sequence[_Process], t: float) -> list[ProcessUse]:
    """Each process's use of its GPU at `t`, each figure shared out by `shares`."""
    used = ("sm", *(e for e in ENGINES if any(e in p.engines for p in processes)))
    by_figure = {figure: shares([p.wave(figure) for p in processes], t) for figure in used}
    return [ProcessUse(**{figure: by_figure[figure][k] for figure in used}) for k in range(len(processes))]


def _total(uses: Sequence[ProcessUse]) -> ProcessUse:
    total = ProcessUse()
    for use in uses:
        total = total.plus(use)
    return total


def shares(waves: Sequence[Callable[[float], float]], t: float) -> list[float]:
    """The processes' use of one engine of a GPU (its SMs, or another) at `t`. A GPU has
    all of the engine to give and no more: where the scenario asks for more in all, each
    gets its part of the whole, as time-slicing would share it."""
    wanted = [wave(t) for wave in waves]
    total = sum(wanted)
    return wanted if total <= 1.0 else [v / total for v in wanted]


def _clamped(wave: Callable[[float], float]) -> Callable[[float], float]:
    def value(t: float) -> float:
        v = wave(t)
        return min(1.0, max(0.0, v)) if math.isfinite(v) else 0.0

    return value
