"""Scenario files for the simulated GPU node: format, loading, validation.

A scenario describes a node: its GPUs, the pods on it with their GPU
processes, and host processes that belong to no pod. YAML or JSON; see
docs/scenario.md for the format. Every error names the file, the line, the
field, the value and what would be valid.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import uuid as uuidlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from otel_vgpu.allocation.hami import ANNOTATION as HAMI_ANNOTATION
from otel_vgpu.allocation.hami import HamiAnnotationError, parse_hami
from otel_vgpu.allocation.ratio import MAX_RATIO
from otel_vgpu.files import FileProblem, read_regular
from otel_vgpu.gpu.backend import ENGINE_TABLE, ENGINES, ErrorCode

BUILTIN = "builtin"
MAX_SCENARIO_BYTES = 1024 * 1024
MAX_SCENARIO_NODES = 1_000_000
# Sizes above a pebibyte and delays above a minute are mistakes, not scenarios.
MAX_SIZE_BYTES = 2**50
MAX_DELAY_S = 60.0
# NVML's sample buffers hold about 14 s (71 periods of 200 ms on an H200).
MAX_KEPT_S = 14.0
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
_SIZE = re.compile(r"^\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[KMGT]i?B?|B)?\s*$")
_UNITS = {"": 1, "B": 1}
for _i, _prefix in enumerate("KMGT", start=1):
    _UNITS[f"{_prefix}i"] = _UNITS[f"{_prefix}iB"] = 1024**_i
    _UNITS[_prefix] = _UNITS[f"{_prefix}B"] = 1000**_i


class ScenarioError(ValueError):
    """A scenario that cannot be used. The message is one line for the user."""


@dataclass(frozen=True, slots=True)
class Wave:
    """A value that moves: mean + amplitude * sin(2 pi (t / period + phase))."""

    mean: float
    amplitude: float = 0.0
    period_s: float = 60.0
    phase: float = 0.0

    def at(self, t: float) -> float:
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


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    """A DRA claim's device a pod's container uses (the NVIDIA DRA driver's name)."""

    device: str
    claim: str
    container: str = "main"


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
    claims: tuple[ClaimSpec, ...] = ()
    static: bool = False
    in_directory: bool = True
    period_s: float | None = None
    active_s: float | None = None
    offset_s: float = 0.0
    """With period_s: each period starts this far into the scenario's."""

    def active(self, t: float) -> bool:
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


# The engines a GPU may lack (every GPU has memory).
VIDEO_ENGINES = tuple(engine.name for engine in ENGINE_TABLE if engine.profile_field is not None)
FAULT_CALLS = ("device_count", "device", "processes", "utilization_samples")
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
        return call == self.call and (self.gpu is None or self.gpu == gpu) and self.from_s <= t < self.to_s


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


MIG_STRATEGIES = ("single", "mixed")
DEVICE_PLUGINS = ("nvidia", "gke", "hami")
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


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


def load_scenario(source: str) -> Scenario:
    """The built-in scenario (`builtin`) or the one in a file."""
    if source == BUILTIN:
        text = resources.files("otel_vgpu.sim").joinpath("scenarios/builtin.yaml").read_text()
        return parse_scenario(text, "builtin scenario")
    path = Path(source)
    try:
        text = read_regular(path, MAX_SCENARIO_BYTES).decode("utf-8")
    except FileProblem as problem:
        if problem.what == "no such file":
            raise ScenarioError(f"{path}: no such scenario file") from None
        if problem.what.startswith("is larger"):
            raise ScenarioError(
                f"{path}: larger than {MAX_SCENARIO_BYTES} bytes; a scenario is a few kilobytes"
            ) from None
        raise ScenarioError(str(problem)) from None
    except UnicodeDecodeError as error:
        raise ScenarioError(f"{path}: cannot be read ({error})") from None
    return parse_scenario(text, str(path))


def parse_scenario(text: str, source: str) -> Scenario:
    loader = _LineLoader(text)
    try:
        node = loader.get_single_node()
        # Anchors and aliases are fine (yaml.dump writes them for shared
        # objects), but not a "billion laughs": a few hundred bytes whose
        # aliases expand to more than any scenario holds.
        if node is not None and _expanded_size(node, {}) > MAX_SCENARIO_NODES:
            raise ScenarioError(f"{source}: expands to over {MAX_SCENARIO_NODES} values through its aliases")
        document = loader.construct_document(node) if node is not None else None
    except RecursionError:
        raise ScenarioError(f"{source}: nested too deep to be a scenario") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ScenarioError(f"{source}{where}: not valid YAML or JSON ({problem})") from None
    finally:
        loader.dispose()
    return _Reader(source).scenario(document)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many values a node stands for once its aliases are expanded (capped just past the bound)."""
    seen = memo.get(id(node))
    if seen is not None:
        return seen
    size = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            size += _expanded_size(child, memo)
            if size > MAX_SCENARIO_NODES:
                break
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            size += _expanded_size(key, memo) + _expanded_size(value, memo)
            if size > MAX_SCENARIO_NODES:
                break
    memo[id(node)] = size = min(size, MAX_SCENARIO_NODES + 1)
    return size


def _overlap(first: PodSpec, second: PodSpec) -> bool:
    """Whether two pods can be active at one moment: only pods of one period whose windows
    (offset, offset + active) do not meet on its circle never are."""
    if first.period_s is None or second.period_s is None or first.period_s != second.period_s:
        return True
    period = first.period_s
    assert first.active_s is not None and second.active_s is not None
    gap = (second.offset_s - first.offset_s) % period
    return gap < first.active_s or period - gap < second.active_s


class _LineDict(dict[Any, Any]):
    """A mapping that remembers the line of each key (and its own)."""

    line: int = 0
    key_lines: dict[str, int]


class _LineLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key, _ in node.value:
            if key.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key.value!r} appears twice (first on line {seen[key.value]})", key.start_mark
                )
            seen[key.value] = key.start_mark.line + 1
        mapping = _LineDict(super().construct_mapping(node, deep=True))
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {str(key.value): key.start_mark.line + 1 for key, _ in node.value}
        return mapping


_LineLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _LineLoader.construct_mapping,
)


class _Reader:
    """Validates a loaded document into a Scenario, with located errors."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, line: int, message: str) -> ScenarioError:
        location = f"{self.source}:{line}" if line else self.source
        return ScenarioError(f"{location}: {where}: {message}")

    def mapping(self, value: Any, where: str, line: int, allowed: set[str]) -> _LineDict:
        if not isinstance(value, dict):
            raise self.fail(where, line, f"{value!r} is not a mapping")
        mapping = value if isinstance(value, _LineDict) else _LineDict(value)
        if not hasattr(mapping, "key_lines"):
            mapping.key_lines = {}
        for key in mapping:
            if key not in allowed:
                raise self.fail(
                    where, _line(mapping, key), f"unknown field {key!r}; valid: {', '.join(sorted(allowed))}"
                )
        return mapping

    def sequence(self, value: Any, where: str, line: int) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(where, line, f"{value!r} is not a list")
        return value

    def scenario(self, document: Any) -> Scenario:
        top = self.mapping(
            document,
            "scenario",
            1,
            {"node", "gpus", "pods", "host_processes", "faults", "churn", "driver", "device_plugin", "ratio"},
        )
        gpus_raw = self.sequence(top.get("gpus"), "gpus", _line(top, "gpus"))
        if not gpus_raw:
            raise self.fail("gpus", _line(top, "gpus"), "the node needs at least one GPU")
        gpus = tuple(self.gpu(raw, index) for index, raw in enumerate(gpus_raw))
        uuids = [gpu.uuid for gpu in gpus]
        if len(set(uuids)) != len(uuids):
            raise self.fail("gpus", _line(top, "gpus"), "two GPUs have the same uuid")
        pods_raw = self.sequence(top.get("pods"), "pods", _line(top, "pods"))
        pods = tuple(self.pod(raw, f"pods[{i}]", gpus) for i, raw in enumerate(pods_raw))
        seen: dict[tuple[str, str], int] = {}
        for i, pod in enumerate(pods):
            if (pod.namespace, pod.name) in seen:
                raise self.fail(
                    f"pods[{i}]",
                    _item_line(pods_raw[i]),
                    f"{pod.namespace}/{pod.name} is also pods[{seen[(pod.namespace, pod.name)]}]",
                )
            seen[(pod.namespace, pod.name)] = i
        uids: dict[str, int] = {}
        for i, pod in enumerate(pods):
            if pod.uid in uids:
                raise self.fail(
                    f"pods[{i}].uid", _line(pods_raw[i], "uid"), f"{pod.uid!r} is also pods[{uids[pod.uid]}]'s"
                )
            uids[pod.uid] = i
        hosts = tuple(
            self.host_process(raw, f"host_processes[{i}]", gpus)
            for i, raw in enumerate(
                self.sequence(top.get("host_processes"), "host_processes", _line(top, "host_processes"))
            )
        )
        node = top.get("node")
        faults = tuple(
            self.fault(raw, f"faults[{i}]", len(gpus))
            for i, raw in enumerate(self.sequence(top.get("faults"), "faults", _line(top, "faults")))
        )
        churn = None if top.get("churn") is None else self.churn(top["churn"], "churn", _line(top, "churn"))
        driver = DriverSpec() if top.get("driver") is None else self.driver(top["driver"], _line(top, "driver"))
        plugin = (
            DevicePluginSpec()
            if top.get("device_plugin") is None
            else self.device_plugin(top["device_plugin"], _line(top, "device_plugin"))
        )
        self.check_memory(gpus, pods, hosts, gpus_raw)
        self.check_mps(gpus, pods, hosts, gpus_raw)
        self.check_pids(pods, pods_raw)
        ratio = self.number(top.get("ratio", DEFAULT_RATIO), "ratio", _line(top, "ratio"))
        if not 1 <= ratio <= MAX_RATIO:
            raise self.fail("ratio", _line(top, "ratio"), f"{ratio:g} is not a ratio; valid: 1 to {MAX_RATIO}")
        return Scenario(
            gpus=gpus,
            pods=pods,
            host_processes=hosts,
            node_name=None if node is None else str(node),
            faults=faults,
            churn=churn,
            driver=driver,
            device_plugin=plugin,
            ratio=ratio,
        )

    def check_memory(
        self,
        gpus: tuple[GpuSpec, ...],
        pods: tuple[PodSpec, ...],
        hosts: tuple[HostProcessSpec, ...],
        gpus_raw: list[Any],
    ) -> None:
        """A GPU (or MIG device) holds no more than its memory: processes that could ask for more are refused."""
        asked: dict[tuple[int, int | None], float] = {}
        for pod in pods:
            for process in pod.processes:
                key = (process.gpu, process.mig)
                asked[key] = asked.get(key, 0.0) + max(0.0, process.memory.highest)
        for host in hosts:
            asked[(host.gpu, None)] = asked.get((host.gpu, None), 0.0) + max(0.0, host.memory.highest)
        for (index, mig), total in sorted(asked.items(), key=lambda item: (item[0][0], item[0][1] or -1)):
            gpu = gpus[index]
            capacity = gpu.memory_total if mig is None else gpu.migs[mig].memory_total
            if total > capacity:
                device = f"GPU {index}" if mig is None else f"GPU {index}'s MIG device {mig}"
                raise self.fail(
                    f"gpus[{index}]",
                    _item_line(gpus_raw[index]),
                    f"the processes on {device} can use up to {_gib(total)} together; it has {_gib(capacity)} "
                    "(lower their memory, or move some to another GPU)",
                )

    def check_mps(
        self,
        gpus: tuple[GpuSpec, ...],
        pods: tuple[PodSpec, ...],
        hosts: tuple[HostProcessSpec, ...],
        gpus_raw: list[Any],
    ) -> None:
        """As a driver allows: an MPS client has a server on its GPU, and a GPU in
        exclusive_process mode runs one process beside the clients (the server's context)."""
        roles: dict[int, list[str]] = {}
        for gpu, role in [(p.gpu, p.mps) for pod in pods for p in pod.processes] + [(h.gpu, h.mps) for h in hosts]:
            roles.setdefault(gpu, []).append(role)
        for index, found in sorted(roles.items()):
            line = _item_line(gpus_raw[index])
            if "client" in found and "server" not in found:
                raise self.fail(f"gpus[{index}]", line, "an MPS client runs on it and no MPS server (mps: server)")
            others = sum(1 for role in found if role != "client")
            if gpus[index].compute_mode == "exclusive_process" and others > 1:
                raise self.fail(
                    f"gpus[{index}]",
                    line,
                    f"exclusive_process allows one process beside MPS clients (the server); {others} are on it",
                )

    def check_pids(self, pods: tuple[PodSpec, ...], pods_raw: list[Any]) -> None:
        """Two processes given one PID belong to pods that never run at once."""
        holders: dict[int, list[tuple[int, PodSpec]]] = {}
        for i, pod in enumerate(pods):
            for process in pod.processes:
                if process.pid is not None:
                    holders.setdefault(process.pid, []).append((i, pod))
        for pid, sharing in holders.items():
            for (i, first), (j, second) in itertools.combinations(sharing, 2):
                if i == j or _overlap(first, second):
                    raise self.fail(
                        f"pods[{j}]",
                        _item_line(pods_raw[j]),
                        f"PID {pid} is also pods[{i}]'s, and the two can run at once "
                        "(give both one period_s and active windows that do not meet)",
                    )

    def device_plugin(self, raw: Any, line: int) -> DevicePluginSpec:
        spec = self.mapping(raw, "device_plugin", line, {"kind", "rename_by_default", "mig_strategy"})
        kind = spec.get("kind", "nvidia")
        if kind not in DEVICE_PLUGINS:
            raise self.fail("device_plugin.kind", _line(spec, "kind"), f"{kind!r}; valid: {', '.join(DEVICE_PLUGINS)}")
        strategy = spec.get("mig_strategy", "single")
        if strategy not in MIG_STRATEGIES:
            raise self.fail(
                "device_plugin.mig_strategy",
                _line(spec, "mig_strategy"),
                f"{strategy!r}; valid: {', '.join(MIG_STRATEGIES)}",
            )
        rename = self.boolean(
            spec.get("rename_by_default", False), "device_plugin.rename_by_default", _line(spec, "rename_by_default")
        )
        return DevicePluginSpec(kind=kind, rename_by_default=rename, mig_strategy=strategy)

    def driver(self, raw: Any, line: int) -> DriverSpec:
        spec = self.mapping(raw, "driver", line, {"pid_namespace_filter", "ended_samples_s"})
        key = "pid_namespace_filter"
        kept = self.number(spec.get("ended_samples_s", 0), "driver.ended_samples_s", _line(spec, "ended_samples_s"))
        if not 0 <= kept <= MAX_KEPT_S:
            raise self.fail(
                "driver.ended_samples_s", _line(spec, "ended_samples_s"), f"{kept} must be from 0 to {MAX_KEPT_S:g}"
            )
        return DriverSpec(
            pid_namespace_filter=self.boolean(spec.get(key, True), f"driver.{key}", _line(spec, key)),
            ended_samples_s=kept,
        )

    def fault(self, raw: Any, where: str, gpu_count: int) -> FaultSpec:
        spec = self.mapping(raw, where, 0, {"call", "gpu", "code", "delay_s", "from_s", "to_s"})
        call = spec.get("call")
        if call not in FAULT_CALLS:
            raise self.fail(f"{where}.call", _line(spec, "call"), f"{call!r}; valid: {', '.join(FAULT_CALLS)}")
        gpu = None if spec.get("gpu") is None else self.gpu_index(spec, where, gpu_count)
        code = spec.get("code")
        if code is not None and code not in ErrorCode.__members__:
            raise self.fail(
                f"{where}.code", _line(spec, "code"), f"{code!r} is not an NVML error; valid: {', '.join(ErrorCode)}"
            )
        delay = self.number(spec.get("delay_s", 0), f"{where}.delay_s", _line(spec, "delay_s"))
        if not 0 <= delay <= MAX_DELAY_S:
            raise self.fail(f"{where}.delay_s", _line(spec, "delay_s"), f"{delay} must be from 0 to {MAX_DELAY_S:g} s")
        if code is None and delay <= 0:
            raise self.fail(where, spec.line, "a fault needs a code (e.g. GPU_IS_LOST) or a delay_s above 0")
        return FaultSpec(
            call=call,
            gpu=gpu,
            code=None if code is None else ErrorCode[code],
            delay_s=delay,
            from_s=self.number(spec.get("from_s", 0), f"{where}.from_s", _line(spec, "from_s")),
            to_s=self.number(spec.get("to_s", math.inf), f"{where}.to_s", _line(spec, "to_s"))
            if spec.get("to_s") is not None
            else math.inf,
        )

    def churn(self, raw: Any, where: str, line: int) -> ChurnSpec:
        spec = self.mapping(raw, where, line, {"pods", "live", "lifetime_s", "processes", "memory"})
        counts = {}
        for key, default in (("pods", None), ("live", None), ("processes", 1)):
            value = spec.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise self.fail(f"{where}.{key}", _line(spec, key), f"{value!r} is not a whole number >= 1")
            counts[key] = value
        lifetime = self.number(spec.get("lifetime_s"), f"{where}.lifetime_s", _line(spec, "lifetime_s"))
        if lifetime <= 0:
            raise self.fail(f"{where}.lifetime_s", _line(spec, "lifetime_s"), f"{lifetime} must be above 0")
        memory = self.size(spec.get("memory", "1GiB"), f"{where}.memory", _line(spec, "memory"))
        return ChurnSpec(
            pods=counts["pods"], live=counts["live"], lifetime_s=lifetime, processes=counts["processes"], memory=memory
        )

    def gpu(self, raw: Any, index: int) -> GpuSpec:
        where = f"gpus[{index}]"
        gpu = self.mapping(
            raw, where, 0, {"model", "memory", "uuid", "minor", "replicas", "mig", "lacks", "compute_mode"}
        )
        mode = gpu.get("compute_mode", "default")
        if mode not in COMPUTE_MODES:
            raise self.fail(
                f"{where}.compute_mode", _line(gpu, "compute_mode"), f"{mode!r}; valid: {', '.join(COMPUTE_MODES)}"
            )
        model = str(gpu.get("model", "NVIDIA H100 80GB HBM3"))
        memory = self.size(gpu.get("memory", "80GiB"), f"{where}.memory", _line(gpu, "memory"))
        if memory <= 0:
            raise self.fail(f"{where}.memory", _line(gpu, "memory"), "must be above 0")
        default_uuid = "GPU-" + str(uuidlib.UUID(hashlib.md5(f"gpu{index}".encode()).hexdigest()))
        uuid = str(gpu.get("uuid", default_uuid))
        minor = self.whole(gpu.get("minor", index), f"{where}.minor", _line(gpu, "minor"), 0)
        replicas = None
        if gpu.get("replicas") is not None:
            replicas = self.whole(gpu["replicas"], f"{where}.replicas", _line(gpu, "replicas"), 1)
        migs = tuple(
            self.mig(m, f"{where}.mig[{k}]", uuid, k, memory)
            for k, m in enumerate(self.sequence(gpu.get("mig"), f"{where}.mig", _line(gpu, "mig")))
        )
        lacks = self.sequence(gpu.get("lacks"), f"{where}.lacks", _line(gpu, "lacks"))
        for k, engine in enumerate(lacks):
            if engine not in VIDEO_ENGINES:
                raise self.fail(
                    f"{where}.lacks[{k}]",
                    _line(gpu, "lacks"),
                    f"{engine!r} is not an engine a GPU may lack; valid: {', '.join(VIDEO_ENGINES)}",
                )
        engines = frozenset(ENGINES) - frozenset(lacks)
        return GpuSpec(
            index, uuid, model, memory, minor=minor, replicas=replicas, migs=migs, engines=engines, compute_mode=mode
        )

    def mig(self, raw: Any, where: str, parent: str, position: int, parent_memory: int) -> MigSpec:
        spec = self.mapping(
            raw, where, 0, {"profile", "memory", "uuid", "gpu_instance", "profile_id", "placement", "replicas"}
        )
        profile = spec.get("profile")
        if not isinstance(profile, str) or not re.fullmatch(r"\d+g\.\d+gb(\+\w+)?", profile):
            raise self.fail(
                f"{where}.profile",
                _line(spec, "profile") or spec.line,
                f"{profile!r} is not a MIG profile like 1g.18gb",
            )
        memory = self.size(spec.get("memory"), f"{where}.memory", _line(spec, "memory") or spec.line)
        if not 0 < memory <= parent_memory:
            raise self.fail(f"{where}.memory", _line(spec, "memory"), "must be above 0 and at most the GPU's memory")
        default_uuid = "MIG-" + str(uuidlib.UUID(hashlib.md5(f"{parent}/{position}".encode()).hexdigest()))
        return MigSpec(
            uuid=str(spec.get("uuid", default_uuid)),
            profile=profile,
            memory_total=memory,
            gpu_instance_id=self.whole(
                spec.get("gpu_instance", position + 1), f"{where}.gpu_instance", _line(spec, "gpu_instance"), 0
            ),
            profile_id=self.whole(spec.get("profile_id", 19), f"{where}.profile_id", _line(spec, "profile_id"), 0),
            placement_start=self.whole(
                spec.get("placement", position), f"{where}.placement", _line(spec, "placement"), 0
            ),
            replicas=self.whole(spec.get("replicas", 1), f"{where}.replicas", _line(spec, "replicas"), 1),
        )

    def whole(self, raw: Any, where: str, line: int, low: int) -> int:
        if not isinstance(raw, int) or isinstance(raw, bool) or raw < low:
            raise self.fail(where, line, f"{raw!r} is not a whole number >= {low}")
        return raw

    def pod(self, raw: Any, where: str, gpus: tuple[GpuSpec, ...]) -> PodSpec:
        allowed = {
            "namespace",
            "name",
            "uid",
            "static",
            "cgroup",
            "processes",
            "shares",
            "in_directory",
            "period_s",
            "active_s",
            "offset_s",
            "phase",
            "annotations",
            "claims",
        }
        pod = self.mapping(raw, where, 0, allowed)
        name = pod.get("name")
        if not isinstance(name, str) or not name:
            raise self.fail(f"{where}.name", _line(pod, "name") or pod.line, f"{name!r}: a pod needs a name")
        namespace = str(pod.get("namespace", "default"))
        static = self.boolean(pod.get("static", False), f"{where}.static", _line(pod, "static"))
        uid = pod.get("uid")
        if uid is None:
            digest = hashlib.md5(f"{namespace}/{name}".encode()).hexdigest()
            uid = digest if static else str(uuidlib.UUID(digest))
        uid = str(uid).lower()
        pattern = r"[0-9a-f]{32}" if static else r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
        if not re.fullmatch(pattern, uid):
            valid = "32 hex digits (a static pod's config hash)" if static else "a dashed UUID"
            raise self.fail(f"{where}.uid", _line(pod, "uid"), f"{uid!r} is not {valid}")
        processes = tuple(
            self.process(p, f"{where}.processes[{i}]", gpus)
            for i, p in enumerate(self.sequence(pod.get("processes"), f"{where}.processes", _line(pod, "processes")))
        )
        shares, mig_shares = self.shares(pod.get("shares"), f"{where}.shares", _line(pod, "shares"), gpus)
        phase = pod.get("phase", "Running")
        if phase not in PHASES:
            raise self.fail(f"{where}.phase", _line(pod, "phase"), f"{phase!r}; valid: {', '.join(PHASES)}")
        annotations = self.annotations(pod.get("annotations"), f"{where}.annotations", _line(pod, "annotations"))
        hami = annotations.get(HAMI_ANNOTATION)
        if hami is not None:
            try:
                parse_hami(hami, (), pod_containers(processes), f"{where}.annotations.{HAMI_ANNOTATION}")
            except HamiAnnotationError as error:
                raise ScenarioError(f"{self.source}:{_line(pod, 'annotations')}: {error}") from None
        claims = tuple(
            self.claim(c, f"{where}.claims[{i}]")
            for i, c in enumerate(self.sequence(pod.get("claims"), f"{where}.claims", _line(pod, "claims")))
        )
        period = self.number_or_none(pod.get("period_s"), f"{where}.period_s", _line(pod, "period_s"))
        active = self.number_or_none(pod.get("active_s"), f"{where}.active_s", _line(pod, "active_s"))
        if (period is None) != (active is None):
            raise self.fail(where, pod.line, "period_s and active_s go together")
        if period is not None and active is not None and not 0 < active <= period:
            raise self.fail(f"{where}.active_s", _line(pod, "active_s"), f"{active} must be in (0, period_s]")
        offset = self.number(pod.get("offset_s", 0), f"{where}.offset_s", _line(pod, "offset_s"))
        if offset and period is None:
            raise self.fail(f"{where}.offset_s", _line(pod, "offset_s"), "an offset needs period_s and active_s")
        if not 0 <= offset < (period or math.inf):
            raise self.fail(f"{where}.offset_s", _line(pod, "offset_s"), f"{offset} must be in [0, period_s)")
        return PodSpec(
            namespace=namespace,
            name=name,
            uid=uid,
            static=static,
            cgroup=self.cgroup(pod.get("cgroup"), f"{where}.cgroup", _line(pod, "cgroup")),
            processes=processes,
            shares=shares,
            mig_shares=mig_shares,
            phase=phase,
            annotations=annotations,
            claims=claims,
            in_directory=self.boolean(
                pod.get("in_directory", True), f"{where}.in_directory", _line(pod, "in_directory")
            ),
            period_s=period,
            active_s=active,
            offset_s=offset,
        )

    def shares(
        self, raw: Any, where: str, line: int, gpus: tuple[GpuSpec, ...]
    ) -> tuple[dict[int, int], dict[tuple[int, int], int]]:
        """`{<GPU index>: n}` for whole GPUs, `{"<GPU index>/<MIG position>": n}` for MIG devices."""
        if raw is None:
            return {}, {}
        if not isinstance(raw, dict):
            raise self.fail(where, line, f"{raw!r} is not a mapping of GPU index to shares")
        shares: dict[int, int] = {}
        mig_shares: dict[tuple[int, int], int] = {}
        for key, count in raw.items():
            at = f"{where}.{key}"
            key_line = _line(raw, key)
            text = str(key) if isinstance(key, (int, str)) and not isinstance(key, bool) else ""
            match = re.fullmatch(r"(\d+)(?:/(\d+))?", text)
            index = int(match.group(1)) if match else None
            if index is None or not 0 <= index < len(gpus):
                raise self.fail(
                    at, key_line, f"{key!r} is not a GPU index (or <GPU>/<MIG device>); valid: 0 to {len(gpus) - 1}"
                )
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise self.fail(
                    at, key_line, f"{count!r} is not a whole number >= 1 (a GPU the pod holds no share of is left out)"
                )
            if match and match.group(2) is not None:
                mig = int(match.group(2))
                if mig >= len(gpus[index].migs):
                    raise self.fail(at, key_line, f"GPU {index} has no MIG device {mig}")
                mig_shares[(index, mig)] = count
            else:
                shares[index] = count
        return shares, mig_shares

    def annotations(self, raw: Any, where: str, line: int) -> dict[str, str]:
        if raw is None:
            return {}
        if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
            raise self.fail(where, line, f"{raw!r} is not a mapping of annotation names to strings")
        return dict(raw)

    def claim(self, raw: Any, where: str) -> ClaimSpec:
        spec = self.mapping(raw, where, 0, {"device", "claim", "container"})
        device, claim = spec.get("device"), spec.get("claim")
        if not isinstance(device, str) or not device:
            raise self.fail(
                f"{where}.device", _line(spec, "device") or spec.line, f"{device!r}: a DRA device name like gpu-0"
            )
        if not isinstance(claim, str) or not claim:
            raise self.fail(f"{where}.claim", _line(spec, "claim") or spec.line, f"{claim!r}: a claim name")
        return ClaimSpec(device=device, claim=claim, container=str(spec.get("container", "main")))

    def cgroup(self, raw: Any, where: str, line: int) -> CgroupSpec:
        if raw is None:
            return CgroupSpec()
        spec = self.mapping(raw, where, line, {"version", "driver", "runtime", "qos"})
        version = spec.get("version", 2)
        if version not in (1, 2):
            raise self.fail(f"{where}.version", _line(spec, "version"), f"{version!r}; valid: 1, 2")
        values = {}
        for key, valid, default in (
            ("driver", DRIVERS, "systemd"),
            ("runtime", RUNTIMES, "containerd"),
            ("qos", QOS_CLASSES, "burstable"),
        ):
            value = spec.get(key, default)
            if value not in valid:
                raise self.fail(f"{where}.{key}", _line(spec, key), f"{value!r}; valid: {', '.join(valid)}")
            values[key] = value
        return CgroupSpec(version=version, **values)

    def process(self, raw: Any, where: str, gpus: tuple[GpuSpec, ...]) -> ProcessSpec:
        proc, gpu, memory, sm = self.gpu_process(
            raw, where, len(gpus), "container", "mig", "command", "nested", "mps", "pid"
        )
        engines = self.engine_waves(proc, where, gpus[gpu])
        mig = proc.get("mig")
        migs = len(gpus[gpu].migs)
        if migs and mig is None:
            raise self.fail(where, proc.line, f"GPU {gpu} is in MIG mode: say which MIG device (mig: 0 to {migs - 1})")
        if mig is not None and (not isinstance(mig, int) or isinstance(mig, bool) or not 0 <= mig < migs):
            valid = f"0 to {migs - 1}" if migs else f"none: GPU {gpu} is not in MIG mode"
            raise self.fail(f"{where}.mig", _line(proc, "mig"), f"{mig!r} is not a MIG device; valid: {valid}")
        return ProcessSpec(
            gpu=gpu,
            memory=memory,
            sm=sm,
            container=str(proc.get("container", "main")),
            mig=mig,
            command=self.command(proc),
            engines=engines,
            mps=self.mps(proc, where),
            pid=None if proc.get("pid") is None else self.explicit_pid(proc["pid"], f"{where}.pid", _line(proc, "pid")),
            nested=self.nested(proc.get("nested", ""), f"{where}.nested", _line(proc, "nested")),
        )

    def mps(self, proc: _LineDict, where: str) -> str:
        role = proc.get("mps", "")
        if role not in ("", *MPS_ROLES):
            raise self.fail(f"{where}.mps", _line(proc, "mps"), f"{role!r}; valid: {', '.join(MPS_ROLES)}")
        return str(role)

    def command(self, proc: _LineDict) -> str:
        """/proc/<pid>/stat's command, cut to the kernel's 15 characters; an MPS server's by default."""
        default = MPS_SERVER_COMMAND if proc.get("mps") == "server" else "python3"
        return str(proc.get("command", default))[:15]

    def explicit_pid(self, raw: Any, where: str, line: int) -> int:
        if not isinstance(raw, int) or isinstance(raw, bool) or raw not in EXPLICIT_PIDS:
            valid = f"{EXPLICIT_PIDS[0]} to {EXPLICIT_PIDS[-1]}"
            raise self.fail(where, line, f"{raw!r} is not a PID a scenario may give; valid: {valid}")
        return raw

    def nested(self, raw: Any, where: str, line: int) -> str:
        """A relative cgroup path: components without `..`, joined by `/`."""
        if not isinstance(raw, str) or raw.startswith("/") or ".." in raw.split("/") or "\n" in raw:
            raise self.fail(where, line, f"{raw!r} is not a relative cgroup path like a.slice/b.scope")
        return raw.strip("/")

    def host_process(self, raw: Any, where: str, gpus: tuple[GpuSpec, ...]) -> HostProcessSpec:
        proc, gpu, memory, sm = self.gpu_process(raw, where, len(gpus), "cgroup", "command", "mps")
        cgroup = str(proc.get("cgroup", "0::/system.slice/nvidia-persistenced.service"))
        return HostProcessSpec(
            gpu=gpu,
            memory=memory,
            sm=sm,
            cgroup=cgroup,
            command=self.command(proc),
            engines=self.engine_waves(proc, where, gpus[gpu]),
            mps=self.mps(proc, where),
        )

    def engine_waves(self, proc: _LineDict, where: str, gpu: GpuSpec) -> dict[str, Wave]:
        """A process's use of its GPU's other engines; one its GPU lacks is an error."""
        waves = {}
        for engine in ENGINES:
            if engine not in proc:
                continue
            if engine not in gpu.engines:
                raise self.fail(
                    f"{where}.{engine}",
                    _line(proc, engine),
                    f"GPU {gpu.index} has no {engine} (its lacks names it)",
                )
            waves[engine] = self.wave(proc[engine], f"{where}.{engine}", _line(proc, engine), size=False)
        return waves

    def gpu_process(self, raw: Any, where: str, gpu_count: int, *extra: str) -> tuple[_LineDict, int, Wave, Wave]:
        """What a pod's process and a host process have in common: GPU, memory, SM."""
        proc = self.mapping(raw, where, 0, {"gpu", "memory", "sm", *ENGINES, *extra})
        return (
            proc,
            self.gpu_index(proc, where, gpu_count),
            self.wave(proc.get("memory", 0), f"{where}.memory", _line(proc, "memory"), size=True),
            self.wave(proc.get("sm", 0), f"{where}.sm", _line(proc, "sm"), size=False),
        )

    def gpu_index(self, proc: _LineDict, where: str, gpu_count: int) -> int:
        gpu = proc.get("gpu", 0)
        if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < gpu_count:
            raise self.fail(
                f"{where}.gpu",
                _line(proc, "gpu") or proc.line,
                f"{gpu!r} is not a GPU index; valid: 0 to {gpu_count - 1}",
            )
        return gpu

    def wave(self, raw: Any, where: str, line: int, size: bool) -> Wave:
        def value(v: Any, at: str) -> float:
            if size:
                return float(self.size(v, at, line))
            number = self.number(v, at, line)
            if not 0.0 <= number <= 1.0:
                raise self.fail(at, line, f"{v!r} is not a fraction between 0 and 1")
            return number

        if isinstance(raw, dict):
            spec = self.mapping(raw, where, line, {"mean", "amplitude", "period_s", "phase"})
            period = self.number(spec.get("period_s", 60), f"{where}.period_s", line)
            if period <= 0:
                raise self.fail(f"{where}.period_s", line, f"{period} must be above 0")
            return Wave(
                mean=value(spec.get("mean", 0), f"{where}.mean"),
                amplitude=value(spec.get("amplitude", 0), f"{where}.amplitude"),
                period_s=period,
                phase=self.number(spec.get("phase", 0), f"{where}.phase", line),
            )
        return Wave(mean=value(raw, where))

    def size(self, raw: Any, where: str, line: int) -> int:
        valid = "valid: bytes, or a number with B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB), up to 1 PiB"
        if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
            value = float(raw) if raw <= MAX_SIZE_BYTES else math.inf
        else:
            match = _SIZE.match(raw) if isinstance(raw, str) else None
            if match is None:
                raise self.fail(where, line, f"{raw!r} is not a size; {valid}")
            value = float(match.group("number")) * _UNITS[match.group("unit") or ""]
        if not value <= MAX_SIZE_BYTES:  # inf and nan too
            shown = raw if len(str(raw)) < 40 else f"{str(raw)[:20]}...({len(str(raw))} characters)"
            raise self.fail(where, line, f"{shown!r} is too large; {valid}")
        return int(value)

    def number(self, raw: Any, where: str, line: int) -> float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            raise self.fail(where, line, f"{raw!r} is not a number")
        return float(raw)

    def number_or_none(self, raw: Any, where: str, line: int) -> float | None:
        if raw is None:
            return None
        number = self.number(raw, where, line)
        if number <= 0:
            raise self.fail(where, line, f"{raw!r} must be above 0")
        return number

    def boolean(self, raw: Any, where: str, line: int) -> bool:
        if not isinstance(raw, bool):
            raise self.fail(where, line, f"{raw!r} is not true or false")
        return raw


def _line(mapping: Any, key: Any) -> int:
    lines = getattr(mapping, "key_lines", None) or {}
    return int(lines.get(str(key), getattr(mapping, "line", 0)))


def _item_line(item: Any) -> int:
    """The line an item of a sequence starts on, where the loader knows it."""
    return int(getattr(item, "line", 0))


def _gib(size: float) -> str:
    return f"{size / 1024**3:.4g} GiB"
