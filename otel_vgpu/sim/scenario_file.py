"""Scenario files for the simulated GPU node: loading and validation into a `Scenario`
(sim/scenario.py). YAML or JSON; docs/scenario.md gives the format. Every error names the file,
the line, the field, the value and what would be valid."""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import uuid as uuidlib
from importlib import resources
from pathlib import Path
from typing import Any

from otel_vgpu.allocation.ratio import MAX_RATIO
from otel_vgpu.files import FileProblem, read_regular
from otel_vgpu.gpu.backend import ENGINES, ErrorCode
from otel_vgpu.sim.health_fields import GPU_HEALTH_FIELDS, HealthFields
from otel_vgpu.sim.located import item_line, line_of, load_document
from otel_vgpu.sim.pod_fields import PodFields
from otel_vgpu.sim.scenario import (
    BUILTIN,
    COMPUTE_MODES,
    CONTEXT_BYTES,
    DEFAULT_RATIO,
    DEVICE_PLUGINS,
    DRIVER_VERSION,
    FAULT_CALLS,
    MAX_CHURN_PROCESSES,
    MAX_DELAY_S,
    MAX_KEPT_S,
    MAX_RHYTHM_MS,
    MAX_SCENARIO_BYTES,
    MIG_STRATEGIES,
    RESERVED_BYTES,
    VIDEO_ENGINES,
    ChurnSpec,
    DevicePluginSpec,
    DriverSpec,
    FaultSpec,
    GpuSpec,
    HostProcessSpec,
    MigSpec,
    PodSpec,
    Scenario,
    ScenarioError,
)


class ScenarioFileError(ScenarioError):
    """The scenario file itself cannot be read (missing, not a regular file, too large, not
    UTF-8): the remedy is another file, not an edit of this one."""


def load_scenario(source: str, name: str | None = None) -> Scenario:
    """The built-in scenario (`builtin`) or the one in a file. `name`: how the messages name
    the file (the flag and its value, `--simulate x.yaml`); its path where None."""
    if source == BUILTIN:
        text = resources.files("otel_vgpu.sim").joinpath("scenarios/builtin.yaml").read_text()
        return parse_scenario(text, "builtin scenario")
    path = Path(source)
    named = name or str(path)
    try:
        text = read_regular(path, MAX_SCENARIO_BYTES).decode("utf-8")
    except FileProblem as problem:
        if problem.what == "no such file":
            raise ScenarioFileError(f"{named}: no such scenario file") from None
        if problem.what.startswith("is larger"):
            raise ScenarioFileError(
                f"{named}: larger than {MAX_SCENARIO_BYTES} bytes; a scenario is a few kilobytes"
            ) from None
        raise ScenarioFileError(f"{named}: {problem.what}") from None
    except UnicodeDecodeError as error:
        raise ScenarioFileError(f"{named}: cannot be read ({error})") from None
    return parse_scenario(text, named)


def parse_scenario(text: str, source: str) -> Scenario:
    return ScenarioReader(source).scenario(load_document(text, source))


def _overlap(first: PodSpec, second: PodSpec) -> bool:
    """Whether two pods can be active at one moment: only pods of one period whose windows
    (offset, offset + active) do not meet on its circle never are."""
    if first.period_s is None or second.period_s is None or first.period_s != second.period_s:
        return True
    period = first.period_s
    assert first.active_s is not None and second.active_s is not None
    gap = (second.offset_s - first.offset_s) % period
    return gap < first.active_s or period - gap < second.active_s


class ScenarioReader(PodFields, HealthFields):
    """Validates a loaded document into a Scenario, with located errors."""

    def scenario(self, document: Any) -> Scenario:
        top = self.mapping(
            document,
            "scenario",
            1,
            {
                "node",
                "gpus",
                "pods",
                "host_processes",
                "faults",
                "churn",
                "driver",
                "device_plugin",
                "ratio",
                "health_events",
            },
        )
        gpus_raw = self.sequence(top.get("gpus"), "gpus", line_of(top, "gpus"))
        if not gpus_raw:
            raise self.fail("gpus", line_of(top, "gpus"), "the node needs at least one GPU")
        gpus = tuple(self.gpu(raw, index) for index, raw in enumerate(gpus_raw))
        uuids = [gpu.uuid for gpu in gpus]
        if len(set(uuids)) != len(uuids):
            raise self.fail("gpus", line_of(top, "gpus"), "two GPUs have the same uuid")
        pods_raw = self.sequence(top.get("pods"), "pods", line_of(top, "pods"))
        pods = tuple(self.pod(raw, f"pods[{i}]", gpus) for i, raw in enumerate(pods_raw))
        seen: dict[tuple[str, str], int] = {}
        for i, pod in enumerate(pods):
            if (pod.namespace, pod.name) in seen:
                raise self.fail(
                    f"pods[{i}]",
                    item_line(pods_raw[i]),
                    f"{pod.namespace}/{pod.name} is also pods[{seen[(pod.namespace, pod.name)]}]",
                )
            seen[(pod.namespace, pod.name)] = i
        uids: dict[str, int] = {}
        for i, pod in enumerate(pods):
            if pod.uid in uids:
                raise self.fail(
                    f"pods[{i}].uid", line_of(pods_raw[i], "uid"), f"{pod.uid!r} is also pods[{uids[pod.uid]}]'s"
                )
            uids[pod.uid] = i
        hosts = tuple(
            self.host_process(raw, f"host_processes[{i}]", gpus)
            for i, raw in enumerate(
                self.sequence(top.get("host_processes"), "host_processes", line_of(top, "host_processes"))
            )
        )
        node = top.get("node")
        faults = tuple(
            self.fault(raw, f"faults[{i}]", len(gpus))
            for i, raw in enumerate(self.sequence(top.get("faults"), "faults", line_of(top, "faults")))
        )
        churn = None if top.get("churn") is None else self.churn(top["churn"], "churn", line_of(top, "churn"))
        events = tuple(
            self.health_event(raw, f"health_events[{i}]", len(gpus))
            for i, raw in enumerate(
                self.sequence(top.get("health_events"), "health_events", line_of(top, "health_events"))
            )
        )
        driver = DriverSpec() if top.get("driver") is None else self.driver(top["driver"], line_of(top, "driver"))
        plugin = (
            DevicePluginSpec()
            if top.get("device_plugin") is None
            else self.device_plugin(top["device_plugin"], line_of(top, "device_plugin"))
        )
        self.check_memory(gpus, pods, hosts, gpus_raw, driver.context_memory)
        self.check_mps(gpus, pods, hosts, gpus_raw)
        self.check_pids(pods, pods_raw)
        ratio = self.number(top.get("ratio", DEFAULT_RATIO), "ratio", line_of(top, "ratio"))
        if not 1 <= ratio <= MAX_RATIO:
            raise self.fail("ratio", line_of(top, "ratio"), f"{ratio:g} is not a ratio; valid: 1 to {MAX_RATIO}")
        return Scenario(
            gpus=gpus,
            pods=pods,
            host_processes=hosts,
            node_name=None if node is None else str(node),
            faults=faults,
            health_events=events,
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
        context_memory: int,
    ) -> None:
        """A GPU (or MIG device) holds no more than its memory, the driver's reservation first: processes
        that could ask for more, their contexts' memory with their own, are refused."""
        asked: dict[tuple[int, int | None], float] = {}
        contexts: dict[tuple[int, int | None], int] = {}
        processes = [(p.gpu, p.mig, p.memory.highest) for pod in pods for p in pod.processes]
        processes += [(host.gpu, None, host.memory.highest) for host in hosts]
        for gpu_index, mig_index, highest in processes:
            key = (gpu_index, mig_index)
            asked[key] = asked.get(key, 0.0) + max(0.0, highest) + context_memory
            contexts[key] = contexts.get(key, 0) + 1
        for (index, mig), total in sorted(asked.items(), key=lambda item: (item[0][0], item[0][1] or -1)):
            gpu = gpus[index]
            capacity = gpu.memory_total - gpu.reserved if mig is None else gpu.migs[mig].memory_total
            if total > capacity:
                device = f"GPU {index}" if mig is None else f"GPU {index}'s MIG device {mig}"
                room = f"{_gib(capacity)} beside the driver's {_gib(gpu.reserved)}" if mig is None else _gib(capacity)
                count = contexts[(index, mig)]
                of_contexts = f"{count * context_memory / 1024**2:.4g} MiB of it for {count} CUDA context"
                held = f" ({of_contexts}{'s' * (count > 1)})"
                raise self.fail(
                    f"gpus[{index}]",
                    item_line(gpus_raw[index]),
                    f"the processes on {device} can use up to {_gib(total)} together{held if context_memory else ''}; "
                    f"it has {room} (lower their memory, or move some to another GPU)",
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
            line = item_line(gpus_raw[index])
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
                        item_line(pods_raw[j]),
                        f"PID {pid} is also pods[{i}]'s, and the two can run at once "
                        "(give both one period_s and active windows that do not meet)",
                    )

    def device_plugin(self, raw: Any, line: int) -> DevicePluginSpec:
        spec = self.mapping(raw, "device_plugin", line, {"kind", "rename_by_default", "mig_strategy"})
        kind = spec.get("kind", "nvidia")
        if kind not in DEVICE_PLUGINS:
            raise self.fail(
                "device_plugin.kind", line_of(spec, "kind"), f"{kind!r}; valid: {', '.join(DEVICE_PLUGINS)}"
            )
        strategy = spec.get("mig_strategy", "single")
        if strategy not in MIG_STRATEGIES:
            raise self.fail(
                "device_plugin.mig_strategy",
                line_of(spec, "mig_strategy"),
                f"{strategy!r}; valid: {', '.join(MIG_STRATEGIES)}",
            )
        rename = self.boolean(
            spec.get("rename_by_default", False), "device_plugin.rename_by_default", line_of(spec, "rename_by_default")
        )
        return DevicePluginSpec(kind=kind, rename_by_default=rename, mig_strategy=strategy)

    def driver(self, raw: Any, line: int) -> DriverSpec:
        spec = self.mapping(
            raw,
            "driver",
            line,
            {
                "pid_namespace_filter",
                "ended_samples_s",
                "one_sample_a_period",
                "draw_seed",
                "rhythm_ms",
                "memory_info_v2",
                "context_memory",
                "version",
            },
        )
        version = spec.get("version", DRIVER_VERSION)
        if not isinstance(version, str) or not version.strip():
            raise self.fail("driver.version", line_of(spec, "version"), f"{version!r} must be a version, as 580.159.04")
        key, once = "pid_namespace_filter", "one_sample_a_period"
        kept = self.number(spec.get("ended_samples_s", 0), "driver.ended_samples_s", line_of(spec, "ended_samples_s"))
        if not 0 <= kept <= MAX_KEPT_S:
            raise self.fail(
                "driver.ended_samples_s", line_of(spec, "ended_samples_s"), f"{kept} must be from 0 to {MAX_KEPT_S:g}"
            )
        seed = spec.get("draw_seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise self.fail("driver.draw_seed", line_of(spec, "draw_seed"), f"{seed!r} is not a whole number >= 0")
        rhythm = self.number(spec.get("rhythm_ms", 0), "driver.rhythm_ms", line_of(spec, "rhythm_ms"))
        if not 0 <= rhythm <= MAX_RHYTHM_MS:
            raise self.fail(
                "driver.rhythm_ms", line_of(spec, "rhythm_ms"), f"{rhythm:g} must be from 0 to {MAX_RHYTHM_MS:g} (ms)"
            )
        return DriverSpec(
            pid_namespace_filter=self.boolean(spec.get(key, True), f"driver.{key}", line_of(spec, key)),
            ended_samples_s=kept,
            one_sample_a_period=self.boolean(spec.get(once, True), f"driver.{once}", line_of(spec, once)),
            draw_seed=seed,
            rhythm_ms=rhythm,
            memory_info_v2=self.boolean(
                spec.get("memory_info_v2", True), "driver.memory_info_v2", line_of(spec, "memory_info_v2")
            ),
            context_memory=self.size(
                spec.get("context_memory", CONTEXT_BYTES), "driver.context_memory", line_of(spec, "context_memory")
            ),
            version=version,
        )

    def fault(self, raw: Any, where: str, gpu_count: int) -> FaultSpec:
        spec = self.mapping(raw, where, 0, {"call", "gpu", "code", "delay_s", "from_s", "to_s"})
        call = spec.get("call")
        if call not in FAULT_CALLS:
            raise self.fail(f"{where}.call", line_of(spec, "call"), f"{call!r}; valid: {', '.join(FAULT_CALLS)}")
        gpu = None if spec.get("gpu") is None else self.gpu_index(spec, where, gpu_count)
        code = spec.get("code")
        if code is not None and code not in ErrorCode.__members__:
            raise self.fail(
                f"{where}.code", line_of(spec, "code"), f"{code!r} is not an NVML error; valid: {', '.join(ErrorCode)}"
            )
        delay = self.number(spec.get("delay_s", 0), f"{where}.delay_s", line_of(spec, "delay_s"))
        if not 0 <= delay <= MAX_DELAY_S:
            raise self.fail(
                f"{where}.delay_s", line_of(spec, "delay_s"), f"{delay} must be from 0 to {MAX_DELAY_S:g} s"
            )
        if code is None and delay <= 0:
            raise self.fail(where, spec.line, "a fault needs a code (e.g. GPU_IS_LOST) or a delay_s above 0")
        return FaultSpec(
            call=call,
            gpu=gpu,
            code=None if code is None else ErrorCode[code],
            delay_s=delay,
            from_s=self.number(spec.get("from_s", 0), f"{where}.from_s", line_of(spec, "from_s")),
            to_s=self.number(spec.get("to_s", math.inf), f"{where}.to_s", line_of(spec, "to_s"))
            if spec.get("to_s") is not None
            else math.inf,
        )

    def churn(self, raw: Any, where: str, line: int) -> ChurnSpec:
        spec = self.mapping(raw, where, line, {"pods", "live", "lifetime_s", "processes", "memory"})
        counts = {}
        for key, default in (("pods", None), ("live", None), ("processes", 1)):
            value = spec.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise self.fail(f"{where}.{key}", line_of(spec, key), f"{value!r} is not a whole number >= 1")
            counts[key] = value
        at_once = counts["live"] * counts["processes"]
        if at_once > MAX_CHURN_PROCESSES:
            raise self.fail(
                f"{where}.live",
                line_of(spec, "live"),
                f"{counts['live']} pods of {counts['processes']} processes each are {at_once} processes at once; "
                f"valid: live x processes up to {MAX_CHURN_PROCESSES}",
            )
        lifetime = self.number(spec.get("lifetime_s"), f"{where}.lifetime_s", line_of(spec, "lifetime_s"))
        if lifetime <= 0:
            raise self.fail(f"{where}.lifetime_s", line_of(spec, "lifetime_s"), f"{lifetime} must be above 0")
        memory = self.size(spec.get("memory", "1GiB"), f"{where}.memory", line_of(spec, "memory"))
        return ChurnSpec(
            pods=counts["pods"], live=counts["live"], lifetime_s=lifetime, processes=counts["processes"], memory=memory
        )

    def gpu(self, raw: Any, index: int) -> GpuSpec:
        where = f"gpus[{index}]"
        gpu = self.mapping(
            raw,
            where,
            0,
            {
                "model",
                "memory",
                "uuid",
                "minor",
                "replicas",
                "mig",
                "lacks",
                "compute_mode",
                "accounting",
                "reserved",
                *GPU_HEALTH_FIELDS,
            },
        )
        accounting = gpu.get("accounting", False)
        if not isinstance(accounting, bool):
            raise self.fail(f"{where}.accounting", line_of(gpu, "accounting"), f"{accounting!r}; valid: true, false")
        mode = gpu.get("compute_mode", "default")
        if mode not in COMPUTE_MODES:
            raise self.fail(
                f"{where}.compute_mode", line_of(gpu, "compute_mode"), f"{mode!r}; valid: {', '.join(COMPUTE_MODES)}"
            )
        model = str(gpu.get("model", "NVIDIA H100 80GB HBM3"))
        memory = self.size(gpu.get("memory", "80GiB"), f"{where}.memory", line_of(gpu, "memory"))
        if memory <= 0:
            raise self.fail(f"{where}.memory", line_of(gpu, "memory"), "must be above 0")
        reserved = self.size(gpu.get("reserved", RESERVED_BYTES), f"{where}.reserved", line_of(gpu, "reserved"))
        if reserved >= memory:
            raise self.fail(f"{where}.reserved", line_of(gpu, "reserved"), "must be below the GPU's memory")
        default_uuid = "GPU-" + str(uuidlib.UUID(hashlib.md5(f"gpu{index}".encode()).hexdigest()))
        uuid = str(gpu.get("uuid", default_uuid))
        minor = self.whole(gpu.get("minor", index), f"{where}.minor", line_of(gpu, "minor"), 0)
        replicas = None
        if gpu.get("replicas") is not None:
            replicas = self.whole(gpu["replicas"], f"{where}.replicas", line_of(gpu, "replicas"), 1)
        migs = tuple(
            self.mig(m, f"{where}.mig[{k}]", uuid, k, memory)
            for k, m in enumerate(self.sequence(gpu.get("mig"), f"{where}.mig", line_of(gpu, "mig")))
        )
        lacks = self.sequence(gpu.get("lacks"), f"{where}.lacks", line_of(gpu, "lacks"))
        for k, engine in enumerate(lacks):
            if engine not in VIDEO_ENGINES:
                raise self.fail(
                    f"{where}.lacks[{k}]",
                    line_of(gpu, "lacks"),
                    f"{engine!r} is not an engine a GPU may lack; valid: {', '.join(VIDEO_ENGINES)}",
                )
        engines = frozenset(ENGINES) - frozenset(lacks)
        return GpuSpec(
            index,
            uuid,
            model,
            memory,
            minor=minor,
            replicas=replicas,
            migs=migs,
            engines=engines,
            compute_mode=mode,
            accounting=accounting,
            reserved=reserved,
            **self.gpu_health(gpu, where, model),
        )

    def mig(self, raw: Any, where: str, parent: str, position: int, parent_memory: int) -> MigSpec:
        spec = self.mapping(
            raw, where, 0, {"profile", "memory", "uuid", "gpu_instance", "profile_id", "placement", "replicas"}
        )
        profile = spec.get("profile")
        if not isinstance(profile, str) or not re.fullmatch(r"\d+g\.\d+gb(\+\w+)?", profile):
            raise self.fail(
                f"{where}.profile",
                line_of(spec, "profile") or spec.line,
                f"{profile!r} is not a MIG profile like 1g.18gb",
            )
        memory = self.size(spec.get("memory"), f"{where}.memory", line_of(spec, "memory") or spec.line)
        if not 0 < memory <= parent_memory:
            raise self.fail(f"{where}.memory", line_of(spec, "memory"), "must be above 0 and at most the GPU's memory")
        default_uuid = "MIG-" + str(uuidlib.UUID(hashlib.md5(f"{parent}/{position}".encode()).hexdigest()))
        return MigSpec(
            uuid=str(spec.get("uuid", default_uuid)),
            profile=profile,
            memory_total=memory,
            gpu_instance_id=self.whole(
                spec.get("gpu_instance", position + 1), f"{where}.gpu_instance", line_of(spec, "gpu_instance"), 0
            ),
            profile_id=self.whole(spec.get("profile_id", 19), f"{where}.profile_id", line_of(spec, "profile_id"), 0),
            placement_start=self.whole(
                spec.get("placement", position), f"{where}.placement", line_of(spec, "placement"), 0
            ),
            replicas=self.whole(spec.get("replicas", 1), f"{where}.replicas", line_of(spec, "replicas"), 1),
        )


def _gib(size: float) -> str:
    return f"{size / 1024**3:.4g} GiB"
