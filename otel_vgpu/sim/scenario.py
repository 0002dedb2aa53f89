"""What a scenario of the simulated GPU node says, once read: the node's GPUs, the pods on it
with their GPU processes, host processes that belong to no pod, faults, churn, the driver's and
the device plugin's ways (docs/scenario.md). Reading a file into it: sim/scenario_file.py."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from otel_vgpu.gpu.backend import ENGINE_TABLE, ENGINES, ErrorCode

BUILTIN = "builtin"
MAX_SCENARIO_BYTES = 1024 * 1024
# Delays above a minute are mistakes, not scenarios.
MAX_DELAY_S = 60.0
# NVML's sample buffers hold about 14 s (71 periods of 200 ms on an H200).
MAX_KEPT_S = 14.0
# The longest rhythm a simulated process keeps its kernels to (driver.rhythm_ms): a second.
MAX_RHYTHM_MS = 1000.0
# Churning processes alive at once (churn.live x churn.processes), at most: the soak runs 2,000;
# 10,000 held the agent at 177 MB (its DaemonSet's limit is 192 MiB), where live 1,000,000 of
# 100 processes each, accepted, grew it to 1.67 GB in 20 s without a word.
MAX_CHURN_PROCESSES = 10_000
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")
RUNTIMES = ("containerd", "crio", "docker")
DRIVERS = ("systemd", "cgroupfs")
# A process's part in MPS, as the simulated driver knows it: NVML lists clients apart
# (nvmlDeviceGetMPSComputeRunningProcesses) and gives their SM samples to their server.
MPS_ROLES = ("server", "client")
MPS_SERVER_COMMAND = "nvidia-cuda-mps-server"[:15]
COMPUTE_MODES = ("default", "exclusive_process")
# PIDs a scenario may give its processes itself (the simulator numbers the rest from 4001).
EXPLICIT_PIDS = range(2, 4000)
# What the driver and firmware reserve of a GPU's memory by default (nvmlMemory_v2_t's
# `reserved`): an H200's with driver 580.159.04, idle or loaded, 615.0625 MiB (0.601 GiB in
# bench/results/h200-pod-chart.md), which nvidia-smi shows as memory.reserved 616 MiB.
RESERVED_BYTES = 644_939_776
# What the driver keeps for each CUDA context beyond the memory NVML lists for its process, by
# default. On that H200 the used less the reservation less every listed process's memory was
# 8.8125 MiB with one PyTorch process and 14.375 MiB with two: this is the two's mean, 7.1875 MiB.
CONTEXT_BYTES = 7_536_640


class ScenarioError(ValueError):
    """A scenario that cannot be used. The message is one line for the user."""


@dataclass(frozen=True, slots=True)
class Wave:
    """A value that moves: mean + amplitude * sin(2 pi (t / period + phase)); with `on_s`, that
    value for the first `on_s` of each period (shifted by `phase`) and 0 for the rest, as a
    process that keeps its context between batches runs."""

    mean: float
    amplitude: float = 0.0
    period_s: float = 60.0
    phase: float = 0.0
    on_s: float | None = None

    def at(self, t: float) -> float:
        if self.on_s is not None and ((t / self.period_s + self.phase) % 1.0) * self.period_s >= self.on_s:
            return 0.0
        if self.amplitude == 0.0:
            return self.mean
        return self.mean + self.amplitude * math.sin(2 * math.pi * (t / self.period_s + self.phase))

    @property
    def highest(self) -> float:
        return self.mean + abs(self.amplitude)


@dataclass(frozen=True, slots=True)
class MigSpec:
    """A MIG device of a GPU (MIG mode)."""

    uuid: str
    profile: str
    memory_total: int
    gpu_instance_id: int
    profile_id: int
    placement_start: int
    replicas: int = 1


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    uuid: str
    model: str
    memory_total: int
    minor: int = 0
    """The device minor number (/dev/nvidia<minor>)."""
    replicas: int | None = None
    """Replicas the device plugin advertises for this GPU (GetAllocatableResources); None: it advertises none."""
    migs: tuple[MigSpec, ...] = ()
    engines: frozenset[str] = frozenset(ENGINES)
    """The engines beside SM it has: all but those its `lacks` names (an H200 has no encoder)."""
    compute_mode: str = "default"
    """default, or exclusive_process: one context at a time (under MPS, the server's), as the
    NVIDIA device plugin's MPS daemon sets it."""
    gpm: bool = True
    """It has GPM (Hopper and newer): by default, as its model says."""
    nvlink: bool = False
    ecc: bool = True
    power_limit_w: float = 700.0
    unsupported: frozenset[str] = frozenset()
    """Health figures (gpu/device_figures.py) its driver does not report."""
    accounting: bool = False
    """NVML's accounting mode is on (an administrator's `nvidia-smi -am 1`)."""
    reserved: int = RESERVED_BYTES
    """Bytes the driver and firmware keep of its memory: in its used (NVML's v1 figure) from the
    start, and its v2 `reserved`."""


@dataclass(frozen=True, slots=True)
class CgroupSpec:
    version: int = 2
    driver: str = "systemd"
    runtime: str = "containerd"
    qos: str = "burstable"


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    gpu: int
    memory: Wave
    """Bytes."""
    sm: Wave
    """0-1."""
    container: str = "main"
    mig: int | None = None
    """The MIG device of the GPU it runs on, by position in the GPU's `mig` list."""
    command: str = "python3"
    """The command name /proc/<pid>/stat shows: any name, which is the process's to choose."""
    engines: dict[str, Wave] = field(default_factory=dict)
    """What it uses of the GPU's other engines, 0-1 each, by engine (`ENGINES`); absent: none."""
    mps: str = ""
    """server or client: its part in MPS as the driver knows it; empty: none."""
    pid: int | None = None
    """Its PID, where the scenario gives one (two pods' processes may share one if they never run at once)."""
    nested: str = ""
    """A cgroup path its container made below its own and moved it into (a pod running
    systemd, rootless podman, Docker-in-Docker): named as the tenant likes."""
    pipes: dict[str, Wave] = field(default_factory=dict)
    """What it keeps busy of what GPM measures beside SM (`PIPES`: tensor cores, DRAM), 0-1."""
    dodges_ticks: bool = False
    """Whether it times its kernels to miss the driver's ticks, as any process that can read
    the GPU's sample stamps from NVML can: never on the GPU when a period's sample is given
    (docs/nvml-sampling.md, the recorder's `tick-dodging`)."""


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    """A DRA claim's device a pod's container uses (the NVIDIA DRA driver's name)."""

    device: str
    claim: str
    container: str = "main"


@dataclass(frozen=True, slots=True)
class BindRequestSpec:
    """The BindRequest KAI Scheduler's scheduler wrote for a pod, as its binder left it
    (allocation/kai.py): the API double serves it, the simulated node reads it."""

    type: str = "Fraction"
    """Fraction: a portion of each GPU of its groups; Regular: whole GPUs, which the kubelet gives."""
    portion: str = "1.00"
    """spec.receivedGPU.portion, as KAI writes it (two decimals)."""
    groups: tuple[str, ...] = ()
    phase: str = "Succeeded"
    node: str | None = None
    """spec.selectedNode; None: the scenario's node."""


@dataclass(frozen=True, slots=True)
class PodSpec:
    namespace: str
    name: str
    uid: str
    cgroup: CgroupSpec
    processes: tuple[ProcessSpec, ...]
    shares: dict[int, int] = field(default_factory=dict)
    """GPU index -> vGPU shares."""
    mig_shares: dict[tuple[int, int], int] = field(default_factory=dict)
    """(GPU index, MIG device position) -> shares of that MIG device."""
    phase: str = "Running"
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    service_account: str = "default"
    bind_request: BindRequestSpec | None = None
    """What KAI Scheduler's scheduler wrote for it; None: no BindRequest."""
    claims: tuple[ClaimSpec, ...] = ()
    static: bool = False
    in_directory: bool = True
    period_s: float | None = None
    active_s: float | None = None
    offset_s: float = 0.0
    """With period_s: each period starts this far into the scenario's."""
    restarts: bool = False
    """With period_s: only its processes come and go, fresh ones each period; the pod stays
    (in the API, with its shares)."""

    def active(self, t: float) -> bool:
        """Whether the pod exists at `t`."""
        return self.restarts or self.running(t)

    def running(self, t: float) -> bool:
        """Whether its processes run at `t`."""
        if self.period_s is None or self.active_s is None:
            return True
        return ((t - self.offset_s) % self.period_s) < self.active_s

    def cycle(self, t: float) -> int:
        return 0 if self.period_s is None else int((t - self.offset_s) // self.period_s)

    def started(self, t: float) -> float:
        """When the cycle that holds `t` began, in scenario time (0 for a pod that stays)."""
        if self.period_s is None:
            return 0.0
        return max(0.0, self.offset_s + self.cycle(t) * self.period_s)

    def ends(self, t: float) -> float:
        """When the cycle that holds `t` ends; infinite for a pod that stays."""
        if self.period_s is None or self.active_s is None:
            return math.inf
        return self.offset_s + self.cycle(t) * self.period_s + self.active_s


@dataclass(frozen=True, slots=True)
class HostProcessSpec:
    gpu: int
    memory: Wave
    sm: Wave
    cgroup: str
    command: str = "python3"
    engines: dict[str, Wave] = field(default_factory=dict)
    mps: str = ""
    """server or client, as for a pod's process: a host's MPS daemon runs outside every pod."""
    pipes: dict[str, Wave] = field(default_factory=dict)


# What a process may keep busy beside SM and the engines, which GPM measures per GPU.
PIPES = ("tensor", "dram")
# The models with GPM, by a word of their name (nvml.h: Hopper and newer).
GPM_MODELS = ("H100", "H200", "H800", "H20", "GH200", "B100", "B200", "GB200", "B300", "GB300")
# The video engines each model has none of, by a word of its name: NVIDIA's compute GPUs carry no
# encoder (NVIDIA's Video Encode and Decode GPU Support Matrix: A100, A30, H100; the H200's
# GPU-instance profiles hold 0 encoders: bench/results/h200-engine-figures.md). A device figure
# of such an engine (gpu/device_figures.py `HealthFigure.engine`) is left out on the model, as on
# a real one, whatever the scenario's `lacks` says: `lacks` keeps the meaning docs/scenario.md
# gives it, the engines whose families the scenario's GPU publishes.
MODELS_WITHOUT = {"encoder": ("A100", "A30", "H100", "H800", "H200")}


def of_models(model: str, words: Sequence[str]) -> bool:
    """Whether the model named `model` is one of those `words` name: a word of its name, or one
    before a dash (NVIDIA A100-SXM4-80GB)."""
    return any(word in model.split() or f"{word}-" in model for word in words)


# Clock event reasons a scenario can put a GPU under, with NVML's bit of each (nvml.h).
THROTTLE_REASONS = {
    "power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "power_brake": 0x80,
}
HEALTH_EVENTS = ("xid", "ecc", "pcie_replays", "remap", "throttle")
ECC_KINDS = ("corrected", "uncorrected")
REMAP_KINDS = ("correctable", "uncorrectable", "pending", "failure")


@dataclass(frozen=True, slots=True)
class HealthEventSpec:
    """Something that happens to a GPU's health at `at_s` (to `to_s`, for throttling): an XID
    error (`code`, `count` times: a storm), ECC errors, PCIe replays, remapped rows, or its
    clocks held down for `reasons` (NVML's bitmask)."""

    gpu: int
    kind: str
    at_s: float
    to_s: float = math.inf
    code: int = 0
    what: str = ""
    """ECC: corrected or uncorrected; remap: correctable, uncorrectable, pending or failure."""
    count: int = 1
    reasons: int = 0


# The engines a GPU may lack (every GPU has memory).
VIDEO_ENGINES = tuple(engine.name for engine in ENGINE_TABLE if engine.profile_field is not None)
FAULT_CALLS = ("device_count", "device", "processes", "utilization_samples", "health", "gpm", "xid_events", "all")
"""`all`: every call about a GPU (all but device_count), as a GPU fallen off the bus answers them."""
# The ratio of a scenario that states none, and of the built-in node.
DEFAULT_RATIO = 2.0


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """An NVML call that fails (with `code`) or is slow (by `delay_s`), on one
    GPU or all, between `from_s` and `to_s` of scenario time."""

    call: str
    gpu: int | None = None
    code: ErrorCode | None = None
    delay_s: float = 0.0
    from_s: float = 0.0
    to_s: float = math.inf

    def active(self, call: str, gpu: int | None, t: float) -> bool:
        named = call == self.call or (self.call == "all" and call != "device_count")
        return named and (self.gpu is None or self.gpu == gpu) and self.from_s <= t < self.to_s


@dataclass(frozen=True, slots=True)
class ChurnSpec:
    """Pods that come and go: `pods` in all, `live` at a time, each living
    `lifetime_s`, with `processes` processes of `memory` each, spread over the
    GPUs. Generated as they are needed, so a long soak stays cheap."""

    pods: int
    live: int
    lifetime_s: float
    processes: int = 1
    memory: int = 1024**3


DRIVER_VERSION = "580.159.04"


@dataclass(frozen=True, slots=True)
class DriverSpec:
    """What the simulated driver does that the agent must cope with."""

    pid_namespace_filter: bool = True
    """True (drivers from 535.113): NVML lists only the processes that have a
    PID in the caller's PID namespace, so an agent outside the host's sees
    none. False: older drivers, which list every process by host PID."""
    ended_samples_s: float = 0.0
    """How long NVML keeps an ended process's last sample, under its PID (which a new
    process may hold by then). 0: none, as an H200 with driver 580 does
    (bench/results/h200-nvml-ended-samples.md)."""
    one_sample_a_period: bool = True
    """The recorded driver's cadence: about one new per-process sample a period on a GPU, drawn
    among the processes that ran in it by their use (sim/node.py `stamped_in`), the default: the
    simulated node is the driver's double. False: every process that ran in a period has a new
    sample for it, as the simulated driver gave in 0.2.0 (docs/nvml-sampling.md says where the
    two part)."""
    draw_seed: int = 0
    """Which draws pick each period's sample at the recorded cadence (`one_sample_a_period`):
    the same for a GPU and period every time it is asked, and another for each seed, so that an
    evaluation over seeds meets other draws (bench/bill_evaluation.py)."""
    rhythm_ms: float = 0.0
    """0: each period's sample is drawn by use, as if the processes' kernels kept no rhythm.
    Above 0: each process runs its use as kernels at the start of every `rhythm_ms`, at a
    phase of its own, and the period's sample goes to the one on the GPU at the tick (where none
    is, the last one that was), credited with the GPU's whole period, as the recordings show the
    driver does (docs/nvml-sampling.md); at 100 or 200 one process may take every sample for as
    long as the uses hold."""
    memory_info_v2: bool = True
    """It has nvmlDeviceGetMemoryInfo_v2 (drivers from R510), which gives each GPU's reserved
    memory apart; False: an older driver, whose used holds the reservation all the same."""
    context_memory: int = CONTEXT_BYTES
    """Bytes each process's CUDA context holds on its GPU (or MIG device) beyond the memory its
    listing gives it: in the device's used, in no process's usedGpuMemory."""
    version: str = DRIVER_VERSION
    """What nvmlSystemGetDriverVersion answers: the driver the H200 figures were read on."""


MIG_STRATEGIES = ("single", "mixed")
DEVICE_PLUGINS = ("nvidia", "gke", "hami")
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
BIND_REQUEST_TYPES = ("Fraction", "Regular")
BIND_REQUEST_PHASES = ("Pending", "Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class DevicePluginSpec:
    """How the simulated NVIDIA device plugin names its resources."""

    kind: str = "nvidia"
    """nvidia: NVIDIA's device plugin (`GPU-<uuid>::<n>`); gke: GKE's (`nvidia<minor>/vgpu<n>`); hami:
    HAMi's (`GPU-<uuid>-<n>`)."""
    rename_by_default: bool = False
    """Shared replicas are advertised as `<resource>.shared`."""
    mig_strategy: str = "single"
    """single: MIG devices as nvidia.com/gpu; mixed: as nvidia.com/mig-<profile>."""


@dataclass(frozen=True, slots=True)
class Scenario:
    gpus: tuple[GpuSpec, ...]
    pods: tuple[PodSpec, ...]
    host_processes: tuple[HostProcessSpec, ...] = ()
    node_name: str | None = None
    faults: tuple[FaultSpec, ...] = ()
    churn: ChurnSpec | None = None
    driver: DriverSpec = DriverSpec()
    device_plugin: DevicePluginSpec = DevicePluginSpec()
    health_events: tuple[HealthEventSpec, ...] = ()
    ratio: float = DEFAULT_RATIO
    """The vGPUs per GPU the node is set up for: the ratio `--simulate` uses when no ratio file is there."""


def sm_asked(scenario: Scenario) -> dict[int, float]:
    """The most SM each GPU's processes ask for together, GPU by GPU (MIG devices have no SM figure)."""
    asked: dict[int, float] = {}
    waves = [(p.gpu, p.sm) for pod in scenario.pods for p in pod.processes if p.mig is None]
    waves += [(h.gpu, h.sm) for h in scenario.host_processes]
    for gpu, sm in waves:
        asked[gpu] = asked.get(gpu, 0.0) + max(0.0, min(1.0, sm.highest))
    return asked


def pod_containers(processes: tuple[ProcessSpec, ...]) -> tuple[str, ...]:
    """A simulated pod's containers, in order: those its processes name, else `main`."""
    return tuple(dict.fromkeys(p.container for p in processes)) or ("main",)
