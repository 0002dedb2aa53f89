"""OpenTelemetry wiring: meter provider, readers, and the instruments.

Every GPU and pod family is an observable gauge whose callback maps rows of
one snapshot to observations. A collection is a scope: it takes one snapshot
from the sampler before the SDK runs the callbacks, and every callback of
that collection reads the same snapshot. That is what makes "one
sweep per collection" hold whatever `--min-interval` is, and keeps the
families of one scrape consistent with each other.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
)
from opentelemetry.sdk.metrics.export import CardinalityLimits, MetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client import exposition as prometheus_text
from prometheus_client.openmetrics import exposition as openmetrics

from otel_vgpu import __version__
from otel_vgpu.collect.aggregate import GpuRow, PodRow, Snapshot
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.export.exposition import Format, Renderer
from otel_vgpu.export.families import BY_NAME, Instrument, Kind, of_kind
from otel_vgpu.export.memory import trim
from otel_vgpu.export.otlp import OtlpPusher, OtlpSettings, make_exporter
from otel_vgpu.export.reader import ScrapeReader, no_exemplars
from otel_vgpu.export.sdk_internals import (
    SdkMismatch,
    check_versions,
    fast_attribute_paths,
    storage_matches,
    use_ratio_suffix,
)
from otel_vgpu.health import COLLECTION_STAGES, Health, Stage

log = logging.getLogger(__name__)

# Points one instrument may hold before the SDK folds the rest into an
# overflow series. The SDK's default (2000) is below 8 GPUs x 400 pods; this
# covers 8 GPUs x 8192 pods. Stale attribute sets are pruned after each
# collection (see _prune), so the limit bounds live series, not history.
CARDINALITY_LIMIT = 65_536
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MIB = 1024 * 1024


# Each pod and GPU family's value in a snapshot row (families.py has the rest of the contract).
ROW_VALUES: dict[str, Callable[[Any], float | None]] = {
    "vgpu.pod.memory.used": lambda r: r.memory_used,
    "vgpu.pod.memory.allocated": lambda r: r.memory_allocated,
    "vgpu.pod.sm.utilization": lambda r: r.sm_utilization,
    "vgpu.pod.vgpu.utilization": lambda r: r.vgpu_utilization,
    "vgpu.pod.processes": lambda r: r.processes,
    "vgpu.pod.sm.busy": lambda r: r.sm_busy_seconds,
    "vgpu.pod.memory.peak": lambda r: r.memory_peak,
    "vgpu.gpu.sm.busy": lambda g: g.sm_busy_seconds,
    "vgpu.pod.energy": lambda r: r.energy_joules,
    "vgpu.gpu.energy": lambda g: g.energy_joules,
    "vgpu.gpu.energy.unattributed": lambda g: g.energy_unattributed_joules,
    "vgpu.gpu.memory.total": lambda g: g.memory_total,
    "vgpu.gpu.memory.used": lambda g: g.memory_used,
    "vgpu.gpu.sm.utilization": lambda g: g.interval_utilization,
    "vgpu.gpu.vgpus": lambda g: g.vgpus,
    "vgpu.gpu.memory.unattributed": lambda g: g.unattributed_memory,
    "vgpu.gpu.mps.servers": lambda g: g.mps_servers,
}
# Each seed family's place in seed_rows' values.
SEED_POSITIONS = {"pod_gpu_memory_used": 0, "pod_gpu_sm_util": 1, "pod_total_gpu_memory": 2}


def pod_attributes(row: PodRow) -> dict[str, str]:
    attributes = {
        "namespace": row.namespace,
        "pod": row.pod,
        "pod_uid": row.pod_uid,
        "gpu_id": str(row.gpu_index),
        "gpu_uuid": row.gpu_uuid,
    }
    if row.container is not None:
        attributes["container"] = row.container
    if row.mig_uuid is not None:
        attributes["mig_uuid"] = row.mig_uuid
        attributes["mig_profile"] = row.mig_profile or ""
    return attributes


def gpu_attributes(row: GpuRow) -> dict[str, str]:
    return {"gpu_id": str(row.index), "gpu_uuid": row.uuid, "gpu_model": row.model}


def seed_rows(snapshot: Snapshot) -> dict[tuple[str, str], tuple[float, float | None, float]]:
    """The original exporter's three values per (pod, gpu_id): memory used
    (MiB), SM utilization (percent x ratio; None where NVML cannot tell, as
    under MIG or MPS) and allocated memory (MiB). Its labels had no
    namespace, so pods of one name in two namespaces add up, and no MIG
    device, so a pod's MIG devices of one GPU add up."""
    ratio = {gpu.index: gpu.vgpus for gpu in snapshot.gpus}
    rows: dict[tuple[str, str], tuple[float, float | None, float]] = {}
    for row in snapshot.pods:
        key = (row.pod, str(row.gpu_index))
        used, sm, total = rows.get(key, (0.0, 0.0, 0.0))
        pod_sm = None if row.sm_utilization is None else row.sm_utilization * 100.0 * ratio.get(row.gpu_index, 1.0)
        rows[key] = (
            used + row.memory_used / MIB,
            None if sm is None or pod_sm is None else sm + pod_sm,
            total + row.memory_allocated / MIB,
        )
    return rows


class CollectionScope:
    """One snapshot per reader collection, shared by every callback in it."""

    def __init__(self, sampler: Sampler, max_age: float, before: Callable[[], None] = lambda: None) -> None:
        """`before` runs at the start of each collection, after its sweep."""
        self._sampler = sampler
        self.max_age = max_age
        self._before = before
        self._local = threading.local()

    @contextmanager
    def collection(self) -> Iterator[None]:
        self._local.snapshot = self._sampler.snapshot(self.max_age)
        self._before()
        self._local.observed = {}
        try:
            yield
        finally:
            self._local.snapshot = None

    def snapshot(self) -> Snapshot:
        pinned: Snapshot | None = getattr(self._local, "snapshot", None)
        # Outside a reader's collection (not expected): still one sweep per
        # max_age, through the sampler's own sharing.
        return pinned if pinned is not None else self._sampler.snapshot(self.max_age)

    def record(self, instrument: str, observations: list[Observation]) -> None:
        observed = getattr(self._local, "observed", None)
        if observed is not None:
            observed[instrument] = observations

    def observed(self) -> dict[str, list[Observation]]:
        result: dict[str, list[Observation]] = getattr(self._local, "observed", None) or {}
        return result


class Telemetry:
    """The meter provider, its Prometheus reader, and every instrument."""

    def __init__(
        self,
        sampler: Sampler,
        health: Health,
        min_interval: float,
        node_name: str,
        seed_metrics: bool,
        otlp: OtlpSettings | None = None,
    ) -> None:
        # Before anything is built on them: the private parts this relies on.
        check_versions()
        use_ratio_suffix()
        fast_attribute_paths()
        self._health = health
        self._prune_works = True
        self.scope = CollectionScope(sampler, min_interval, before=self._record_durations)
        # The process's own metrics (CPU, memory, file descriptors, the
        # runtime's GC), rendered by prometheus_client ahead of the SDK's.
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        limits: CardinalityLimits = {
            ObservableGauge: CARDINALITY_LIMIT,
            ObservableCounter: CARDINALITY_LIMIT,
            Counter: CARDINALITY_LIMIT,
            Histogram: CARDINALITY_LIMIT,
        }
        self.reader = ScrapeReader(cardinality_limits=limits)
        self._renderer = Renderer()
        # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win over the defaults.
        # A node agent's host is its node (in a pod, the host name is the
        # pod's); the node also tells one agent's series from another's on
        # the OTLP path where nothing else does (the manifests set the pod's UID).
        resource = Resource.create(
            {
                "service.name": "otel-vgpu",
                "service.version": __version__,
                "service.instance.id": node_name or socket.gethostname(),
                "k8s.node.name": node_name,
                "host.name": node_name or socket.gethostname(),
            }
        ).merge(OTELResourceDetector().detect())
        readers: list[MetricReader] = [self.reader]
        self.pusher: OtlpPusher | None = None
        if otlp is not None:
            self.pusher = OtlpPusher(
                make_exporter(otlp),
                otlp,
                scope=self.scope.collection,
                after_collect=self._prune,
                health=health,
                cardinality_limits=limits,
            )
            readers.append(self.pusher)
        self.provider = MeterProvider(
            resource=resource,
            metric_readers=readers,
            # Gauges of GPU state have no traces to link to; sampling exemplars
            # would cost a reservoir per series per collection for nothing.
            exemplar_filter=AlwaysOffExemplarFilter(),
            views=[
                # Each instrument matches one view (two would make two streams).
                View(instrument_type=ObservableGauge, exemplar_reservoir_factory=no_exemplars),
                View(instrument_type=ObservableCounter, exemplar_reservoir_factory=no_exemplars),
                View(
                    instrument_name="vgpu.agent.collection.duration",
                    aggregation=ExplicitBucketHistogramAggregation(boundaries=DURATION_BUCKETS),
                    exemplar_reservoir_factory=no_exemplars,
                ),
            ],
        )
        meter = self.provider.get_meter("otel_vgpu", __version__)
        for family in (*of_kind(Kind.POD), *of_kind(Kind.GPU)):
            # Busy seconds are counters (cumulative monotonic sums over OTLP); the rest are gauges.
            create = (
                meter.create_observable_counter
                if family.instrument is Instrument.COUNTER
                else meter.create_observable_gauge
            )
            create(
                family.name,
                [self._callback(family.name, family.kind)],
                unit=family.unit,
                description=family.description,
            )
        if seed_metrics:
            for family in of_kind(Kind.SEED):
                meter.create_observable_gauge(
                    family.name, [self._seed_callback(family.name)], description=family.description
                )
        agent = BY_NAME
        self._duration = meter.create_histogram(
            "vgpu.agent.collection.duration",
            unit=agent["vgpu.agent.collection.duration"].unit,
            description=agent["vgpu.agent.collection.duration"].description,
        )
        agent_gauges = {
            "vgpu.agent.blind.gpus": self._blind_callback,
            "vgpu.agent.driver.paused": self._paused_callback,
            "vgpu.agent.pod_resources.up": self._pod_resources_callback,
        }
        for name, gauge in agent_gauges.items():
            meter.create_observable_gauge(name, [gauge], unit=agent[name].unit, description=agent[name].description)
        meter.create_observable_counter(
            "vgpu.agent.collection.errors",
            [self._errors_callback],
            unit=agent["vgpu.agent.collection.errors"].unit,
            description=agent["vgpu.agent.collection.errors"].description,
        )
        if self.pusher is not None:
            meter.create_observable_counter(
                "vgpu.agent.export.failures",
                [lambda options: [Observation(self._health.counts()[Stage.EXPORT])]],
                unit=agent["vgpu.agent.export.failures"].unit,
                description=agent["vgpu.agent.export.failures"].description,
            )
        self._render_lock = threading.Lock()
        self._encoded: tuple[Snapshot, Any, dict[tuple[bool, str], bytes]] | None = None
        """The last snapshot, its collection and its bodies by format (under the render lock)."""
        self._labels_lock = threading.Lock()
        self._labels: tuple[Snapshot, list[dict[str, str]], list[dict[str, str]]] | None = None
        self._seed: tuple[Snapshot, dict[tuple[str, str], tuple[float, float | None, float]]] | None = None

    def start(self) -> None:
        """Start pushing, where OTLP is on (scrapes need nothing started)."""
        if self.pusher is not None:
            self.pusher.start()

    # --- the agent's own health ----------------------------------------------------

    def _record_durations(self) -> None:
        # Sweeps made since the last collection, whoever asked for them (a
        # readiness probe too), go into the histogram before it is read.
        for seconds in self._health.take_durations():
            self._duration.record(seconds)

    def _errors_callback(self, options: CallbackOptions) -> Iterable[Observation]:
        counts = self._health.counts()
        return [Observation(counts[stage], {"stage": stage.value}) for stage in COLLECTION_STAGES]

    # --- rendering -----------------------------------------------------------------

    @property
    def min_interval(self) -> float:
        return self.scope.max_age

    def render(self, fmt: Format) -> bytes:
        return self.render_snapshot(fmt)[1]

    def render_snapshot(self, fmt: Format) -> tuple[Snapshot, bytes]:
        """One collection, as `fmt` asks (the process's metrics, then target_info and every
        OpenTelemetry family), and the snapshot it was made from."""
        # The sweep comes first, outside the lock, so scrapes arriving together
        # share the sweep in flight; the SDK's storage (and its pruning) and
        # the renderer's label texts see one collection at a time.
        with self.scope.collection(), self._render_lock:
            snapshot = self.scope.snapshot()
            # One collection per snapshot, and one encoding per body it is asked in: the
            # variants (OpenMetrics or not, four escapings, gzip) cost their encoding at
            # most, never another run of every callback over the same rows.
            done = self._encoded
            if done is None or done[0] is not snapshot:
                data = self.reader.collect_data()
                self._prune(self.reader)
                if self._renderer.new_collection():
                    trim()  # the label texts of escapings no longer asked for: their memory back
                done = self._encoded = (snapshot, data, {})
            body = done[2].get(fmt.body)
            if body is None:
                rendered = self._renderer.render(done[1], fmt).encode()
                body = done[2][fmt.body] = self._process_metrics(fmt) + rendered
        return snapshot, body

    def _process_metrics(self, fmt: Format) -> bytes:
        if fmt.openmetrics:
            text: bytes = openmetrics.generate_latest(self.registry, escaping=fmt.escaping)  # type: ignore[no-untyped-call]
            return text[: -len(b"# EOF\n")]  # the one EOF ends the whole exposition
        return prometheus_text.generate_latest(self.registry, escaping=fmt.escaping)

    def shutdown(self) -> None:
        if self.pusher is not None:
            self.pusher.stop()
        self.provider.shutdown()

    # --- callbacks -----------------------------------------------------------------

    def _callback(self, name: str, kind: Kind) -> Callable[[CallbackOptions], Iterable[Observation]]:
        value = ROW_VALUES[name]

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            snapshot = self.scope.snapshot()
            rows, attributes = self._labelled(snapshot, kind)
            observations = [
                Observation(v, attrs)
                for row, attrs in zip(rows, attributes, strict=True)
                if (v := value(row)) is not None
            ]
            self.scope.record(name, observations)
            return observations

        return callback

    def _paused_callback(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(1 if self.scope.snapshot().paused else 0)]

    def _pod_resources_callback(self, options: CallbackOptions) -> Iterable[Observation]:
        up = self._health.answering(Stage.POD_RESOURCES)
        return [] if up is None else [Observation(1 if up else 0)]

    def _blind_callback(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(len(self.scope.snapshot().blind))]

    def _labelled(self, snapshot: Snapshot, kind: Kind) -> tuple[tuple[Any, ...], list[dict[str, str]]]:
        """A snapshot's rows with their attributes, built once per snapshot
        and shared by every family (five pod families read the same rows)."""
        with self._labels_lock:
            cached = self._labels
            if cached is None or cached[0] is not snapshot:
                cached = (
                    snapshot,
                    [pod_attributes(row) for row in snapshot.pods],
                    [gpu_attributes(row) for row in snapshot.gpus],
                )
                self._labels = cached
        if kind is Kind.POD:
            return snapshot.pods, cached[1]
        return snapshot.gpus, cached[2]

    def _seed_rows(self, snapshot: Snapshot) -> dict[tuple[str, str], tuple[float, float | None, float]]:
        """seed_rows once per snapshot: the three seed families read the same rows."""
        with self._labels_lock:
            if self._seed is None or self._seed[0] is not snapshot:
                self._seed = (snapshot, seed_rows(snapshot))
            return self._seed[1]

    def _seed_callback(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        position = SEED_POSITIONS[name]

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            rows = self._seed_rows(self.scope.snapshot())
            observations = [
                Observation(value, {"pod": pod, "gpu_id": gpu_id})
                for (pod, gpu_id), values in rows.items()
                if (value := values[position]) is not None
            ]
            self.scope.record(name, observations)
            return observations

        return callback

    def _prune(self, reader: Any) -> None:
        """Forget attribute sets that the last collection did not observe.

        The SDK keeps every attribute set an observable instrument has ever
        reported (it reports only the observed ones, so no stale series
        appear), which on a node where pods come and go grows without bound
        and eventually pushes new pods into the overflow series. This reaches
        into SDK internals (sdk_internals.py; the versions are checked at
        start); tests/test_telemetry.py proves it on the pinned SDK, and any
        surprise disables it with one warning.
        """
        if not self._prune_works:
            return
        observed = self.scope.observed()
        try:
            matches = storage_matches(self.provider, reader)
            for instrument, views in matches.items():
                # Counters too: a cumulative async sum keeps its ended pods' storage alike.
                if not isinstance(instrument, (ObservableGauge, ObservableCounter)) or instrument.name not in observed:
                    continue
                current = observed[instrument.name]
                for view in views:
                    if len(view._attributes_aggregation) <= len(current):
                        continue
                    keep = {frozenset((o.attributes or {}).items()) for o in current}
                    with view._lock:
                        view._attributes_aggregation = {
                            key: aggregation
                            for key, aggregation in view._attributes_aggregation.items()
                            if frozenset((aggregation._attributes or {}).items()) in keep
                        }
        except (AttributeError, KeyError, TypeError, SdkMismatch) as error:  # pragma: no cover - SDK changed
            log.warning("cannot prune stale attribute sets on this SDK version (%s)", error)
            # Every reader holds this bound method: a flag, not a patched
            # attribute, stops them all from trying (and warning) again.
            self._prune_works = False
