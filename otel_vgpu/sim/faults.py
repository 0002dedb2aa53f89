"""Faults of the simulated driver: a call that fails with an NVML error code, or is slow, on one
GPU or all, as the scenario says (`faults`) or as a test switches it on and off."""

from __future__ import annotations

import time
from collections.abc import Iterable

from otel_vgpu.gpu.backend import ErrorCode, GpuError
from otel_vgpu.sim.scenario import FaultSpec


class Faults:
    """The faults switched on by tests, with the scenario's own applied beside them."""

    def __init__(self) -> None:
        self._switched: list[FaultSpec] = []

    def switch(self, call: str, index: int, code: ErrorCode | str | None) -> None:
        """Make `call` fail on GPU `index` with `code` from now on, or succeed again with None."""
        self._switched = [f for f in self._switched if (f.call, f.gpu) != (call, index)]
        if code is not None:
            self._switched.append(FaultSpec(call=call, gpu=index, code=ErrorCode(code)))

    def check(self, call: str, index: int | None, t: float, scenario: Iterable[FaultSpec]) -> None:
        """`call` on GPU `index` at scenario time `t`: slowed by each fault active then, up to
        the first with an error code, which it raises (GpuError)."""
        for fault in (*self._switched, *scenario):
            if fault.active(call, index, t):
                if fault.delay_s > 0:
                    time.sleep(fault.delay_s)
                if fault.code is not None:
                    raise GpuError(fault.code, f"simulated {fault.code.value} (scenario fault)")
