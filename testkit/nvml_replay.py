"""A GPU backend that replays a simulated node's answers from memory, indexed by the clock.

The simulated node (otel_vgpu/sim/node.py) works out every answer from the scenario as it is
asked: on a node of 8 GPUs and 320 processes, more than half of a profile of the agent is the
simulator (`Workload.at`). To measure the agent's own cost (bench/agent_cost.py,
bench/flamegraph.py), `record` asks a simulated node ahead of time, on a clock moved by hand,
what the agent's readers ask (gpu/backend.py's protocol), and `Replay` serves those answers
back: each call returns what the node said at the last recorded tick at or before the clock's
present, for the price of an index. The node's proc tree is left on disk as it wrote it
(static files), so that the agent's proc reader, cgroup parser and attribution read real
files, their cost the agent's own.

The node's processes are steady (a scenario without churn or restarts): the proc tree is
written once, and the answers change only in what the processes use.
"""

from __future__ import annotations

import bisect
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from otel_vgpu.allocation.shares import Allocation, KubeletView, from_kubelet
from otel_vgpu.config import DEFAULT_RESOURCES, DRA_DRIVERS
from otel_vgpu.gpu.backend import (
    AccountingRecord,
    Device,
    GpuProcess,
    HealthReading,
    UtilizationSample,
    XidEvent,
)
from otel_vgpu.pods.directory import PodMeta, StaticDirectory
from otel_vgpu.sim import kubelet
from otel_vgpu.sim.node import SAMPLE_PERIOD_US, SAMPLES_KEPT, SimulatedNode
from otel_vgpu.sim.scenario import Scenario
from testkit.clock import Clock

# The GPU's own sample buffers hold SAMPLES_KEPT periods (10 s): asked a little more often than
# that, the recording holds every period of the run without a gap.
GPU_SAMPLES_EVERY_S = 8.0
RECORDING_FILE = "recording.pickle"


@dataclass(frozen=True, slots=True)
class Tick:
    """What the node answered for each GPU (by index) at one instant of the recording."""

    devices: tuple[Device, ...]
    processes: tuple[tuple[GpuProcess, ...], ...]
    memory_used: tuple[int, ...]
    energy: tuple[int | None, ...]
    samples: tuple[tuple[UtilizationSample, ...], ...]
    """Every PID's latest per-process sample the node kept (asked since 0)."""
    health: tuple[HealthReading, ...]
    gpm: tuple[dict[str, float] | None, ...]
    xids: tuple[tuple[XidEvent, ...], ...]


@dataclass(slots=True)
class Recording:
    """A simulated node's answers over a run, by tick, and what the kubelet and the API said."""

    start_s: float
    """The clock (seconds; the samples' clock is this in microseconds) at the first tick."""
    step_s: float
    ticks: list[Tick]
    gpu_samples: dict[tuple[int, str], list[tuple[int, float]]]
    """Each GPU's own samples of each figure, every period of the run, oldest first."""
    exclusive: tuple[bool | None, ...]
    view: KubeletView
    pods: dict[str, PodMeta]
    """The pods on the node now, as the allocation's rules take them (sim/kubelet.py `pods_at`)."""
    directory: dict[str, PodMeta]
    """The pods the Kubernetes API knows of."""
    proc_root: Path

    @property
    def end_s(self) -> float:
        return self.start_s + self.step_s * (len(self.ticks) - 1)

    def save(self, directory: Path) -> Path:
        path = directory / RECORDING_FILE
        path.write_bytes(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))
        return path


def load(directory: Path) -> Recording:
    """A recording `Recording.save` wrote in `directory` (beside the proc tree it names)."""
    recording = pickle.loads((directory / RECORDING_FILE).read_bytes())
    assert isinstance(recording, Recording)
    return recording


def record(
    scenario: Scenario, directory: Path, seconds: float, step_s: float = 1.0, start_s: float = 1_000.0
) -> Recording:
    """Ask a simulated node of `scenario` every `step_s` for `seconds` of its clock what the
    agent's readers ask; its proc tree is written under `directory`/proc and kept there."""
    clock = Clock(start_s)
    node = SimulatedNode(scenario, directory / "proc", clock.monotonic, clock.wall_us, host_pid_namespace=True)
    try:
        count = node.device_count()
        engines = {index: ("sm", *sorted(node.device(index).engines)) for index in range(count)}
        ticks: list[Tick] = []
        gpu_samples: dict[tuple[int, str], dict[int, float]] = {}
        steps = int(seconds / step_s) + 1
        for step in range(steps):
            clock.t = start_s + step * step_s
            ticks.append(_tick(node, count))
            # The GPU's buffers hold 10 s: read every 8 s, and at the end, they leave no gap.
            if step % int(GPU_SAMPLES_EVERY_S / step_s) == 0 or step == steps - 1:
                for index, figures in engines.items():
                    for figure in figures:
                        kept = gpu_samples.setdefault((index, figure), {})
                        kept.update(node.gpu_utilization_samples(index, 0, figure))
        t = node.now()
        return Recording(
            start_s=start_s,
            step_s=step_s,
            ticks=ticks,
            gpu_samples={key: sorted(kept.items()) for key, kept in gpu_samples.items()},
            exclusive=tuple(node.exclusive_process(index) for index in range(count)),
            view=kubelet.kubelet_view(scenario, t),
            pods=kubelet.pods_at(scenario, t),
            directory=dict(node.directory().pods()),
            proc_root=node.proc_root,
        )
    finally:
        node.close()  # the proc tree is the caller's (`directory`): kept


def _tick(node: SimulatedNode, count: int) -> Tick:
    """One instant's answers, in the order a sweep asks (listing first, which brings the node to now)."""
    gpus = range(count)
    processes = tuple(tuple(node.processes(index)) for index in gpus)
    return Tick(
        devices=tuple(node.device(index) for index in gpus),
        processes=processes,
        memory_used=tuple(node.memory_used(index) for index in gpus),
        energy=tuple(node.energy(index) for index in gpus),
        samples=tuple(tuple(node.utilization_samples(index, 0)) for index in gpus),
        health=tuple(node.health(index) for index in gpus),
        gpm=tuple(node.gpm(index) for index in gpus),
        xids=tuple(tuple(node.xid_events(index, 1_000_000)) for index in gpus),
    )


@dataclass
class Replay:
    """A GPU backend (gpu/backend.py), an allocation source and a pod directory that serve a
    recording's answers at the clock's present. `clock`: seconds, as the recording's (the
    samples' clock is it in microseconds); by default time.monotonic, looked up at each call
    so that a benchmark's simulated clock, patched in, moves it."""

    recording: Recording
    # Looked up at each call, not bound here: a benchmark patches time.monotonic after import.
    clock: Callable[[], float] = field(default=lambda: time.monotonic())  # noqa: PLW0108
    _xids_taken: dict[int, int] = field(default_factory=dict)
    """Each GPU's last tick whose XID events were served: each event is served once."""

    @property
    def proc_root(self) -> Path:
        return self.recording.proc_root

    def directory(self) -> StaticDirectory:
        return StaticDirectory(self.recording.directory)

    def allocation(self, gpus: Sequence[Device]) -> Allocation:
        """What the kubelet said, counted by the agent's own rules (as sim/kubelet.py does)."""
        return from_kubelet(self.recording.view, self.recording.pods, gpus, DEFAULT_RESOURCES, DRA_DRIVERS)

    def kubelet_view(self, t: float) -> KubeletView:
        return self.recording.view

    def _index(self) -> int:
        """The last tick at or before now (the first before the recording, the last after it)."""
        recording = self.recording
        step = int((self.clock() - recording.start_s) / recording.step_s + 1e-9)
        return min(max(step, 0), len(recording.ticks) - 1)

    def _tick(self) -> Tick:
        return self.recording.ticks[self._index()]

    # --- GpuBackend -----------------------------------------------------------

    def device_count(self) -> int:
        return len(self.recording.exclusive)

    def device(self, index: int) -> Device:
        return self._tick().devices[index]

    def energy(self, index: int) -> int | None:
        return self._tick().energy[index]

    def processes(self, index: int) -> list[GpuProcess]:
        return list(self._tick().processes[index])

    def memory_used(self, index: int) -> int:
        return self._tick().memory_used[index]

    def utilization_samples(self, index: int, since_us: int) -> list[UtilizationSample]:
        return [sample for sample in self._tick().samples[index] if sample.timestamp_us > since_us]

    def gpu_utilization_samples(self, index: int, since_us: int, figure: str = "sm") -> list[tuple[int, float]]:
        """The periods in the GPU's buffer (its last SAMPLES_KEPT) newer than `since_us`."""
        kept = self.recording.gpu_samples.get((index, figure), [])
        latest = self.now_us() // SAMPLE_PERIOD_US * SAMPLE_PERIOD_US
        oldest = max(since_us, latest - SAMPLES_KEPT * SAMPLE_PERIOD_US)
        first = bisect.bisect_right(kept, (oldest, float("inf")))
        last = bisect.bisect_right(kept, (latest, float("inf")))
        return kept[first:last]

    def exclusive_process(self, index: int) -> bool | None:
        return self.recording.exclusive[index]

    def accounting_pids(self, index: int) -> list[int] | None:
        return None  # accounting mode off, as on most nodes

    def accounting_stats(self, index: int, pid: int) -> AccountingRecord | None:
        return None

    def health(self, index: int) -> HealthReading:
        return self._tick().health[index]

    def gpm(self, index: int, gpu_instance: int | None = None) -> dict[str, float] | None:
        return self._tick().gpm[index]

    def xid_events(self, index: int, most: int) -> list[XidEvent]:
        now = self._index()
        taken = self._xids_taken.get(index, now)
        self._xids_taken[index] = now
        events = [event for tick in self.recording.ticks[taken + 1 : now + 1] for event in tick.xids[index]]
        return events[:most]

    def now_us(self) -> int:
        return int(self.clock() * 1_000_000)

    def release(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def close(self) -> None:
        pass
