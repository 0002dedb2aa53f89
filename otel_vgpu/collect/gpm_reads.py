"""Each GPU's GPM read in a sweep: every GPU at once, under one deadline.

GPM's figures are read when a GPU's GPM window closes (as long as an engine window: every
ENGINE_EVERY_S of otel_vgpu/config.py), and collect/gpm.py carries them from sweep to sweep.
A read takes a GPM sample (0.03 ms on an H200) and gives the figures since the last (2 ms for
every metric: bench/results/h200-health.md). But a driver can take seconds over a call, or
never answer, and the sweep holds the sampler's lock meanwhile: read in turn, 8 GPUs at 0.9 s a
call held every sweep that closed their windows 7.2 s, and the bills of the pods whose
processes came and went meanwhile with it. So, once every GPU of the sweep is read
(collect/sampler.py):

- each GPU whose window closes has its read begun on a thread of its own (collect/deadline.py),
  all of them at once, then each is waited for until `deadline_s` after it began: however
  many GPUs are slow, the sweep waits one deadline at most;
- a GPU whose read is late loses this window's figures (`gpm`, kind `<index>:DEADLINE`), and is
  not asked again until that read returns; its window opens anew once it answers;
- the `gpm` reader's pass is as long as its slowest GPU's read, at most the deadline, and
  fails where any GPU's read failed or was late.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from otel_vgpu.agent_health import Stage
from otel_vgpu.collect.aggregate import GpuReading
from otel_vgpu.collect.deadline import CallThread
from otel_vgpu.gpu.backend import Device, GpuBackend, GpuError

if TYPE_CHECKING:  # reading.py makes a GpmReads: imported for its type alone
    from otel_vgpu.collect.reading import SweepErrors

# How long a sweep waits for a GPU's GPM read (2 ms on an H200: bench/results/h200-health.md)
# before it goes on without that GPU's GPM figures for the window. Every GPU's read runs at
# once, so however many are slow, a sweep waits this long at most once.
GPM_DEADLINE_S = 1.0


@dataclass(frozen=True, slots=True)
class _Asked:
    """A GPU's GPM read begun in a sweep: the window it closes (opened then, closed `now`, on
    the reader's clock), and the thread it runs on, since `at` (time.monotonic)."""

    index: int
    opened: float | None
    now: float
    caller: CallThread
    at: float


class GpmReads:
    """Each GPU's GPM windows and the threads its reads run on, kept from sweep to sweep."""

    def __init__(
        self,
        backend: GpuBackend,
        clock: Callable[[], float],
        close_after_s: float,
        deadline_s: float = GPM_DEADLINE_S,
    ) -> None:
        """`close_after_s`: how long after it opened a GPU's window closes, at the first sweep
        past it; `clock`: what windows are timed by."""
        self._backend = backend
        self._clock = clock
        self._close_after_s = close_after_s
        self._deadline_s = deadline_s
        self._opened: dict[str, float] = {}
        """When each GPU's GPM window opened, by UUID."""
        self._callers: dict[int, CallThread] = {}
        """Each GPU's thread for its GPM reads, by index."""
        self._slowest: float | None = None

    def keep_only(self, gpu_uuids: set[str]) -> None:
        """Forget the GPUs that are gone (their windows restart if they come back)."""
        self._opened = {uuid: at for uuid, at in self._opened.items() if uuid in gpu_uuids}

    def read(self, readings: Sequence[GpuReading], errors: SweepErrors) -> list[GpuReading]:
        """The readings with the GPM figures of each GPU whose window closes in this sweep, and
        each MIG GPU instance's: every read begun, then each waited for (the docstring above)."""
        asked = {r.device.uuid: ask for r in readings if (ask := self._begin(r.device, errors)) is not None}
        return [
            dataclasses.replace(r, device=self._with_figures(r.device, asked[r.device.uuid], errors))
            if r.device.uuid in asked
            else r
            for r in readings
        ]

    def take_seconds(self) -> float | None:
        """How long the slowest GPM read since the last call took, of those that closed a window
        or failed (at most the deadline); None where there were none. Taken once a sweep: the
        `gpm` reader's pass."""
        seconds, self._slowest = self._slowest, None
        return seconds

    def _begin(self, device: Device, errors: SweepErrors) -> _Asked | None:
        """The GPU's read begun on its thread, if its window closes in this sweep. A GPU
        without GPM answers None, and is not asked again by the backend."""
        index = device.index
        opened = self._opened.get(device.uuid)
        now = self._clock()
        if opened is not None and now - opened < self._close_after_s:
            return None
        instances = [m.gpu_instance_id for m in device.migs if m.gpu_instance_id is not None]

        def read() -> tuple[dict[str, float] | None, dict[int, dict[str, float] | None]]:
            return self._backend.gpm(index), {gi: self._backend.gpm(index, gi) for gi in instances}

        caller = self._callers.get(index)
        if caller is None:
            caller = self._callers[index] = CallThread(f"gpu{index}-gpm")
        if not caller.start(read):
            self._late(device, errors, 0.0)  # its last read is still hung in the driver
            return None
        return _Asked(index, opened, now, caller, time.monotonic())

    def _with_figures(self, device: Device, asked: _Asked, errors: SweepErrors) -> Device:
        """The device with the figures of the window `asked`'s read closes, if it answered
        within the deadline and closed one."""
        if not asked.caller.wait(max(0.0, asked.at + self._deadline_s - time.monotonic())):
            # A GPM call hung in the driver costs this GPU's GPM figures, never the sweep.
            self._late(device, errors, time.monotonic() - asked.at)
            return device
        try:
            figures, by_instance = asked.caller.result()
        except GpuError as error:
            self._took(asked.caller.took)
            errors.add(Stage.GPM, f"{device.index}:{error.code.value}", f"GPU {device.index}: GPM: {error}")
            self._opened.pop(device.uuid, None)
            return device
        if figures is not None:
            # Timed where it closed a window, or failed: a read that answers None (the first,
            # which opens the window, or a GPU without GPM) closes none, and a node without GPM
            # has no gpm reader.
            self._took(asked.caller.took)
        self._opened[device.uuid] = asked.now
        if asked.opened is None or figures is None:
            return device  # the window opens
        return dataclasses.replace(
            device,
            gpm_window=figures,
            gpm_seconds=asked.now - asked.opened,
            gpm_instances={gi: f for gi, f in by_instance.items() if f is not None},
        )

    def _late(self, device: Device, errors: SweepErrors, waited: float) -> None:
        """The GPU's read did not answer in time: no figures for this window, which opens anew
        once it answers."""
        self._took(waited)
        errors.add(
            Stage.GPM,
            f"{device.index}:DEADLINE",
            f"GPU {device.index}: GPM: no answer from the driver in {self._deadline_s:g} s",
        )
        self._opened.pop(device.uuid, None)

    def _took(self, seconds: float) -> None:
        self._slowest = max(self._slowest or 0.0, seconds)
