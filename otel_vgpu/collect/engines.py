"""What each pod used of its GPU's other engines — memory copy, the video encoders and
decoders, JPEG, optical flow — over engine windows, carried from sweep to sweep.

SM is read per sweep, fitted under the GPU's own samples of the same window. The other
engines are fitted the same way, but the GPU's own samples of them are read only when a
GPU's engine window closes (every ENGINE_EVERY_S, otel_vgpu/config.py: each buffer read
costs as much as the rest of a sweep). Until then each sweep adds, per pod, its
per-process figures times the sweep's seconds. When the window closes:

- a pod's figure is its mean over the window: what it added over the window's seconds;
- the pods are scaled, in proportion, to be no more than the GPU's own figure over the
  same window (`Device.engine_window`), by SM's rule (gpu/sampling.py `fit_scale`);
- each busy-seconds counter advances by its figure times the window's seconds, so that
  `rate()` over any range is the mean use there, whatever the scrape interval;
- the gauges hold these figures until the next window closes.

A pod whose per-process figures are unknown (MIG, MPS) gets none, and its counters are
held, not exported, as its SM ones are; a pod seen anew starts from 0; an engine the GPU
does not have (`Device.engines`) has no figure at all. The pods of a GPU get an engine's
figures only once the engine has been used there, by the GPU's figure or a pod's, since
the agent started: on a GPU of LLM servers nobody decodes video, and four engines' gauges
and counters at 0 for every pod would double its series for nothing (the GPU's own
figure, one series, says 0). Pure: no NVML, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from otel_vgpu.collect.aggregate import GpuRow, PodKey, PodRow
from otel_vgpu.gpu.sampling import fit_scale

Figures = Mapping[str, float]
"""An engine's figure by engine name (`ENGINES`)."""
_NONE: dict[str, float] = {}


@dataclass(frozen=True, slots=True)
class Engines:
    """The engine figures and counters as of a sweep."""

    open_seconds: dict[str, float] = field(default_factory=dict)
    """By GPU UUID: the seconds of its open window so far."""
    pending: dict[PodKey, dict[str, float]] = field(default_factory=dict)
    """Each pod's figures times seconds in its GPU's open window."""
    pod_now: dict[PodKey, Figures] = field(default_factory=dict)
    """Each pod's figures over its GPU's last closed window, fitted."""
    pod_busy: dict[PodKey, Figures] = field(default_factory=dict)
    gpu_now: dict[str, Figures] = field(default_factory=dict)
    gpu_busy: dict[str, Figures] = field(default_factory=dict)
    used: dict[str, frozenset[str]] = field(default_factory=dict)
    """By GPU UUID: the engines used there since the agent started, which its pods get figures of."""


def fitted(pods: Mapping[PodKey, Figures], gpu: Figures) -> dict[PodKey, dict[str, float]]:
    """The pods' figures, each engine scaled so that together they are no more than the GPU's."""
    scale = {
        engine: fit_scale(sum(figures.get(engine, 0.0) for figures in pods.values()), limit)
        for engine, limit in gpu.items()
    }
    return {key: {e: v * scale.get(e, 1.0) for e, v in figures.items()} for key, figures in pods.items()}


def step(
    engines: Engines, gpus: Sequence[GpuRow], pods: Sequence[PodRow], keys: Sequence[PodKey], seconds: float
) -> Engines:
    """The engine figures after a sweep of `seconds` that read `gpus` and `pods` (keyed by `keys`)."""
    known: dict[str, list[tuple[PodKey, PodRow]]] = {}
    for key, row in zip(keys, pods, strict=True):
        if row.use is not None and row.mig_uuid is None:
            known.setdefault(row.gpu_uuid, []).append((key, row))
    after = Engines()
    for gpu in gpus:
        names = gpu.device.engines
        if not names or gpu.device.mig_mode:
            continue
        uuid = gpu.uuid
        window_seconds = engines.open_seconds.get(uuid, 0.0) + seconds
        pending: dict[PodKey, dict[str, float]] = {}
        for key, row in known.get(uuid, ()):
            so_far = engines.pending.get(key, _NONE)
            use = row.use
            assert use is not None
            # Only what the pod used: most pods use no engine beside SM, and a node has hundreds.
            added = {e: value * seconds for e in names if (value := getattr(use, e)) > 0}
            pending[key] = (
                {e: so_far.get(e, 0.0) + added.get(e, 0.0) for e in so_far.keys() | added} if added else so_far
            )
        closed = gpu.device.engine_window
        if closed is None or window_seconds <= 0:
            after.open_seconds[uuid] = window_seconds
            after.pending.update(pending)
            _carry(engines, after, uuid, [key for key, _ in known.get(uuid, ())])
            continue
        means = {key: {e: total / window_seconds for e, total in figures.items()} for key, figures in pending.items()}
        now = fitted(means, closed)
        used = after.used[uuid] = engines.used.get(uuid, frozenset()) | {
            e for figures in (closed, *means.values()) for e, value in figures.items() if value > 0
        }
        after.open_seconds[uuid] = 0.0
        after.gpu_now[uuid] = dict(closed)
        after.gpu_busy[uuid] = _added(engines.gpu_busy.get(uuid, {}), closed, window_seconds)
        for key, figures in now.items():
            mine = {e: figures.get(e, 0.0) for e in used}
            after.pod_now[key] = mine
            after.pod_busy[key] = _added(engines.pod_busy.get(key, {}), mine, window_seconds)
    # Pods whose figures are unknown this sweep keep their counters, unexported; pods gone are dropped.
    for key, row in zip(keys, pods, strict=True):
        if row.use is None and key in engines.pod_busy:
            after.pod_busy[key] = engines.pod_busy[key]
    return after


def _carry(before: Engines, after: Engines, uuid: str, keys: Sequence[PodKey]) -> None:
    """A GPU whose window stays open keeps its last closed window's figures and counters."""
    if uuid in before.used:
        after.used[uuid] = before.used[uuid]
    if uuid in before.gpu_now:
        after.gpu_now[uuid] = before.gpu_now[uuid]
        after.gpu_busy[uuid] = before.gpu_busy[uuid]
    for key in keys:
        if key in before.pod_now:
            after.pod_now[key] = before.pod_now[key]
        if key in before.pod_busy:
            after.pod_busy[key] = before.pod_busy[key]


def _added(counters: Figures, figures: Figures, seconds: float) -> dict[str, float]:
    return {e: counters.get(e, 0.0) + figures.get(e, 0.0) * seconds for e in counters.keys() | figures.keys()}
