"""One collection's readings, aggregated per GPU and per (pod, GPU).

Pure functions over plain data: no NVML, no files, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from otel_vgpu.allocation.ratio import Ratios
from otel_vgpu.allocation.shares import Allocation, Grant
from otel_vgpu.collect.lost_gpus import GpuIdentity
from otel_vgpu.gpu.backend import Device, GpuProcess, MigDevice, ProcessUse
from otel_vgpu.gpu.pidns import BlindGpu
from otel_vgpu.pods.cgroups import PodRef
from otel_vgpu.pods.directory import PodMeta


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What one GPU gave in a sweep. None marks a call that failed or,
    for `use_by_pid`, figures NVML cannot give per process (MIG, MPS)."""

    device: Device
    processes: Sequence[GpuProcess] | None
    use_by_pid: Mapping[int, ProcessUse] | None
    """Each process's use over the window; a process absent from it was idle."""
    mps_servers: int = 0
    """MPS server processes on the GPU: its clients' SM samples go to them."""
    unknown_pids: frozenset[int] = frozenset()
    """Processes whose use NVML cannot tell (MPS clients, and their servers, whose samples are
    the clients' work: collect/trust.py): their pods' use on the GPU is unknown."""
    earlier_use: Mapping[PodRef, ProcessUse] = field(default_factory=dict)
    """By pod, what its processes that have ended used over the window (collect/ledger.py):
    those the watch saw between sweeps too, however short they lived."""
    users: frozenset[str] = frozenset()
    """The pods (UIDs) whose processes lived on the GPU over the window, "" for any of no pod."""
    busy_seconds: float = 0.0
    """The GPU's own SM-busy seconds over the window, where the ledger split them."""
    unexplained_seconds: float = 0.0
    """SM-busy seconds of the GPU over the window that no process was given."""
    unattributed_seconds: Mapping[str, float] = field(default_factory=dict)
    """SM-busy seconds of the GPU over the window that no pod was given, by reason (collect/ledger.py)."""
    window_seconds: float | None = None
    """How long the window the ledger settled is (0: none settled yet); None: no ledger window."""
    window_utilization: float | None = None
    """The GPU's own figure over the ledger's last window that settled a period, which its pods'
    figures cover; None before one did."""
    reused_pids: frozenset[int] = frozenset()
    """PIDs listed whose samples were older than the process holding them: not theirs."""


@dataclass(frozen=True, slots=True)
class GpuRow:
    device: Device
    """The GPU as read in the sweep (its memory, its own utilization, its energy counter)."""
    vgpus: float
    unattributed_memory: int | None
    """None when the GPU's processes could not be listed."""
    unlisted_memory: int | None = None
    """Bytes of its used that no process listing holds (`_unlisted`); None where that is unknown."""
    mps_servers: int = 0
    sm_busy_seconds: float | None = None
    """SM-busy seconds counted so far (collect/usage.py); None where the SM figure is unknown."""
    energy_joules: float | None = None
    """Joules counted so far (collect/usage.py); None where the GPU has no energy counter."""
    energy_unattributed_joules: float | None = None
    """The part of them no pod was given."""
    engine_utilization: Mapping[str, float] = field(default_factory=dict)
    """The GPU's own figure of each of its engines over its last closed engine window
    (collect/engines.py); an engine it lacks, or before a window closed, has none."""
    engine_busy_seconds: Mapping[str, float] = field(default_factory=dict)
    """Each engine's busy seconds counted so far."""
    gpm: Mapping[str, float] = field(default_factory=dict)
    """Its GPM figures over its last closed GPM window (collect/gpm.py); none before one closed,
    or without GPM."""
    gpm_busy_seconds: Mapping[str, float] = field(default_factory=dict)
    """Tensor and DRAM busy seconds counted so far, from GPM."""
    gpm_bytes: Mapping[str, float] = field(default_factory=dict)
    """PCIe bytes each way counted so far, from GPM's byte rates (collect/gpm.py)."""
    gpm_shared_windows: int | None = None
    """GPM windows in which several pods (or a process of none) used one of its devices, so
    that no pod got its figures; None without GPM."""
    users: frozenset[str] = frozenset()
    """The pods (UIDs) whose processes lived on it over the sweep's window, as the process watch
    and the sweeps saw them (collect/ledger.py); "" for any of no pod."""
    busy_seconds: float = 0.0
    """Its own SM-busy seconds over the sweep's window, where the ledger split them."""
    unexplained_seconds: float = 0.0
    """The part of `busy_seconds` no process was given."""
    unattributed_seconds: Mapping[str, float] = field(default_factory=dict)
    """Over the sweep's window, the SM-busy seconds no pod was given, by reason (collect/ledger.py)."""
    window_seconds: float | None = None
    """How long the ledger's window is (its settled periods together); None: no ledger window,
    and the pods' figures stand for the time since the last sweep."""
    window_utilization: float | None = None
    """The GPU's own figure over the ledger's last window that settled a period (the one its
    pods' figures cover); None without one."""
    sm_unattributed_seconds: Mapping[str, float] = field(default_factory=dict)
    """The same, counted so far (collect/usage.py); empty where the ledger has not split its SM."""

    @property
    def index(self) -> int:
        return self.device.index

    @property
    def uuid(self) -> str:
        return self.device.uuid

    @property
    def interval_utilization(self) -> float | None:
        """The GPU's SM figure over the window its pods' figures cover: the ledger's settled
        periods where it split them; else the mean of its own samples since the previous
        sweep where NVML gave them; else its last period's figure, which a sweep every few
        seconds samples, not averages. None where NVML cannot tell (MIG mode)."""
        if self.window_utilization is not None:
            return min(1.0, self.window_utilization)
        window = self.device.utilization_window
        return window if window is not None else self.device.utilization


@dataclass(frozen=True, slots=True)
class PodRow:
    namespace: str
    """Empty when the pod's name is not known."""
    pod: str
    """The pod's name, or its UID when the name is not known."""
    pod_uid: str
    """The pod's UID in the API (a static pod's mirror's), else the one its cgroups carry."""
    container: str | None
    """The container's name (else its ID) with --by-container; None otherwise."""
    gpu_index: int
    gpu_uuid: str
    shares: float
    memory_used: int
    memory_allocated: int
    use: ProcessUse | None
    """What its processes used of the GPU over the window, each figure 0-1; None where NVML
    cannot tell per process (MIG, MPS, a GPU that does not report it)."""
    vgpu_utilization: float | None
    """SM use relative to the compute the pod was given: 1 = exactly its share."""
    processes: int
    mig_uuid: str | None = None
    """The MIG device the row is about; None for a whole GPU."""
    mig_profile: str | None = None
    sm_busy_seconds: float | None = None
    """SM-busy seconds counted so far (collect/usage.py); None where per-pod SM is unknown."""
    memory_peak: int = 0
    """The most memory its processes held at once, at sweep cadence, since the agent first saw the row."""
    energy_joules: float | None = None
    """The pod's part of its GPU's energy so far (collect/usage.py); None where it has none."""
    engine_utilization: Mapping[str, float] = field(default_factory=dict)
    """Each engine's figure over its GPU's last closed engine window, fitted under the GPU's
    (collect/engines.py); none where per-process figures are unknown or the GPU lacks the engine."""
    engine_busy_seconds: Mapping[str, float] = field(default_factory=dict)
    """Each engine's busy seconds counted so far."""
    gpm: Mapping[str, float] = field(default_factory=dict)
    """Its device's GPM figures over the last closed GPM window, where the pod had that GPU (or
    MIG device) alone over it (collect/gpm.py); none otherwise."""
    ended: bool = False
    """Its pod has no process on the device any more: the row carries what its ended processes'
    last samples say of the last interval, then its counters' final values (collect/usage.py),
    and no gauge has a series for it."""
    settled: bool = True
    """A period of its GPU has settled since the GPU's ledger began (collect/ledger.py): before
    one has, what its processes ran is not known yet, its counters stay at 0 and its SM gauges
    have no series (`sm_shown`), where they would read 0 beside a GPU that reads busy."""

    @property
    def sm_utilization(self) -> float | None:
        """Share of the physical GPU's SMs, 0-1; None when NVML could not tell."""
        return None if self.use is None else self.use.sm

    @property
    def sm_shown(self) -> float | None:
        """`sm_utilization` as the gauges show it: None too until a period has settled."""
        return self.sm_utilization if self.settled else None


PodKey = tuple[str, str, str, str]
"""(pod UID, container or "", GPU UUID, MIG UUID or ""): what the counters carried from sweep to sweep are keyed by."""


def pod_key(row: PodRow) -> PodKey:
    return (row.pod_uid, row.container or "", row.gpu_uuid, row.mig_uuid or "")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The result of one sweep."""

    taken_at: float
    """Monotonic time the sweep finished."""
    ok: bool
    """False when the sweep failed as a whole (no GPU could be enumerated)."""
    gpus: tuple[GpuRow, ...] = ()
    pods: tuple[PodRow, ...] = ()
    """The pods with processes or an allocation on a device."""
    ended: tuple[PodRow, ...] = ()
    """Pods that have ended, with their counters' final values, until every reader has
    collected them (collect/usage.py): their last increments are in some series."""
    generation: int = 0
    """Which sweep it is (the sampler counts them), so that readers can say what they collected."""
    errors: tuple[tuple[str, str], ...] = field(default=())
    """(stage, message) of every failure in the sweep."""
    blind: tuple[BlindGpu, ...] = ()
    """GPUs in use whose processes the driver hides from the agent (no hostPID)."""
    paused: str | None = None
    """Why NVML is released (the node label of a driver upgrade), or None."""
    lost: tuple[GpuIdentity, ...] = ()
    """GPUs an earlier sweep read and this one could not (collect/lost_gpus.py), under the
    identity they last had; none while the driver is paused."""


@dataclass(slots=True)
class _Row:
    namespace: str
    pod: str
    pod_uid: str
    container: str
    memory_used: int = 0
    use: ProcessUse = field(default_factory=ProcessUse)
    use_unknown: bool = False
    """One of its processes' use NVML cannot tell (an MPS client): the row's is unknown."""
    processes: int = 0
    keys: set[tuple[str, str]] = field(default_factory=set)
    """(pod UID, container label) behind this row: the keys of its grants."""


@dataclass(frozen=True, slots=True)
class _Unit:
    """What a pod can be given: a whole GPU, or a MIG device of one."""

    uuid: str
    memory_total: int
    mig: MigDevice | None


def _units(device: Device) -> tuple[_Unit, ...]:
    if device.migs:
        return tuple(_Unit(mig.uuid, mig.memory_total, mig) for mig in device.migs)
    return (_Unit(device.uuid, device.memory_total, None),)


def aggregate(
    readings: Sequence[GpuReading],
    pods_by_pid: Mapping[int, PodRef | None],
    lookup: Callable[[str], PodMeta | None],
    allocation: Allocation,
    ratios: Ratios,
    by_container: bool = False,
) -> tuple[tuple[GpuRow, ...], tuple[PodRow, ...]]:
    """Per-GPU rows, and per-(pod, device) rows (per (pod, container, device)
    with `by_container`), where a device is a whole GPU or a MIG device.

    - A PID missing from `pods_by_pid`, or mapped to None, is unattributed.
    - Grants on a device: those placed there; else the pod's unplaced shares
      spread evenly over the devices it runs processes on; else none for a
      pod whose grants are all known (`allocation.answered`: the kubelet
      listed it), which then uses the device without an allocation; else,
      its allocation unknown, one share.
      A pod with a grant and no process on a device is an idle allocation
      (memory 0, SM 0).
    - Allocated memory: what the allocator stated, else shares x the
      device's memory / its ratio. Compute given: stated, else shares / ratio.
    - Rows are per pod UID: a StatefulSet pod and its terminating predecessor
      share a name and are told apart by `pod_uid`.
    - What processes that have ended ran over the window (`earlier_use`: those no longer
      listed, however short they lived) is their pods': added to the pod's row, or to a row
      marked `ended` where the pod has no process left on the device.
    """
    labeller = _Labeller(lookup, by_container)
    placed: dict[str, dict[tuple[str, str], Grant]] = {}
    for (pod_uid, container, device_uuid), grant in allocation.placed.items():
        if grant.shares > 0 or grant.memory:
            key = (pod_uid, container if by_container else "")
            per_device = placed.setdefault(device_uuid, {})
            per_device[key] = grant if key not in per_device else per_device[key].plus(grant)
    unplaced: dict[tuple[str, str], float] = {}
    for (pod_uid, container), count in allocation.unplaced.items():
        key = (pod_uid, container if by_container else "")
        unplaced[key] = unplaced.get(key, 0.0) + count
    # Unplaced shares are spread over the devices each pod runs processes on.
    running_on: dict[tuple[str, str], int] = {}
    for reading in readings:
        on = {
            (labeller.key(ref), p.mig_uuid)
            for p in reading.processes or ()
            if (ref := pods_by_pid.get(p.pid)) is not None
        }
        for key, _ in on:
            running_on[key] = running_on.get(key, 0) + 1

    gpu_rows: list[GpuRow] = []
    pod_rows: list[PodRow] = []
    for reading in readings:
        device = reading.device
        unattributed: int | None = None
        if reading.processes is not None:
            unattributed = 0
            # Until the GPU's ledger has settled a period, no pod's use of it is known yet.
            settled = reading.window_seconds is None or reading.window_utilization is not None
            for unit in _units(device):
                mine = [p for p in reading.processes if (p.mig_uuid or device.uuid) == unit.uuid]
                placed_here = placed.get(unit.uuid, {})
                rows, lost = _unit_rows(reading, mine, pods_by_pid, labeller, placed_here)
                unattributed += lost
                if unit.mig is None and reading.earlier_use:
                    pod_rows.extend(_ended_rows(reading, labeller, rows, by_container))
                ratio = ratios.of(unit.uuid)
                for row in rows.values():
                    grant = _grant(row.keys, placed_here, unplaced, running_on, allocation.answered)
                    use = None if reading.use_by_pid is None or row.use_unknown else row.use.capped()
                    sm = None if use is None else use.sm
                    compute = grant.compute if grant.compute is not None else grant.shares / ratio
                    memory = grant.memory if grant.memory is not None else grant.shares * unit.memory_total / ratio
                    pod_rows.append(
                        PodRow(
                            namespace=row.namespace,
                            pod=row.pod,
                            pod_uid=row.pod_uid,
                            container=row.container if by_container else None,
                            gpu_index=device.index,
                            gpu_uuid=device.uuid,
                            shares=grant.shares,
                            memory_used=row.memory_used,
                            memory_allocated=int(memory),
                            use=use,
                            vgpu_utilization=None if sm is None or compute <= 0 or not settled else sm / compute,
                            processes=row.processes,
                            mig_uuid=None if unit.mig is None else unit.mig.uuid,
                            mig_profile=None if unit.mig is None else unit.mig.profile,
                            settled=settled,
                        )
                    )
        gpu_rows.append(
            GpuRow(
                device=device,
                vgpus=ratios.of(device.uuid),
                unattributed_memory=unattributed,
                unlisted_memory=_unlisted(device, reading.processes),
                mps_servers=reading.mps_servers,
                users=reading.users,
                busy_seconds=reading.busy_seconds,
                unexplained_seconds=reading.unexplained_seconds,
                unattributed_seconds=reading.unattributed_seconds,
                window_seconds=reading.window_seconds,
                window_utilization=reading.window_utilization,
            )
        )
    return tuple(gpu_rows), tuple(pod_rows)


def _unlisted(device: Device, processes: Sequence[GpuProcess] | None) -> int | None:
    """What of the GPU's used (NVML's v1: the reservation and what was allocated) neither the
    reservation nor any listed process holds, the pods' and those of no pod alike: on an H200
    with driver 580, a few MiB per CUDA context that its process's listed memory leaves out
    (docs/metrics.md).

    None where a part is unknown, rather than a figure that takes in what it is not: without v2
    there is no reservation to take off; where the listing failed (or the agent is blind to
    it), or NVML could not give a process's memory (WDDM), the listed total is unknown. In MIG
    mode the processes are listed per MIG device, each with memory of its own, and what the
    GPU's used holds beyond its reservation and their listings was never measured: it takes in
    whatever each MIG device keeps for itself, so it would be no one figure."""
    if processes is None or device.mig_mode or device.memory_reserved is None:
        return None
    listed = 0
    for process in processes:
        if process.used_memory is None:
            return None
        listed += process.used_memory
    # Not negative in practice: the driver's used holds the reservation and every allocation
    # its listings name. The floor is for the two being read at different instants (the device
    # first, then its processes: collect/reading.py): a process that allocated in between is
    # listed with more than the used took in, and the floor hides by how much. A process that
    # ended in between errs the other way, its memory counted here for that sweep.
    return max(0, device.memory_used - device.memory_reserved - listed)


def _ended_rows(
    reading: GpuReading,
    labeller: _Labeller,
    rows: dict[tuple[str, str, str, str], _Row],
    by_container: bool,
) -> list[PodRow]:
    """The last interval of the processes on the GPU that have ended: added to their pods'
    rows where they have one; else rows marked ended."""
    if reading.use_by_pid is None:
        return []
    gone: dict[tuple[str, str, str, str], ProcessUse] = {}
    for ref, use in reading.earlier_use.items():
        label = labeller.row(labeller.key(ref))
        row = rows.get(label)
        if row is not None:
            row.use = row.use.plus(use)
        else:
            gone[label] = gone.get(label, ProcessUse()).plus(use)
    device = reading.device
    return [
        PodRow(
            namespace=namespace,
            pod=pod,
            pod_uid=uid,
            container=container if by_container else None,
            gpu_index=device.index,
            gpu_uuid=device.uuid,
            shares=0.0,
            memory_used=0,
            memory_allocated=0,
            use=use.capped(),
            vgpu_utilization=None,
            processes=0,
            ended=True,
        )
        for (namespace, pod, uid, container), use in gone.items()
    ]


class _Labeller:
    """Names a process's row: (namespace, pod, container label)."""

    def __init__(self, lookup: Callable[[str], PodMeta | None], by_container: bool) -> None:
        self._lookup = lookup
        self._by_container = by_container
        self._metas: dict[str, PodMeta | None] = {}

    def meta(self, pod_uid: str) -> PodMeta | None:
        if pod_uid not in self._metas:
            self._metas[pod_uid] = self._lookup(pod_uid)
        return self._metas[pod_uid]

    def key(self, ref: PodRef) -> tuple[str, str]:
        """(pod UID, container label): the container's name where the
        directory knows it, else its ID; "" unless rows are per container."""
        if not self._by_container:
            return (ref.pod_uid, "")
        meta = self.meta(ref.pod_uid)
        cid = ref.container_id or ""
        name = meta.containers.get(cid) if meta is not None else None
        return (ref.pod_uid, name or cid)

    def row(self, key: tuple[str, str]) -> tuple[str, str, str, str]:
        """(namespace, pod, pod UID, container label): the pod's API UID where
        the directory knows it (a static pod's mirror), else its cgroup's."""
        meta = self.meta(key[0])
        if meta is None:
            return ("", key[0], key[0], key[1])
        return (meta.namespace, meta.name, meta.uid or key[0], key[1])


def _unit_rows(
    reading: GpuReading,
    processes: Sequence[GpuProcess],
    pods_by_pid: Mapping[int, PodRef | None],
    labeller: _Labeller,
    placed_here: Mapping[tuple[str, str], Grant],
) -> tuple[dict[tuple[str, str, str, str], _Row], int]:
    """The rows of one device whose processes are known, and its unattributed memory."""
    rows: dict[tuple[str, str, str, str], _Row] = {}

    def row_for(key: tuple[str, str]) -> _Row:
        label = labeller.row(key)
        row = rows.get(label)
        if row is None:
            row = rows[label] = _Row(*label)
        row.keys.add(key)
        return row

    unattributed = 0
    for process in processes:
        ref = pods_by_pid.get(process.pid)
        used = process.used_memory or 0
        if ref is None:
            unattributed += used
            continue
        row = row_for(labeller.key(ref))
        row.memory_used += used
        row.processes += 1
        if process.pid in reading.unknown_pids:
            row.use_unknown = True
        elif reading.use_by_pid is not None and (use := reading.use_by_pid.get(process.pid)) is not None:
            row.use = row.use.plus(use)
    # A pod with a process whose use NVML cannot tell has no SM figure on the device at all:
    # the ledger gives none of its processes a share (collect/ledger.py), so that what the
    # others' samples hold (a tenant's own MPS server's, say) is unattributed, not in no series.
    blind = {ref.pod_uid for p in processes if p.pid in reading.unknown_pids and (ref := pods_by_pid.get(p.pid))}
    for row in rows.values():
        if any(key[0] in blind for key in row.keys):
            row.use_unknown = True
    for key in placed_here:
        row_for(key)
    return rows, unattributed


def _grant(
    keys: set[tuple[str, str]],
    placed_here: Mapping[tuple[str, str], Grant],
    unplaced: Mapping[tuple[str, str], float],
    running_on: Mapping[tuple[str, str], int],
    answered: frozenset[str],
) -> Grant:
    total = Grant()
    for key in keys:
        if key in placed_here:
            total = total.plus(placed_here[key])
        elif key in unplaced:
            total = total.plus(Grant(shares=unplaced[key] / max(1, running_on.get(key, 1))))
        elif key[0] in answered:
            # Its allocator answered and gave it nothing here: use without an allocation.
            continue
        else:
            # The pod runs here, so it was given at least one share.
            total = total.plus(Grant(shares=1.0))
    return total
