"""A scenario's GPU health: what each GPU reports (GPM, NVLink, ECC, its power limit, the
figures its driver lacks) and what happens to it (`health_events`: XID errors, ECC errors,
PCIe replays, remapped rows, throttling), read with located errors (sim/located.py)."""

from __future__ import annotations

import math
from typing import Any

from otel_vgpu.gpu.device_figures import HEALTH_FIGURES
from otel_vgpu.sim.located import Fields, LineDict, line_of
from otel_vgpu.sim.scenario import (
    ECC_KINDS,
    GPM_MODELS,
    HEALTH_EVENTS,
    PIPES,
    REMAP_KINDS,
    THROTTLE_REASONS,
    HealthEventSpec,
    Wave,
    of_models,
)

GPU_HEALTH_FIELDS = ("gpm", "nvlink", "ecc", "power_limit_w", "unsupported")
# The most events one entry may stand for: a storm, not a memory bomb.
MAX_EVENT_COUNT = 1_000_000


class HealthFields(Fields):
    """The health fields of a GPU, of a process, and the scenario's health events."""

    def gpu_health(self, gpu: LineDict, where: str, model: str) -> dict[str, Any]:
        """GpuSpec's health fields from a GPU's mapping."""
        gpm_default = of_models(model, GPM_MODELS)
        limit = self.number(gpu.get("power_limit_w", 700.0), f"{where}.power_limit_w", line_of(gpu, "power_limit_w"))
        if not 0 < limit <= 5000:
            raise self.fail(f"{where}.power_limit_w", line_of(gpu, "power_limit_w"), f"{limit} must be in (0, 5000]")
        unsupported = self.sequence(gpu.get("unsupported"), f"{where}.unsupported", line_of(gpu, "unsupported"))
        for k, name in enumerate(unsupported):
            if name not in HEALTH_FIGURES:
                raise self.fail(
                    f"{where}.unsupported[{k}]",
                    line_of(gpu, "unsupported"),
                    f"{name!r} is not a health figure; valid: {', '.join(HEALTH_FIGURES)}",
                )
        return {
            "gpm": self.boolean(gpu.get("gpm", gpm_default), f"{where}.gpm", line_of(gpu, "gpm")),
            "nvlink": self.boolean(gpu.get("nvlink", False), f"{where}.nvlink", line_of(gpu, "nvlink")),
            "ecc": self.boolean(gpu.get("ecc", True), f"{where}.ecc", line_of(gpu, "ecc")),
            "power_limit_w": limit,
            "unsupported": frozenset(unsupported),
        }

    def pipe_waves(self, proc: LineDict, where: str) -> dict[str, Wave]:
        """What a process keeps busy of the tensor cores and DRAM, 0-1 each."""
        return {
            pipe: self.wave(proc[pipe], f"{where}.{pipe}", line_of(proc, pipe), size=False)
            for pipe in PIPES
            if pipe in proc
        }

    def health_event(self, raw: Any, where: str, gpu_count: int) -> HealthEventSpec:
        spec = self.mapping(raw, where, 0, {"gpu", "at_s", "from_s", "to_s", "count", *HEALTH_EVENTS})
        kinds = [kind for kind in HEALTH_EVENTS if kind in spec]
        if len(kinds) != 1:
            raise self.fail(where, spec.line, f"an event is one of {', '.join(HEALTH_EVENTS)}; this one names {kinds}")
        kind = kinds[0]
        gpu = spec.get("gpu", 0)
        if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < gpu_count:
            raise self.fail(f"{where}.gpu", line_of(spec, "gpu") or spec.line, f"{gpu!r}; valid: 0 to {gpu_count - 1}")
        count = self.whole(spec.get("count", 1), f"{where}.count", line_of(spec, "count"), 1)
        if count > MAX_EVENT_COUNT:
            raise self.fail(f"{where}.count", line_of(spec, "count"), f"{count} is over {MAX_EVENT_COUNT}")
        start_key = "from_s" if kind == "throttle" else "at_s"
        at = self.number(spec.get(start_key, 0), f"{where}.{start_key}", line_of(spec, start_key))
        to = math.inf if spec.get("to_s") is None else self.number(spec["to_s"], f"{where}.to_s", line_of(spec, "to_s"))
        if kind != "throttle" and "to_s" in spec:
            raise self.fail(f"{where}.to_s", line_of(spec, "to_s"), "only throttling lasts (from_s, to_s)")
        if to <= at:
            raise self.fail(f"{where}.to_s", line_of(spec, "to_s"), f"{to} must be after from_s, {at}")
        value, at_line = spec[kind], line_of(spec, kind)
        if kind == "xid":
            code = self.whole(value, f"{where}.xid", at_line, 1)
            return HealthEventSpec(gpu, kind, at, code=code, count=count)
        if kind == "pcie_replays":
            return HealthEventSpec(gpu, kind, at, count=self.whole(value, f"{where}.pcie_replays", at_line, 1))
        if kind == "throttle":
            reasons = self.sequence(value, f"{where}.throttle", at_line)
            bad = [r for r in reasons if r not in THROTTLE_REASONS]
            if not reasons or bad:
                raise self.fail(
                    f"{where}.throttle", at_line, f"{bad or reasons!r}; valid: {', '.join(THROTTLE_REASONS)}"
                )
            bits = 0
            for reason in reasons:
                bits |= THROTTLE_REASONS[reason]
            return HealthEventSpec(gpu, kind, at, to_s=to, reasons=bits)
        valid = ECC_KINDS if kind == "ecc" else REMAP_KINDS
        if value not in valid:
            raise self.fail(f"{where}.{kind}", at_line, f"{value!r}; valid: {', '.join(valid)}")
        return HealthEventSpec(gpu, kind, at, what=str(value), count=count)
