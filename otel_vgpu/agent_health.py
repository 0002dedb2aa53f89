"""The agent's own health: failures by stage, refusals by reason, sweep durations, each
reader's last pass, and logs that say each kind of failure once.

One `AgentHealth` is made before anything that can fail and is handed to each of
them: the sampler, the Kubernetes directory, the pod-resources poller, the
OTLP push. It counts every failure (the telemetry reads the counts), logs a
failure the first time its kind is seen, and logs once when it recovers, so a
node whose API server is down for an hour writes two lines, not 720.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum


class Stage(str, Enum):
    """Where a failure happened: the `stage` label of vgpu_agent_collection_errors_total."""

    ALLOCATION_FILE = "allocation_file"
    RATIO = "ratio"
    """The ratio file's number disagrees with the kubelet, or `auto` has no count yet."""
    DEVICE_COUNT = "device_count"
    DEVICE = "device"
    PROCESSES = "processes"
    PROCESS_UTILIZATION = "process_utilization"
    ATTRIBUTION = "attribution"
    SWEEP = "sweep"
    KUBERNETES = "kubernetes"
    NODE = "node"
    """This node's labels, read to follow the GPU Operator's driver upgrades."""
    POD_RESOURCES = "pod_resources"
    CREDENTIALS = "credentials"
    """The endpoint's TLS files or users file changed to a version that cannot be used."""
    POD_ANNOTATIONS = "pod_annotations"
    """A pod's allocator annotation (HAMi) that cannot be read."""
    BIND_REQUESTS = "bind_requests"
    """KAI Scheduler's BindRequests for this node, listed and watched (kubernetes/bind_requests.py)."""
    DEVICE_HEALTH = "device_health"
    """A GPU's health figures, read every 10 s off the scrape's path (collect/device_health.py)."""
    GPM = "gpm"
    """A GPU's GPM figures, read once per engine window."""
    XID_EVENTS = "xid_events"
    """NVML's event set for XID errors (collect/xids.py)."""
    EXPORT = "export"
    """A failed OTLP export: counted in vgpu_agent_export_failures_total, not by stage."""


# The stages a sweep reports on each time: a kind seen in the last sweep and
# not in this one has recovered.
SWEEP_STAGES = frozenset(
    {
        Stage.ALLOCATION_FILE,
        Stage.RATIO,
        Stage.DEVICE_COUNT,
        Stage.DEVICE,
        Stage.PROCESSES,
        Stage.PROCESS_UTILIZATION,
        Stage.ATTRIBUTION,
        Stage.SWEEP,
        Stage.GPM,
    }
)
COLLECTION_STAGES = tuple(stage for stage in Stage if stage is not Stage.EXPORT)


class Refusal(str, Enum):
    """Why the agent refused to let an input a tenant can write decide attribution or
    allocation (docs/trust.md): the `reason` label of vgpu_agent_refusals_total."""

    NESTED_POD_CGROUP = "nested_pod_cgroup"
    """A process in a cgroup nested below its container and named like a pod: billed to its container's pod."""
    UNKNOWN_POD = "unknown_pod"
    """A process of a pod the Kubernetes API does not know, past the bound on such pods: unattributed."""
    PID_REUSED = "pid_reused"
    """NVML samples older than the process that holds their PID now: given to no pod."""
    MPS_SERVER_NAME = "mps_server_name"
    """A process that calls itself the MPS server where it cannot be one: its pod's, as any other."""
    HAMI_ANNOTATION = "hami_annotation"
    """HAMi's allocation annotation on a pod HAMi did not allocate, or for a GPU not on this node: ignored."""
    CONFIG_HASH = "config_hash"
    """`kubernetes.io/config.hash` on a pod that is not a mirror pod, or on two pods: ignored."""
    KAI_FRACTION = "kai_fraction"
    """KAI Scheduler's fraction marks (gpu-fraction, gpu-memory, runai-gpu-group) on a pod that no Succeeded
    BindRequest of KAI's binds to a reserved GPU of this node, or a group its BindRequest does not select: no
    share from them."""
    KAI_RESERVATION = "kai_reservation"
    """A pod that would be one of KAI's reservation pods and is not (outside its namespace, without its labels
    or service account, naming a GPU the kubelet did not give it, or two for one group): it holds no fraction."""
    KAI_OVERCOMMIT = "kai_overcommit"
    """KAI fractions on one GPU that add up to more than the GPU: each scaled down, so that they add up to 1."""


class Reader(str, Enum):
    """One of the agent's reads, each made on a cadence of its own off the scrape's path: the
    `reader` label of vgpu_agent_reader_duration_seconds and vgpu_agent_reader_success, as
    node_exporter labels each collector's duration and success (collector/collector.go,
    node_scrape_collector_duration_seconds and node_scrape_collector_success)."""

    SWEEP = "sweep"
    """NVML, /proc and the sources, once a sweep (collect/sampler.py)."""
    PROCESS_WATCH = "process_watch"
    """One look at every GPU's processes between sweeps (collect/process_watch.py)."""
    GPM = "gpm"
    """The GPM reads of a sweep in which a GPU's GPM window closed, every GPU's at once (collect/gpm_reads.py):
    part of that sweep."""
    DEVICE_HEALTH = "health"
    """One round of every GPU's health figures, read in parallel (collect/device_health.py)."""
    XID = "xid"
    """One round over every GPU's XID events (collect/xids.py)."""
    POD_RESOURCES = "pod_resources"
    """One call of the kubelet's pod-resources API (kubernetes/podresources.py)."""
    API_PODS = "api_pods"
    """A list of this node's pods from the Kubernetes API, which a watch then keeps current (kubernetes/api.py)."""
    API_NODE = "api_node"
    """A list of this node from the Kubernetes API, for its labels, then watched (kubernetes/driver_upgrade.py)."""
    API_BIND_REQUESTS = "api_bind_requests"
    """A list of the BindRequests KAI Scheduler wrote for this node, then watched (kubernetes/bind_requests.py)."""


@dataclass(frozen=True, slots=True)
class Pass:
    """A reader's last complete pass: how long it took, and whether it succeeded. Or its pass in
    flight past its deadline: how long it has run so far, failed (`AgentHealth.began`)."""

    seconds: float
    ok: bool


@dataclass(frozen=True, slots=True)
class _Flight:
    """A reader's pass in flight: when it began, and how long it may take."""

    began: float
    deadline_s: float


# Inputs already refused, remembered so that each is counted once (a forged annotation is
# seen at every list of pods, a process at every sweep): at most this many.
MAX_REFUSED_REMEMBERED = 8192


# Sweep durations waiting for a collection to record them: a node nobody
# scrapes still sweeps for its readiness probe, and must not hoard them.
MAX_PENDING_DURATIONS = 10_000


class AgentHealth:
    """Failure counts by stage, pending sweep durations, each reader's last pass, and log-once
    bookkeeping. Thread-safe."""

    def __init__(self, log: logging.Logger | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: what a pass in flight is timed by against its deadline (`began`)."""
        self._log = log or logging.getLogger("otel_vgpu")
        self._clock = clock
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(Stage, 0)
        self._failing: dict[Stage, set[str]] = {stage: set() for stage in Stage}
        self._durations: deque[float] = deque(maxlen=MAX_PENDING_DURATIONS)
        self._passes: dict[Reader, Pass] = {}
        self._flights: dict[Reader, _Flight] = {}
        self._refusals = dict.fromkeys(Refusal, 0)
        self._refused: OrderedDict[tuple[Refusal, str], None] = OrderedDict()
        self._refusal_logged: set[Refusal] = set()

    # --- failures -------------------------------------------------------------------

    def failed(self, stage: Stage, kind: str, message: str, *, log: bool = True) -> bool:
        """Count a failure, and log `message` if this kind of failure of `stage`
        is new. True when it is new. `log=False` counts without logging, for a
        caller that logs in its own way (a traceback)."""
        with self._lock:
            self._counts[stage] += 1
            new = kind not in self._failing[stage]
            self._failing[stage].add(kind)
        if new and log:
            self._log.warning("%s", message)
        return new

    def count(self, stage: Stage) -> None:
        """Count a failure that is logged by its caller each time and ends at once."""
        with self._lock:
            self._counts[stage] += 1

    def recovered(self, stage: Stage, message: str, still: Iterable[str] = ()) -> bool:
        """Every kind of failure of `stage` but those `still` failing is over;
        log `message` once if any was failing. True when one was."""
        with self._lock:
            ended = self._failing[stage] - set(still)
            self._failing[stage] -= ended
        if ended:
            self._log.info("%s", message.replace("{kinds}", ", ".join(sorted(ended))))
        return bool(ended)

    def failing(self, stage: Stage, kind: str | None = None) -> bool:
        """Whether `stage` (that `kind` of it) is failing now."""
        with self._lock:
            return bool(self._failing[stage]) if kind is None else kind in self._failing[stage]

    def counts(self) -> dict[Stage, int]:
        with self._lock:
            return dict(self._counts)

    # --- readers --------------------------------------------------------------------

    def began(self, reader: Reader, deadline_s: float) -> None:
        """`reader` began a pass that should end within `deadline_s` (`passed` ends it). Past
        that, the pass reads failed while it runs: a sweep stuck 40 s in a driver call read
        success 1, its last pass's, and only /healthz said so, after 120 s."""
        with self._lock:
            self._flights[reader] = _Flight(self._clock(), deadline_s)

    def passed(self, reader: Reader, seconds: float, ok: bool) -> None:
        """`reader` ended a pass that took `seconds`, and succeeded (`ok`) or failed."""
        with self._lock:
            self._passes[reader] = Pass(seconds, ok)
            self._flights.pop(reader, None)

    def last_pass(self, reader: Reader) -> Pass | None:
        """`reader`'s last pass, or its pass in flight past its deadline (failed, as long as it
        has run); None while it has made neither (it is off, or has not begun)."""
        with self._lock:
            return self._pass_of(reader, self._clock())

    def passes(self) -> list[tuple[Reader, Pass]]:
        """Each reader's `last_pass`, in the order of `Reader`; a reader that has none, none."""
        with self._lock:
            now = self._clock()
            found = [(reader, self._pass_of(reader, now)) for reader in Reader]
        return [(reader, last) for reader, last in found if last is not None]

    def stuck(self) -> bool:
        """Whether a reader's pass in flight is past its deadline: a collection's body made
        before says otherwise, and is not served again (export/telemetry.py, endpoint/paths.py)."""
        with self._lock:
            now = self._clock()
            return any(now - flight.began > flight.deadline_s for flight in self._flights.values())

    def _pass_of(self, reader: Reader, now: float) -> Pass | None:
        flight = self._flights.get(reader)
        if flight is not None and now - flight.began > flight.deadline_s:
            return Pass(now - flight.began, False)
        return self._passes.get(reader)

    # --- refusals -------------------------------------------------------------------

    def refused(self, reason: Refusal, key: str, message: str, *, log_each: bool = False) -> bool:
        """Count a refused input once: `key` names it (a pod's UID, a process's PID and start
        time). Logs `message` for each new input with `log_each` (one warning per pod), else
        for the first of its reason only (a tenant's thousand processes write one line).
        True when the input is new."""
        entry = (reason, key)
        with self._lock:
            if entry in self._refused:
                self._refused.move_to_end(entry)
                return False
            self._refused[entry] = None
            if len(self._refused) > MAX_REFUSED_REMEMBERED:
                self._refused.popitem(last=False)
            self._refusals[reason] += 1
            first = reason not in self._refusal_logged
            self._refusal_logged.add(reason)
        if log_each or first:
            self._log.warning("%s", message)
        return True

    def refusals(self) -> dict[Refusal, int]:
        with self._lock:
            return dict(self._refusals)

    # --- sweeps ---------------------------------------------------------------------

    def swept(self, seconds: float) -> None:
        """A sweep took `seconds`; the telemetry records it at its next collection."""
        with self._lock:
            self._durations.append(seconds)

    def take_durations(self) -> list[float]:
        with self._lock:
            durations = list(self._durations)
            self._durations.clear()
        return durations
