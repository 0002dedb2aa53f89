"""GPM figures per GPU and, where exact, per pod, over GPM windows, carried from sweep to sweep.

GPM (Hopper and newer) measures a GPU, or a MIG GPU instance, not a process. The GPU's
figures are read when its window closes (collect/gpm_reads.py, every ENGINE_EVERY_S of otel_vgpu/config.py) and
published until the next close, with a busy-seconds counter for tensor and DRAM (each
figure times the window's seconds, as SM's busy seconds) and a byte counter for PCIe (each
byte rate times the window's seconds alike).

A pod gets a device's figures only where they are its own: in a window where it alone had
processes on that GPU (or MIG device) at every sweep and at every look of the process watch
between them (collect/ledger.py keeps every process that lived in a sweep's window), no
process outside every pod did, and its processes explain the GPU's own SM time over the
window: where more than `UNEXPLAINED_SLACK` of it went to no process (one that lived between
two looks of the watch, say), someone else may have run, and the window is shared.
SM time alone would not show it: a process with no SM samples can drive DRAM and PCIe
through the copy engines. In a window shared by several pods, their GPM families are left
out, never guessed, and the GPU's `shared_windows` counter says how often; a recording rule
(deploy/) splits the GPU's figures by SM-busy share for those who accept an estimate. Pure:
no NVML, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from otel_vgpu.collect.aggregate import GpuRow, PodKey, PodRow
from otel_vgpu.gpu.device_figures import GPM_BUSY, GPM_BYTES

Figures = Mapping[str, float]
OUTSIDE = "<outside>"
"""Stands for processes of no pod (or not known to be of one) in a window's set of users."""
# The part of a GPU's own SM-busy seconds over a window that may go to no process, and the
# window still be one pod's: the ledger's periods are cut at the watch's looks, which leaves a
# little unexplained at the edges of a process's life.
UNEXPLAINED_SLACK = 0.05


@dataclass(frozen=True, slots=True)
class Gpm:
    """The GPM figures and counters as of a sweep."""

    users: dict[str, frozenset[str]] = field(default_factory=dict)
    """By device (GPU UUID, or MIG device UUID): the pods (UIDs, or OUTSIDE) that had
    processes on it at a sweep of its open window, or between sweeps."""
    unexplained: dict[str, tuple[float, float]] = field(default_factory=dict)
    """By GPU UUID: its SM-busy seconds no process was given, and all of them, over its open window."""
    gpu_now: dict[str, Figures] = field(default_factory=dict)
    gpu_busy: dict[str, dict[str, float]] = field(default_factory=dict)
    gpu_bytes: dict[str, dict[str, float]] = field(default_factory=dict)
    """By GPU UUID, the bytes its byte-rate figures (`GpmFigure.io`) counted so far."""
    shared_windows: dict[str, int] = field(default_factory=dict)
    """By GPU UUID: the windows whose devices were shared, so no pod got their figures."""
    pod_now: dict[PodKey, Figures] = field(default_factory=dict)
    """The device's figures of the last closed window, for each row of the pod that had it alone."""


def step(gpm: Gpm, gpus: Sequence[GpuRow], pods: Sequence[PodRow], keys: Sequence[PodKey]) -> Gpm:
    """The GPM figures after a sweep that read `gpus` and `pods` (keyed by `keys`)."""
    on_device: dict[str, set[str]] = {}
    rows_on: dict[str, list[PodKey]] = {}
    for key, row in zip(keys, pods, strict=True):
        if row.ended:
            continue
        device = row.mig_uuid or row.gpu_uuid
        rows_on.setdefault(device, []).append(key)
        if row.processes > 0:
            on_device.setdefault(device, set()).add(row.pod_uid)
    after = Gpm()
    for gpu in gpus:
        uuid = gpu.uuid
        devices = [mig.uuid for mig in gpu.device.migs] or [uuid]
        if gpu.unattributed_memory is None or gpu.unattributed_memory > 0:
            # Processes of no pod on the GPU; under MIG, not known on which instance: all of them.
            for device in devices:
                on_device.setdefault(device, set()).add(OUTSIDE)
        if not gpu.device.migs:
            # Whoever lived on it between the sweeps too.
            on_device.setdefault(uuid, set()).update(user or OUTSIDE for user in gpu.users)
        users = {d: gpm.users.get(d, frozenset()) | on_device.get(d, set()) for d in devices}
        so_far, busy_so_far = gpm.unexplained.get(uuid, (0.0, 0.0))
        unexplained = (so_far + gpu.unexplained_seconds, busy_so_far + gpu.busy_seconds)
        window = gpu.device.gpm_window
        if window is None:
            after.users.update(users)
            after.unexplained[uuid] = unexplained
            _carry(gpm, after, uuid, [k for d in devices for k in rows_on.get(d, [])])
            continue
        if unexplained[0] > UNEXPLAINED_SLACK * unexplained[1]:
            users[uuid] = users[uuid] | {OUTSIDE}
        seconds = gpu.device.gpm_seconds
        after.gpu_now[uuid] = dict(window)
        after.gpu_busy[uuid] = _integrated(gpm.gpu_busy.get(uuid, {}), window, seconds, GPM_BUSY)
        after.gpu_bytes[uuid] = _integrated(gpm.gpu_bytes.get(uuid, {}), window, seconds, GPM_BYTES)
        shared = gpm.shared_windows.get(uuid, 0)
        for device in devices:
            figures = window if device == uuid else _instance_figures(gpu, device)
            who = users[device]
            alone = len(who) == 1 and OUTSIDE not in who
            if alone and figures is not None:
                (uid,) = who
                for key in rows_on.get(device, []):
                    if key[0] == uid:
                        after.pod_now[key] = dict(figures)
            elif len(who) >= 2:
                shared += 1
        after.shared_windows[uuid] = shared
    return after


def _integrated(
    so_far: Mapping[str, float], window: Figures, seconds: float, figures: Sequence[str]
) -> dict[str, float]:
    """The counters of `figures` with one more window: each figure times its seconds."""
    return {f: so_far.get(f, 0.0) + window.get(f, 0.0) * seconds for f in figures if f in window}


def _instance_figures(gpu: GpuRow, mig_uuid: str) -> Figures | None:
    """The GPM figures of the GPU instance that holds MIG device `mig_uuid`, if read."""
    instance = next((m.gpu_instance_id for m in gpu.device.migs if m.uuid == mig_uuid), None)
    return None if instance is None else gpu.device.gpm_instances.get(instance)


def _carry(before: Gpm, after: Gpm, uuid: str, keys: Sequence[PodKey]) -> None:
    """A GPU whose window stays open keeps its last closed window's figures and counters."""
    for table in ("gpu_now", "gpu_busy", "gpu_bytes", "shared_windows"):
        kept = getattr(before, table)
        if uuid in kept:
            getattr(after, table)[uuid] = kept[uuid]
    for key in keys:
        if key in before.pod_now:
            after.pod_now[key] = before.pod_now[key]
