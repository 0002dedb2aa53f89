"""A scenario's pods and processes, read with located errors (sim/located.py's fields)."""

from __future__ import annotations

import hashlib
import math
import re
import uuid as uuidlib
from typing import Any

from otel_vgpu.allocation.hami import ANNOTATION as HAMI_ANNOTATION
from otel_vgpu.allocation.hami import HamiAnnotationError, parse_hami
from otel_vgpu.allocation.kai import parse_portion
from otel_vgpu.gpu.backend import ENGINES
from otel_vgpu.sim.health_fields import HealthFields
from otel_vgpu.sim.located import LineDict, line_of
from otel_vgpu.sim.scenario import (
    BIND_REQUEST_PHASES,
    BIND_REQUEST_TYPES,
    DRIVERS,
    EXPLICIT_PIDS,
    MPS_ROLES,
    MPS_SERVER_COMMAND,
    PHASES,
    PIPES,
    QOS_CLASSES,
    RUNTIMES,
    BindRequestSpec,
    CgroupSpec,
    ClaimSpec,
    GpuSpec,
    HostProcessSpec,
    PodSpec,
    ProcessSpec,
    ScenarioError,
    Wave,
    pod_containers,
)


class PodFields(HealthFields):
    """The fields of a pod, its processes and a host process."""

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
            "restarts",
            "phase",
            "annotations",
            "labels",
            "service_account",
            "bind_request",
            "claims",
        }
        pod = self.mapping(raw, where, 0, allowed)
        name = pod.get("name")
        if not isinstance(name, str) or not name:
            raise self.fail(f"{where}.name", line_of(pod, "name") or pod.line, f"{name!r}: a pod needs a name")
        namespace = str(pod.get("namespace", "default"))
        static = self.boolean(pod.get("static", False), f"{where}.static", line_of(pod, "static"))
        uid = pod.get("uid")
        if uid is None:
            digest = hashlib.md5(f"{namespace}/{name}".encode()).hexdigest()
            uid = digest if static else str(uuidlib.UUID(digest))
        uid = str(uid).lower()
        pattern = r"[0-9a-f]{32}" if static else r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
        if not re.fullmatch(pattern, uid):
            valid = "32 hex digits (a static pod's config hash)" if static else "a dashed UUID"
            raise self.fail(f"{where}.uid", line_of(pod, "uid"), f"{uid!r} is not {valid}")
        processes = tuple(
            self.process(p, f"{where}.processes[{i}]", gpus)
            for i, p in enumerate(self.sequence(pod.get("processes"), f"{where}.processes", line_of(pod, "processes")))
        )
        shares, mig_shares = self.shares(pod.get("shares"), f"{where}.shares", line_of(pod, "shares"), gpus)
        phase = pod.get("phase", "Running")
        if phase not in PHASES:
            raise self.fail(f"{where}.phase", line_of(pod, "phase"), f"{phase!r}; valid: {', '.join(PHASES)}")
        annotations = self.annotations(pod.get("annotations"), f"{where}.annotations", line_of(pod, "annotations"))
        hami = annotations.get(HAMI_ANNOTATION)
        if hami is not None:
            try:
                parse_hami(hami, (), pod_containers(processes), f"{where}.annotations.{HAMI_ANNOTATION}")
            except HamiAnnotationError as error:
                raise ScenarioError(f"{self.source}:{line_of(pod, 'annotations')}: {error}") from None
        labels = self.annotations(pod.get("labels"), f"{where}.labels", line_of(pod, "labels"), "label")
        bind_request = self.bind_request(pod.get("bind_request"), f"{where}.bind_request", line_of(pod, "bind_request"))
        claims = tuple(
            self.claim(c, f"{where}.claims[{i}]")
            for i, c in enumerate(self.sequence(pod.get("claims"), f"{where}.claims", line_of(pod, "claims")))
        )
        period = self.number_or_none(pod.get("period_s"), f"{where}.period_s", line_of(pod, "period_s"))
        active = self.number_or_none(pod.get("active_s"), f"{where}.active_s", line_of(pod, "active_s"))
        if (period is None) != (active is None):
            raise self.fail(where, pod.line, "period_s and active_s go together")
        if period is not None and active is not None and not 0 < active <= period:
            raise self.fail(f"{where}.active_s", line_of(pod, "active_s"), f"{active} must be in (0, period_s]")
        offset = self.number(pod.get("offset_s", 0), f"{where}.offset_s", line_of(pod, "offset_s"))
        if offset and period is None:
            raise self.fail(f"{where}.offset_s", line_of(pod, "offset_s"), "an offset needs period_s and active_s")
        if not 0 <= offset < (period or math.inf):
            raise self.fail(f"{where}.offset_s", line_of(pod, "offset_s"), f"{offset} must be in [0, period_s)")
        restarts = self.boolean(pod.get("restarts", False), f"{where}.restarts", line_of(pod, "restarts"))
        if restarts and period is None:
            raise self.fail(f"{where}.restarts", line_of(pod, "restarts"), "restarts needs period_s and active_s")
        return PodSpec(
            namespace=namespace,
            name=name,
            uid=uid,
            static=static,
            cgroup=self.cgroup(pod.get("cgroup"), f"{where}.cgroup", line_of(pod, "cgroup")),
            processes=processes,
            shares=shares,
            mig_shares=mig_shares,
            phase=phase,
            annotations=annotations,
            labels=labels,
            service_account=str(pod.get("service_account", "default")),
            bind_request=bind_request,
            claims=claims,
            in_directory=self.boolean(
                pod.get("in_directory", True), f"{where}.in_directory", line_of(pod, "in_directory")
            ),
            period_s=period,
            active_s=active,
            offset_s=offset,
            restarts=restarts,
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
            key_line = line_of(raw, key)
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

    def annotations(self, raw: Any, where: str, line: int, what: str = "annotation") -> dict[str, str]:
        if raw is None:
            return {}
        if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
            raise self.fail(where, line, f"{raw!r} is not a mapping of {what} names to strings")
        return dict(raw)

    def bind_request(self, raw: Any, where: str, line: int) -> BindRequestSpec | None:
        """KAI's BindRequest of a pod: its type, portion, GPU groups, phase and node."""
        if raw is None:
            return None
        spec = self.mapping(raw, where, line, {"type", "portion", "groups", "phase", "node"})
        kind = spec.get("type", "Fraction")
        if kind not in BIND_REQUEST_TYPES:
            raise self.fail(f"{where}.type", line_of(spec, "type"), f"{kind!r}; valid: {', '.join(BIND_REQUEST_TYPES)}")
        phase = spec.get("phase", "Succeeded")
        if phase not in BIND_REQUEST_PHASES:
            valid = ", ".join(BIND_REQUEST_PHASES)
            raise self.fail(f"{where}.phase", line_of(spec, "phase"), f"{phase!r}; valid: {valid}")
        portion = str(spec.get("portion", "1.00"))
        if parse_portion(portion) is None:
            raise self.fail(f"{where}.portion", line_of(spec, "portion"), f"{portion!r} is no portion of a GPU (0-1]")
        groups = self.sequence(spec.get("groups"), f"{where}.groups", line_of(spec, "groups"))
        if not all(isinstance(group, str) and group for group in groups) or (kind == "Fraction" and not groups):
            what = "names of GPU groups" + (", at least one for a Fraction" if kind == "Fraction" else "")
            raise self.fail(f"{where}.groups", line_of(spec, "groups") or spec.line, f"{groups!r}: {what}")
        node = spec.get("node")
        return BindRequestSpec(kind, portion, tuple(groups), phase, None if node is None else str(node))

    def claim(self, raw: Any, where: str) -> ClaimSpec:
        spec = self.mapping(raw, where, 0, {"device", "claim", "container"})
        device, claim = spec.get("device"), spec.get("claim")
        if not isinstance(device, str) or not device:
            raise self.fail(
                f"{where}.device", line_of(spec, "device") or spec.line, f"{device!r}: a DRA device name like gpu-0"
            )
        if not isinstance(claim, str) or not claim:
            raise self.fail(f"{where}.claim", line_of(spec, "claim") or spec.line, f"{claim!r}: a claim name")
        return ClaimSpec(device=device, claim=claim, container=str(spec.get("container", "main")))

    def cgroup(self, raw: Any, where: str, line: int) -> CgroupSpec:
        if raw is None:
            return CgroupSpec()
        spec = self.mapping(raw, where, line, {"version", "driver", "runtime", "qos"})
        version = spec.get("version", 2)
        if version not in (1, 2):
            raise self.fail(f"{where}.version", line_of(spec, "version"), f"{version!r}; valid: 1, 2")
        values = {}
        for key, valid, default in (
            ("driver", DRIVERS, "systemd"),
            ("runtime", RUNTIMES, "containerd"),
            ("qos", QOS_CLASSES, "burstable"),
        ):
            value = spec.get(key, default)
            if value not in valid:
                raise self.fail(f"{where}.{key}", line_of(spec, key), f"{value!r}; valid: {', '.join(valid)}")
            values[key] = value
        return CgroupSpec(version=version, **values)

    def process(self, raw: Any, where: str, gpus: tuple[GpuSpec, ...]) -> ProcessSpec:
        proc, gpu, memory, sm = self.gpu_process(
            raw, where, len(gpus), "container", "mig", "command", "nested", "mps", "pid", "dodges_ticks"
        )
        engines = self.engine_waves(proc, where, gpus[gpu])
        mig = proc.get("mig")
        migs = len(gpus[gpu].migs)
        if migs and mig is None:
            raise self.fail(where, proc.line, f"GPU {gpu} is in MIG mode: say which MIG device (mig: 0 to {migs - 1})")
        if mig is not None and (not isinstance(mig, int) or isinstance(mig, bool) or not 0 <= mig < migs):
            valid = f"0 to {migs - 1}" if migs else f"none: GPU {gpu} is not in MIG mode"
            raise self.fail(f"{where}.mig", line_of(proc, "mig"), f"{mig!r} is not a MIG device; valid: {valid}")
        return ProcessSpec(
            gpu=gpu,
            memory=memory,
            sm=sm,
            container=str(proc.get("container", "main")),
            mig=mig,
            command=self.command(proc),
            engines=engines,
            mps=self.mps(proc, where),
            pid=None
            if proc.get("pid") is None
            else self.explicit_pid(proc["pid"], f"{where}.pid", line_of(proc, "pid")),
            nested=self.nested(proc.get("nested", ""), f"{where}.nested", line_of(proc, "nested")),
            pipes=self.pipe_waves(proc, where),
            dodges_ticks=self.boolean(
                proc.get("dodges_ticks", False), f"{where}.dodges_ticks", line_of(proc, "dodges_ticks")
            ),
        )

    def mps(self, proc: LineDict, where: str) -> str:
        role = proc.get("mps", "")
        if role not in ("", *MPS_ROLES):
            raise self.fail(f"{where}.mps", line_of(proc, "mps"), f"{role!r}; valid: {', '.join(MPS_ROLES)}")
        return str(role)

    def command(self, proc: LineDict) -> str:
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
            pipes=self.pipe_waves(proc, where),
        )

    def engine_waves(self, proc: LineDict, where: str, gpu: GpuSpec) -> dict[str, Wave]:
        """A process's use of its GPU's other engines; one its GPU lacks is an error."""
        waves = {}
        for engine in ENGINES:
            if engine not in proc:
                continue
            if engine not in gpu.engines:
                raise self.fail(
                    f"{where}.{engine}",
                    line_of(proc, engine),
                    f"GPU {gpu.index} has no {engine} (its lacks names it)",
                )
            waves[engine] = self.wave(proc[engine], f"{where}.{engine}", line_of(proc, engine), size=False)
        return waves

    def gpu_process(self, raw: Any, where: str, gpu_count: int, *extra: str) -> tuple[LineDict, int, Wave, Wave]:
        """What a pod's process and a host process have in common: GPU, memory, SM."""
        proc = self.mapping(raw, where, 0, {"gpu", "memory", "sm", *ENGINES, *PIPES, *extra})
        return (
            proc,
            self.gpu_index(proc, where, gpu_count),
            self.wave(proc.get("memory", 0), f"{where}.memory", line_of(proc, "memory"), size=True),
            self.wave(proc.get("sm", 0), f"{where}.sm", line_of(proc, "sm"), size=False),
        )

    def gpu_index(self, proc: LineDict, where: str, gpu_count: int) -> int:
        gpu = proc.get("gpu", 0)
        if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < gpu_count:
            raise self.fail(
                f"{where}.gpu",
                line_of(proc, "gpu") or proc.line,
                f"{gpu!r} is not a GPU index; valid: 0 to {gpu_count - 1}",
            )
        return gpu
