"""The simulated GPUs' health, GPM figures and XID events, from the scenario and what the
processes run: what NVML would answer on a node, each figure in the unit the backend gives
it (gpu/device_figures.py).

- clocks, temperatures and power follow the SMs' use (an idle H200 read 345 MHz and 38 °C,
  busy ones run at 1,980 MHz), and throttling lowers the clocks and sets NVML's reason bits;
- the counters (PCIe replays, ECC errors, violation time) count the scenario's events since
  the driver loaded: a reload (`resume`) starts them from 0, as NVML's volatile counters; the
  remapped rows, kept in the GPU's InfoROM, stay;
- GPM figures are the means over the interval since the previous read, on the simulated
  driver's 200 ms grid: SM active is the SMs' use, tensor and DRAM what the processes keep
  busy (`tensor`, `dram` in the scenario);
- XID events are delivered once each, per GPU in the order they happen, at most what the agent
  asks a call, so a storm of a million is a long run of calls, as from that GPU's NVML event
  set, and no other GPU's events wait behind it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from otel_vgpu.gpu.backend import ErrorCode, GpuError, HealthReading, XidEvent
from otel_vgpu.gpu.device_figures import GPM_MIN_INTERVAL_S, HEALTH_TABLE, MIB
from otel_vgpu.sim.scenario import MODELS_WITHOUT, THROTTLE_REASONS, GpuSpec, HealthEventSpec, Scenario, of_models

# What an idle and a busy simulated GPU read (an H200's, issue #39 and nvidia-smi).
IDLE_SM_CLOCK_MHZ, BUSY_SM_CLOCK_MHZ, MEMORY_CLOCK_MHZ = 345.0, 1980.0, 3201.0
IDLE_CELSIUS, BUSY_CELSIUS_MORE, THROTTLED_CELSIUS_MORE, MEMORY_CELSIUS_MORE = 30.0, 45.0, 15.0, 4.0
# Clocks held down by heat or power run at this part of their busy speed.
THROTTLED_CLOCK_PART = 0.6
# NVML's bit for an idle GPU, and the reasons that mean heat or the power cap.
IDLE_BIT = 0x1
THERMAL_BITS = THROTTLE_REASONS["sw_thermal"] | THROTTLE_REASONS["hw_thermal"]
POWER_BITS = THROTTLE_REASONS["power_cap"] | THROTTLE_REASONS["power_brake"]
# PCIe traffic of a GPU that moves nothing to or from the host (an idle H200: 0.17 and 0.05 MiB/s).
IDLE_PCIE_TX, IDLE_PCIE_RX = 0.171 * MIB, 0.045 * MIB
# The SMs' warps resident, against their use, and the FP32 pipes' share of SM time without tensor work.
OCCUPANCY_PART, FP32_PART = 0.6, 0.5
GRID_S = 0.2
MOST_PERIODS = 300
# Moments whose processes' use is remembered (`_use`), by figure: a GPM window's, for each figure.
USES_KEPT = 8 * (MOST_PERIODS + 50)


class Running(Protocol):
    """A simulated process, as far as this module reads it."""

    @property
    def gpu(self) -> int: ...

    @property
    def mig(self) -> str | None: ...

    def wave(self, figure: str) -> Callable[[float], float]: ...


@dataclass(frozen=True, slots=True)
class Moment:
    """A simulated GPU at one instant, as its health figures are read from it."""

    index: int
    gpu: GpuSpec
    t: float
    reasons: int
    """NVML's clock event reasons now."""
    sm_clock_mhz: float
    celsius: float
    watts: float


Simulated = Callable[["SimulatedHealth", Moment], float | None]
"""A health figure's simulated value, in its published unit; None where NVML would give none."""


def _remapped(what: str, flag: bool = False) -> Simulated:
    """The rows remapped for `what` in the GPU's InfoROM, since ever (a reload keeps them); with
    `flag`, 1 where any was, else 0. NVML gives none on a GPU with MIG instances."""

    def value(health: SimulatedHealth, m: Moment) -> float | None:
        if m.gpu.migs:
            return None
        count = health.counted(m.index, "remap", m.t, what, since_load=False)
        return float(count > 0) if flag else float(count)

    return value


def _ecc(what: str) -> Simulated:
    """The volatile ECC errors of `what` kind since the driver loaded; none with ECC off."""
    return lambda health, m: float(health.counted(m.index, "ecc", m.t, what)) if m.gpu.ecc else None


SIMULATED: dict[str, Simulated] = {
    "sm.clock": lambda _, m: m.sm_clock_mhz * 1e6,
    "memory.clock": lambda _, m: MEMORY_CLOCK_MHZ * 1e6,
    "temperature": lambda _, m: m.celsius,
    "memory.temperature": lambda _, m: m.celsius + MEMORY_CELSIUS_MORE,
    "power": lambda _, m: m.watts,
    "power.limit": lambda _, m: m.gpu.power_limit_w,
    "pcie.replays": lambda health, m: float(health.counted(m.index, "pcie_replays", m.t)),
    "clock.event.reasons": lambda _, m: float(m.reasons),
    "power.violation": lambda health, m: health.held_s(m.index, POWER_BITS, m.t),
    "thermal.violation": lambda health, m: health.held_s(m.index, THROTTLE_REASONS["sw_thermal"], m.t),
    "ecc.corrected": _ecc("corrected"),
    "ecc.uncorrected": _ecc("uncorrected"),
    "remapped.rows.correctable": _remapped("correctable"),
    "remapped.rows.uncorrectable": _remapped("uncorrectable"),
    "remapped.rows.pending": _remapped("pending", flag=True),
    "remapped.rows.failure": _remapped("failure", flag=True),
}
"""The health figures of gpu/device_figures.py's `HEALTH_TABLE` that the scenario moves, by name:
each one's value on a simulated GPU (tests/unit/collect/test_device_health.py checks that each is the table's)."""


def _quiet(health: SimulatedHealth, m: Moment) -> float | None:
    """A figure no rule of `SIMULATED` moves: what a quiet GPU reads of it, 0 (no session open,
    nothing counted), so that a figure of the table is on the simulated node from its entry alone."""
    return 0.0


class SimulatedHealth:
    """Health, GPM and XID events for a simulated node's GPUs."""

    def __init__(
        self,
        scenario: Scenario,
        now: Callable[[], float],
        running: Callable[[float], Sequence[Running]],
        idle_watts: float,
        full_watts: float,
    ) -> None:
        """`now`: scenario time; `running(t)`: the processes running at `t`."""
        self._scenario = scenario
        self._now = now
        self._running = running
        self._uses: dict[tuple[str, float], dict[tuple[int, str | None], float]] = {}
        self._figures: set[str] = set()
        """The figures asked of moments so far (`_use`)."""
        self._uses_lock = threading.Lock()
        """The GPUs are read at once, as NVML allows (collect/gpm_reads.py, collect/device_health.py)."""
        self._idle_watts, self._full_watts = idle_watts, full_watts
        self._loaded_at = -math.inf
        """When the driver last loaded: its volatile counters count from there."""
        self._gpm_at: dict[tuple[int, int | None], float] = {}
        self._delivered: dict[int, int] = {}
        """By event: how many of its `count` XID events were delivered."""
        self._xids_of: dict[int, list[tuple[int, HealthEventSpec]]] = {}
        """By GPU, its XID events (numbered as in the scenario) in the order they happen."""
        for number, event in sorted(enumerate(scenario.health_events), key=lambda e: (e[1].at_s, e[0])):
            if event.kind == "xid":
                self._xids_of.setdefault(event.gpu, []).append((number, event))

    def reloaded(self) -> None:
        """The driver loaded again: volatile counters from 0, GPM samples gone."""
        self._loaded_at = self._now()
        self._gpm_at.clear()

    # --- health -------------------------------------------------------------------

    def health(self, index: int) -> HealthReading:
        """Each figure of the table its simulated value, but those the GPU does not report and
        those of an engine it has none of (`HealthFigure.engine`: by the scenario's `lacks`, or
        by its model, `MODELS_WITHOUT`: an A100 has no encoder), as the NVML backend leaves
        them out on a real GPU."""
        moment = self._moment(index)
        gpu = moment.gpu
        values = {
            figure.name: SIMULATED.get(figure.name, _quiet)(self, moment)
            for figure in HEALTH_TABLE
            if not figure.engine
            or (figure.engine in gpu.engines and not of_models(gpu.model, MODELS_WITHOUT.get(figure.engine, ())))
        }
        unsupported = moment.gpu.unsupported
        return HealthReading({n: v for n, v in values.items() if v is not None and n not in unsupported})

    def _moment(self, index: int) -> Moment:
        gpu = self._scenario.gpus[index]
        t = self._now()
        busy = self._use(index, None, "sm", t)
        reasons = self._reasons(index, t) | (IDLE_BIT if busy == 0 else 0)
        held = bool(reasons & (THERMAL_BITS | POWER_BITS))
        clock = IDLE_SM_CLOCK_MHZ if busy == 0 else BUSY_SM_CLOCK_MHZ * (THROTTLED_CLOCK_PART if held else 1.0)
        celsius = IDLE_CELSIUS + BUSY_CELSIUS_MORE * busy + (THROTTLED_CELSIUS_MORE if reasons & THERMAL_BITS else 0.0)
        watts = min(gpu.power_limit_w, self._idle_watts + (self._full_watts - self._idle_watts) * busy)
        return Moment(index, gpu, t, reasons, clock, celsius, watts)

    def _events(self, index: int, kind: str) -> list[HealthEventSpec]:
        return [e for e in self._scenario.health_events if e.gpu == index and e.kind == kind]

    def counted(self, index: int, kind: str, t: float, what: str = "", since_load: bool = True) -> int:
        """How many of GPU `index`'s `kind` events (of `what`) happened by `t`, since the driver
        loaded or, without `since_load`, since ever."""
        start = self._loaded_at if since_load else -math.inf
        return sum(e.count for e in self._events(index, kind) if start < e.at_s <= t and (not what or e.what == what))

    def _reasons(self, index: int, t: float) -> int:
        bits = 0
        for event in self._events(index, "throttle"):
            if event.at_s <= t < event.to_s:
                bits |= event.reasons
        return bits

    def held_s(self, index: int, bits: int, t: float) -> float:
        """Seconds the clocks were held down for `bits` since the driver loaded."""
        held = 0.0
        for event in self._events(index, "throttle"):
            if event.reasons & bits:
                start, end = max(event.at_s, self._loaded_at), min(event.to_s, t)
                held += max(0.0, end - start)
        return held

    # --- GPM ------------------------------------------------------------------------

    def gpm(self, gpu: GpuSpec, gpu_instance: int | None) -> dict[str, float] | None:
        if not gpu.gpm:
            return None
        t = self._now()
        key = (gpu.index, gpu_instance)
        last = self._gpm_at.get(key)
        if last is not None and t - last < GPM_MIN_INTERVAL_S:
            return None
        self._gpm_at[key] = t
        if last is None:
            return None
        mig = None
        if gpu_instance is not None:
            mig = next((m.uuid for m in gpu.migs if m.gpu_instance_id == gpu_instance), None)
            if mig is None:
                raise GpuError(ErrorCode.NOT_FOUND, f"simulated: GPU {gpu.index} has no GPU instance {gpu_instance}")
        periods = max(1, min(MOST_PERIODS, round((t - last) / GRID_S)))
        stamps = [t - (k + 0.5) * (t - last) / periods for k in range(periods)]

        def mean(figure: str) -> float:
            return sum(self._use(gpu.index, mig, figure, s) for s in stamps) / periods

        sm, tensor, dram = mean("sm"), mean("tensor"), mean("dram")
        graphics = sum(
            min(1.0, max(self._use(gpu.index, mig, "sm", s), self._use(gpu.index, mig, "dram", s))) for s in stamps
        )
        out = {
            "graphics.active": graphics / periods,
            "sm.active": sm,
            "sm.occupancy": OCCUPANCY_PART * sm,
            "tensor.active": tensor,
            "dram.active": dram,
            "fp64.active": 0.0,
            "fp32.active": FP32_PART * max(0.0, sm - tensor),
            "fp16.active": 0.0,
            "pcie.transmit": IDLE_PCIE_TX,
            "pcie.receive": IDLE_PCIE_RX,
        }
        if gpu.nvlink and gpu_instance is None:
            out |= {"nvlink.transmit": 0.0, "nvlink.receive": 0.0}
        return out

    def _use(self, index: int, mig: str | None, figure: str, t: float) -> float:
        """What the processes running at `t` on a GPU (or one of its MIG devices) use of `figure`,
        at most 1: at `t` to the GRID_S, for every GPU and device at once, since the GPUs ask
        for the same moments in turn."""
        at = round(t / GRID_S) * GRID_S
        with self._uses_lock:
            return min(1.0, self._uses_at(figure, at).get((index, mig), 0.0))

    def _uses_at(self, figure: str, at: float) -> dict[tuple[int, str | None], float]:
        """What the processes running at moment `at` use of `figure`, by GPU and MIG device."""
        uses = self._uses.get((figure, at))
        if uses is None:
            # One look at who ran then, for every figure asked of moments: GPM asks each of
            # its figures over the same moments in turn.
            self._figures.add(figure)
            running = self._running(at)
            for each in self._figures:
                summed: dict[tuple[int, str | None], float] = {}
                for p in running:
                    value = p.wave(each)(at)
                    for device in ((p.gpu, None), (p.gpu, p.mig)) if p.mig is not None else ((p.gpu, None),):
                        summed[device] = summed.get(device, 0.0) + value
                self._uses[each, at] = summed
            while len(self._uses) > USES_KEPT:
                del self._uses[next(iter(self._uses))]
            uses = self._uses[figure, at]
        return uses

    # --- XID events ---------------------------------------------------------------

    def xid_events(self, index: int, most: int) -> list[XidEvent]:
        """Up to `most` of GPU `index`'s events that have happened and not been delivered, in
        the order they happened (a storm's, each one of them at its `at_s`), as from the GPU's
        own event set: another GPU's events are never in its way."""
        t = self._now()
        out: list[XidEvent] = []
        uuid = self._scenario.gpus[index].uuid
        for number, event in self._xids_of.get(index, ()):
            if event.at_s > t or len(out) >= most:
                break
            if event.at_s <= self._loaded_at:
                continue  # before the driver loaded: no event set held it
            done = self._delivered.get(number, 0)
            take = min(event.count - done, most - len(out))
            out += [XidEvent(index, uuid, event.code)] * take
            self._delivered[number] = done + take
        return out
