"""What each pod has used so far: SM-busy seconds and peak memory, carried from sweep to sweep.

A gauge read at scrape time says "now"; chargeback needs "how much". Each
sweep adds, per (pod, GPU or MIG device[, container]), its SM share times the
seconds of the GPU's periods the ledger settled in that sweep (collect/ledger.py),
and per GPU the GPU's own busy seconds over the same periods, and its
unattributed ones by reason: so a GPU's pods plus its unattributed reasons equal
it at every sweep. Where the ledger has no window (no per-process figures), the
seconds since that GPU's previous sweep. Counters of busy seconds whose `rate()`
over any window is the mean SM use in it, whatever the scrape interval, since
they advance at the agent's sweep cadence (`--sweep-interval`). Pure functions
over plain data: no NVML, no clock.

- A gap longer than `max_gap_s` between two sweeps of a GPU (no sweeper and
  no scrape for a while, a driver that did not answer) counts as `max_gap_s`:
  the figures of one sweep are not stretched over minutes they did not see.
- A pod's counter is left out where its SM is unknown (MIG, MPS), as its
  gauges are; it resumes where it was when the figure comes back.
- A pod that ends keeps its counters' series, at their final values, until every
  reader (the scrape and the OTLP push) has collected them once: its last
  interval (what its ended processes' last samples say, where the driver keeps
  them: collect/aggregate.py), its part of the energy not yet split, and its
  engine window's figures are added first, and no gauge has a series for it. Without this, what a pod used after
  the last scrape that saw it would be in no series at all, neither its own nor
  the unattributed, and a tenant that restarts its pods often would keep part of
  its bill off every series. A pod that comes back while its series stays goes
  on from its value; one that comes back later starts from 0, as a restarted
  agent does: Prometheus' `rate()` and `increase()` read a drop as a counter reset.
- PIDs do not matter: the counters are keyed by pod and device.

Energy, per GPU, follows NVML's counter (millijoules since the driver loaded;
a value below the last one means a reload, and counts from 0). Each
interval's energy is split, so that the pods' and the unattributed add up to
the GPU's exactly:

- idle energy, the GPU's idle power times the interval (at most the whole),
  goes to the pods by the vGPU shares they hold (shares / ratio of the GPU),
  since a reserved share costs its part of an idle GPU; the shares nobody
  holds are unattributed. Idle power is configured (`--gpu-idle-watts`, for
  a node whose GPUs may never be seen idle), else learned: the lowest power
  seen over an interval in which the GPU was idle (utilization under 1 %);
  until one is seen, it is 0 and all the energy is active;
- active energy, the rest, goes by SM share: each pod's SM over the larger of
  the GPU's utilization and the pods' sum; what no pod ran is unattributed;
- where a pod's SM is unknown (an MPS client) it gets no energy, and its part is
  unattributed, while the pods beside it on the GPU keep theirs; where the GPU's is unknown
  (MIG) no pod gets energy: all of it is unattributed. The pods' energy families are left
  out where their SM ones are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from otel_vgpu.collect import engines as engine_windows
from otel_vgpu.collect.aggregate import GpuRow, PodKey, PodRow, pod_key
from otel_vgpu.collect.engines import Engines
from otel_vgpu.collect.gpm import Gpm
from otel_vgpu.collect.gpm import step as gpm_step
from otel_vgpu.gpu.backend import USE_FIGURES, ProcessUse

MAX_GAP_S = 10.0
# A GPU under this utilization over an interval is idle: its power then is its idle power.
IDLE_UTILIZATION = 0.01


@dataclass(frozen=True, slots=True)
class Usage:
    """The counters as of a sweep."""

    at: float | None = None
    """Monotonic time of that sweep; None before the first."""
    gpu_busy: dict[str, float] = field(default_factory=dict)
    """SM-busy seconds by GPU UUID."""
    gpu_unattributed: dict[str, dict[str, float]] = field(default_factory=dict)
    """By GPU UUID, the SM-busy seconds no pod was given, by reason (collect/ledger.py)."""
    pod_busy: dict[PodKey, float] = field(default_factory=dict)
    pod_peak: dict[PodKey, int] = field(default_factory=dict)
    energy_mj: dict[str, int] = field(default_factory=dict)
    """NVML's energy counter as last read, by GPU UUID."""
    idle_watts: dict[str, float] = field(default_factory=dict)
    gpu_joules: dict[str, float] = field(default_factory=dict)
    unattributed_joules: dict[str, float] = field(default_factory=dict)
    pod_joules: dict[PodKey, float] = field(default_factory=dict)
    pending: dict[str, Pending] = field(default_factory=dict)
    """By GPU UUID: the sweeps since its energy counter was last read."""
    engines: Engines = field(default_factory=Engines)
    """The other engines' figures and counters, over engine windows (collect/engines.py)."""
    gpm: Gpm = field(default_factory=Gpm)
    """GPM's figures and counters, over GPM windows (collect/gpm.py)."""
    last: dict[PodKey, PodRow] = field(default_factory=dict)
    """The rows of the pods with processes or an allocation, as of that sweep."""
    ended: dict[PodKey, Ended] = field(default_factory=dict)
    """The pods that have ended and whose series are kept until every reader has collected them."""


@dataclass(frozen=True, slots=True)
class Ended:
    """A pod that has ended on a device, its series kept."""

    row: PodRow
    """Its row, marked ended, with its counters as they stand."""
    final: int | None = None
    """The sweep from which nothing more is pending for it (its energy split, its engine
    window closed): its counters are final, and it goes once every reader has collected
    a sweep from then on. None while something is pending."""


@dataclass(frozen=True, slots=True)
class EnergySplit:
    """One interval's energy of a GPU, in joules: the pods' parts and what no pod holds."""

    total: float
    pods: dict[PodKey, float]
    unattributed: float


@dataclass(frozen=True, slots=True)
class Pending:
    """What a GPU's energy is split by, summed over the sweeps since its counter was last
    read (the counter is read less often than the sweeps run). Each weight is a figure
    times the seconds it held, so that splitting the energy of several sweeps at once
    gives what splitting each sweep's would have, had the power been steady."""

    seconds: float = 0.0
    unknown_seconds: float = 0.0
    """Seconds in which per-pod SM was unknown (MIG, MPS, no figure): their energy is unattributed."""
    busy: float = 0.0
    """The larger of the GPU's utilization and the pods' sum, times seconds."""
    peak_utilization: float = 0.0
    held: dict[PodKey, float] = field(default_factory=dict)
    """Each pod's part of the GPU's vGPUs (shares / the larger of the ratio and all shares held), times seconds."""
    ran: dict[PodKey, float] = field(default_factory=dict)
    """Each pod's SM share times seconds."""


def note_interval(
    pending: Pending, seconds: float, utilization: float | None, ratio: float, pods: Sequence[PodRow]
) -> Pending:
    """`pending` with one more interval of `seconds` of a GPU added."""
    if utilization is None:
        return dataclasses.replace(
            pending, seconds=pending.seconds + seconds, unknown_seconds=pending.unknown_seconds + seconds
        )
    held, ran = dict(pending.held), dict(pending.ran)
    total_shares = sum(row.shares for row in pods)
    for row in pods:
        if row.sm_utilization is None:
            continue  # its SM unknown (MPS): its part stays unattributed, its neighbours keep theirs
        key = pod_key(row)
        held[key] = held.get(key, 0.0) + (row.shares / max(ratio, total_shares) if total_shares > 0 else 0.0) * seconds
        ran[key] = ran.get(key, 0.0) + (row.sm_utilization or 0.0) * seconds
    pods_sum = sum(row.sm_utilization or 0.0 for row in pods)
    return Pending(
        seconds=pending.seconds + seconds,
        unknown_seconds=pending.unknown_seconds,
        busy=pending.busy + max(utilization, pods_sum) * seconds,
        peak_utilization=max(pending.peak_utilization, utilization),
        held=held,
        ran=ran,
    )


def split_pending(joules: float, idle_watts: float, pending: Pending) -> EnergySplit:
    """The `joules` a GPU drew over `pending`'s sweeps, split among the pods (module docstring)."""
    known = pending.seconds - pending.unknown_seconds
    if pending.seconds <= 0 or known <= 0:
        return EnergySplit(joules, {}, joules)
    mine = joules * known / pending.seconds
    idle = min(mine, max(0.0, idle_watts) * known)
    active = mine - idle
    parts = {}
    # In a fixed order: the parts are summed below, and a float sum in set order (which
    # follows the string hash, seeded per process) moved the last digit from run to run.
    for key in sorted(pending.held.keys() | pending.ran.keys()):
        idle_part = idle * pending.held.get(key, 0.0) / known
        active_part = active * pending.ran.get(key, 0.0) / pending.busy if pending.busy > 0 else 0.0
        parts[key] = idle_part + active_part
    # Never more than the whole, and the rest never below 0, whatever floating point does: the
    # unattributed counter is a counter, and OpenMetrics refuses a negative one.
    given = sum(parts.values())
    if given > joules:
        parts = {key: part * joules / given for key, part in parts.items()} if given > 0 else parts
        given = sum(parts.values())
    return EnergySplit(joules, parts, max(0.0, joules - given))


def accumulate(
    usage: Usage,
    gpus: Sequence[GpuRow],
    pods: Sequence[PodRow],
    now: float,
    max_gap_s: float = MAX_GAP_S,
    idle_watts: float | None = None,
    generation: int = 0,
    collected_through: int | None = None,
) -> tuple[Usage, tuple[GpuRow, ...], tuple[PodRow, ...]]:
    """The counters after a sweep at `now` that read `gpus` and `pods`, and those
    rows with their counters filled in (the pods with processes or an allocation;
    the ended ones are in the Usage's `ended`). `idle_watts`: every GPU's idle power
    as configured; None: learned. `generation`: this sweep's number;
    `collected_through`: the latest sweep every reader has collected (None: there is
    no reader), which releases the ended pods whose counters are final by then."""
    seconds = 0.0 if usage.at is None else min(max(0.0, now - usage.at), max_gap_s)
    pods = _with_ended(usage, pods)
    gpu_busy: dict[str, float] = {}
    # The seconds each GPU's pod figures stand for: the ledger's settled window where it has
    # one, so that the GPU's counter, its pods' and its unattributed reasons advance over the
    # same periods and add up at every sweep; else the time since the last sweep.
    span: dict[str, float] = {}
    for gpu in gpus:
        utilization = gpu.interval_utilization
        span[gpu.uuid] = seconds if gpu.window_seconds is None else gpu.window_seconds
        if gpu.window_seconds is not None:
            gpu_busy[gpu.uuid] = usage.gpu_busy.get(gpu.uuid, 0.0) + gpu.busy_seconds
        elif utilization is not None:
            gpu_busy[gpu.uuid] = usage.gpu_busy.get(gpu.uuid, 0.0) + utilization * seconds
        elif gpu.uuid in usage.gpu_busy:
            gpu_busy[gpu.uuid] = usage.gpu_busy[gpu.uuid]  # held while the figure is unknown
    gpu_unattributed = _unattributed(usage, gpus)
    pod_busy: dict[PodKey, float] = {}
    pod_peak: dict[PodKey, int] = {}
    keys = [pod_key(row) for row in pods]
    for key, row in zip(keys, pods, strict=True):
        pod_peak[key] = max(usage.pod_peak.get(key, 0), row.memory_used)
        busy_so_far = usage.pod_busy.get(key)
        if row.sm_utilization is not None:
            pod_busy[key] = (busy_so_far or 0.0) + row.sm_utilization * span.get(row.gpu_uuid, seconds)
        elif busy_so_far is not None:
            pod_busy[key] = busy_so_far  # held while the figure is unknown; not exported
    energy = _energy(usage, gpus, pods, seconds, idle_watts)
    engines = engine_windows.step(usage.engines, gpus, pods, keys, seconds)
    gpm = gpm_step(usage.gpm, gpus, pods, keys)
    # One replace per row: on a node of hundreds of pods, replace() was a quarter of a sweep.
    new_gpus = tuple(
        dataclasses.replace(
            gpu,
            sm_busy_seconds=gpu_busy.get(gpu.uuid) if gpu.interval_utilization is not None else None,
            sm_unattributed_seconds=gpu_unattributed.get(gpu.uuid, {}),
            energy_joules=energy.gpu_joules.get(gpu.uuid),
            energy_unattributed_joules=energy.unattributed_joules.get(gpu.uuid),
            engine_utilization=engines.gpu_now.get(gpu.uuid, {}),
            engine_busy_seconds=engines.gpu_busy.get(gpu.uuid, {}),
            gpm=gpm.gpu_now.get(gpu.uuid, {}),
            gpm_busy_seconds=gpm.gpu_busy.get(gpu.uuid, {}),
            gpm_bytes=gpm.gpu_bytes.get(gpu.uuid, {}),
            gpm_shared_windows=gpm.shared_windows.get(gpu.uuid),
        )
        for gpu in gpus
    )
    new_pods = tuple(
        dataclasses.replace(
            row,
            memory_peak=pod_peak[key],
            sm_busy_seconds=pod_busy.get(key) if row.sm_utilization is not None else None,
            energy_joules=energy.pod_joules.get(key),
            engine_utilization=engines.pod_now.get(key, {}) if row.use is not None else {},
            engine_busy_seconds=engines.pod_busy.get(key, {}) if row.use is not None else {},
            gpm=gpm.pod_now.get(key, {}),
        )
        for key, row in zip(keys, pods, strict=True)
    )
    counters = dataclasses.replace(
        energy,
        at=now,
        gpu_busy=gpu_busy,
        gpu_unattributed=gpu_unattributed,
        pod_busy=pod_busy,
        pod_peak=pod_peak,
        engines=engines,
        gpm=gpm,
    )
    live = tuple(row for row in new_pods if not row.ended)
    ended = _still_kept(usage, counters, new_pods, generation, collected_through)
    last = {pod_key(row): row for row in live}
    return _only(dataclasses.replace(counters, last=last, ended=ended), last.keys() | ended.keys()), new_gpus, live


def _unattributed(usage: Usage, gpus: Sequence[GpuRow]) -> dict[str, dict[str, float]]:
    """Each GPU's unattributed SM-busy seconds by reason, with this sweep's window added (a
    GPU gone from the sweep keeps its counts, as its other counters do)."""
    counted = dict(usage.gpu_unattributed)
    for gpu in gpus:
        if not gpu.unattributed_seconds:
            continue
        before = counted.get(gpu.uuid, {})
        counted[gpu.uuid] = {
            reason: before.get(reason, 0.0) + max(0.0, gpu.unattributed_seconds.get(reason, 0.0))
            for reason in before.keys() | gpu.unattributed_seconds.keys()
        }
    return counted


def _with_ended(usage: Usage, pods: Sequence[PodRow]) -> list[PodRow]:
    """`pods` with a row for each pod that has ended and is still kept: its last interval's
    row where the sweep has one (its ended processes' last samples), else one of no use,
    which adds nothing and carries its counters and whatever is pending for it."""
    live = [row for row in pods if not row.ended]
    keys = {pod_key(row) for row in live}
    last_interval = {pod_key(row): row for row in pods if row.ended}
    kept = {key: e.row for key, e in usage.ended.items() if key not in keys}
    for key, row in usage.last.items():
        if key not in keys and key not in kept and row.use is not None:
            # Just ended. Where its SM was unknown (MIG, MPS) it has no counter to keep.
            kept[key] = row
    for key, row in last_interval.items():
        if key not in keys and key not in kept:
            # A pod no sweep saw alive (its whole life between two sweeps, or processes that
            # come and go between them): what it ran is its bill all the same, and its series
            # is kept until every reader has collected it, as any ended pod's.
            kept[key] = row
    rows = list(live)
    for key, row in kept.items():
        now = last_interval.get(key)
        rows.append(
            dataclasses.replace(
                row,
                use=now.use if now is not None else ProcessUse(),
                shares=0.0,
                memory_used=0,
                memory_allocated=0,
                processes=0,
                vgpu_utilization=None,
                ended=True,
            )
        )
    return rows


def _still_kept(
    usage: Usage, counters: Usage, rows: Sequence[PodRow], generation: int, collected_through: int | None
) -> dict[PodKey, Ended]:
    """The ended pods to keep after this sweep: all but those whose counters were final by a
    sweep every reader has collected since (all whose counters are final, with no reader)."""
    kept = {}
    for row in rows:
        if not row.ended:
            continue
        key = pod_key(row)
        before = usage.ended.get(key)
        final = before.final if before is not None else None
        if row.use is not None and any(getattr(row.use, f) > 0 for f in USE_FIGURES):
            # Its processes' last periods settle after they end (collect/ledger.py): what
            # came in this sweep must be collected before its series goes.
            final = None
        if final is None and _settled(key, row.gpu_uuid, counters):
            final = generation
        if final is not None and (collected_through is None or collected_through >= final):
            continue
        kept[key] = Ended(row, final)
    return kept


def _only(counters: Usage, keys: set[PodKey]) -> Usage:
    """The counters of these pods only: an ended pod let go of is forgotten."""
    engines = counters.engines
    return dataclasses.replace(
        counters,
        pod_busy={k: v for k, v in counters.pod_busy.items() if k in keys},
        pod_peak={k: v for k, v in counters.pod_peak.items() if k in keys},
        pod_joules={k: v for k, v in counters.pod_joules.items() if k in keys},
        engines=dataclasses.replace(
            engines,
            pod_busy={k: v for k, v in engines.pod_busy.items() if k in keys},
            pod_now={k: v for k, v in engines.pod_now.items() if k in keys},
            pending={k: v for k, v in engines.pending.items() if k in keys},
        ),
        gpm=dataclasses.replace(counters.gpm, pod_now={k: v for k, v in counters.gpm.pod_now.items() if k in keys}),
    )


def _settled(key: PodKey, gpu_uuid: str, counters: Usage) -> bool:
    """Nothing is pending for the pod: its GPU's energy since the last read gives it no part,
    and its engine window holds nothing of it."""
    pending = counters.pending.get(gpu_uuid)
    energy = pending is None or (pending.held.get(key, 0.0) == 0.0 and pending.ran.get(key, 0.0) == 0.0)
    return energy and not any(counters.engines.pending.get(key, {}).values())


def _energy(
    usage: Usage, gpus: Sequence[GpuRow], pods: Sequence[PodRow], seconds: float, configured: float | None
) -> Usage:
    """The energy counters after an interval of `seconds` (a Usage with only them set)."""
    seen: dict[str, int] = {}
    idle_watts: dict[str, float] = {}
    gpu_joules: dict[str, float] = {}
    unattributed: dict[str, float] = {}
    pod_joules: dict[PodKey, float] = {}
    pending: dict[str, Pending] = {}
    on_gpu: dict[str, list[PodRow]] = {}
    for row in pods:
        on_gpu.setdefault(row.gpu_uuid, []).append(row)
    for gpu in gpus:
        last = usage.energy_mj.get(gpu.uuid)
        if gpu.device.energy_mj is None and not (gpu.device.energy_skipped and last is not None):
            continue  # no counter: no energy families
        mine = on_gpu.get(gpu.uuid, [])
        utilization = gpu.interval_utilization
        if any(row.mig_uuid is not None for row in mine):
            utilization = None  # MIG: no per-pod SM, all of it unattributed
            mine = [row for row in mine if row.mig_uuid is None]
        so_far = usage.pending.get(gpu.uuid, Pending()) if last is not None else Pending()
        interval = note_interval(so_far, seconds, utilization, gpu.vgpus, mine)
        watts = configured if configured is not None else usage.idle_watts.get(gpu.uuid)
        gpu_joules[gpu.uuid] = usage.gpu_joules.get(gpu.uuid, 0.0)
        unattributed[gpu.uuid] = usage.unattributed_joules.get(gpu.uuid, 0.0)
        for row in mine:
            key = pod_key(row)
            pod_joules[key] = usage.pod_joules.get(key, 0.0)
        if gpu.device.energy_mj is None:  # not read in this sweep: the interval waits for the next read
            seen[gpu.uuid] = last or 0
            pending[gpu.uuid] = interval
            if watts is not None:
                idle_watts[gpu.uuid] = watts
            continue
        seen[gpu.uuid] = gpu.device.energy_mj
        # Below the last reading: the driver reloaded, its counter started again from 0.
        joules = (
            0.0
            if last is None
            else (gpu.device.energy_mj - last if gpu.device.energy_mj >= last else gpu.device.energy_mj) / 1000
        )
        idle_throughout = interval.unknown_seconds == 0 and interval.peak_utilization < IDLE_UTILIZATION
        if configured is None and last is not None and interval.seconds > 0 and idle_throughout:
            drawn = joules / interval.seconds
            watts = drawn if watts is None else min(watts, drawn)
        if watts is not None:
            idle_watts[gpu.uuid] = watts
        split = split_pending(joules, watts or 0.0, interval)
        gpu_joules[gpu.uuid] += split.total
        unattributed[gpu.uuid] += split.unattributed
        for key, part in split.pods.items():
            if key in pod_joules:
                pod_joules[key] += part
            else:  # a pod that ended since the last read: no series is left to carry its part
                unattributed[gpu.uuid] += part
    return Usage(
        energy_mj=seen,
        idle_watts=idle_watts,
        gpu_joules=gpu_joules,
        unattributed_joules=unattributed,
        pod_joules=pod_joules,
        pending=pending,
    )
