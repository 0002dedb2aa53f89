"""OpenTelemetry wiring: meter provider, readers, and the instruments.

Every family of the contract (export/families.py) is an instrument built in one loop: a gauge
or a counter is observable, its callback mapping the rows of one snapshot to observations; the
histogram is recorded at the start of each collection. A collection is a scope: it takes one snapshot
from the sampler before the SDK runs the callbacks, and every callback of
that collection reads the same snapshot. That is what makes "one
sweep per collection" hold whatever `--min-interval` is, and keeps the
families of one scrape consistent with each other.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics
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
from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.collect.aggregate import Snapshot
from otel_vgpu.collect.device_health import DeviceHealth, HealthRow
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.collect.xids import XidCount, XidCounts
from otel_vgpu.export.direct import DirectScrape, Observations
from otel_vgpu.export.exposition import Format, Renderer, Series
from otel_vgpu.export.families import FAMILIES, Family, Feature, Instrument, Observed, Subject
from otel_vgpu.export.otlp import OtlpPusher, OtlpSettings, make_exporter
from otel_vgpu.export.reader import ScrapeReader, no_exemplars
from otel_vgpu.export.sdk_internals import (
    SdkMismatch,
    check_versions,
    fast_attribute_paths,
    storage_matches,
    use_ratio_suffix,
)
from otel_vgpu.flag_values import OTLP_SEMCONV
from otel_vgpu.memory import trim

log = logging.getLogger(__name__)
# A callback that raises is logged where and as the SDK logs it, whichever reader collected.
_sdk_log = logging.getLogger("opentelemetry.sdk.metrics._internal.instrument")

# Points one instrument may hold before the SDK folds the rest into an
# overflow series. The SDK's default (2000) is below 8 GPUs x 400 pods; this
# covers 8 GPUs x 8192 pods. Stale attribute sets are pruned after each
# collection (see _prune), so the limit bounds live series, not history.
CARDINALITY_LIMIT = 65_536


def agent_resource(node_name: str) -> Resource:
    """Who the figures are from. OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win over the
    defaults. A node agent's host is its node (in a pod, the host name is the pod's); the node
    also tells one agent's series from another's on the OTLP path where nothing else does
    (the manifests set the pod's UID)."""
    return Resource.create(
        {
            "service.name": "otel-vgpu",
            "service.version": __version__,
            "service.instance.id": node_name or socket.gethostname(),
            "k8s.node.name": node_name,
            "host.name": node_name or socket.gethostname(),
        }
    ).merge(OTELResourceDetector().detect())


class CollectionScope:
    """One snapshot per reader collection, shared by every callback in it."""

    def __init__(
        self,
        sampler: Sampler,
        max_age: float,
        before: Callable[[], None] = lambda: None,
        devices: Callable[[float], tuple[HealthRow, ...]] = lambda max_age: (),
        xids: Callable[[], tuple[XidCount, ...]] = tuple,
    ) -> None:
        """`before` runs at the start of each collection, after its sweep; `devices` gives the
        GPUs' health figures as last read (collect/device_health.py), `xids` the
        XID counts."""
        self._sampler = sampler
        self.max_age = max_age
        self._before = before
        self._devices = devices
        self._xids = xids
        self._local = threading.local()

    @contextmanager
    def collection(self, reader: str) -> Iterator[None]:
        """One collection by `reader` (the scrape, the OTLP push), which the sampler is told of:
        an ended pod's series stays until every reader has collected it."""
        snapshot = self._local.snapshot = self._sampler.snapshot(self.max_age)
        self._sampler.collected(reader, snapshot)
        self._local.devices = self._devices(self.max_age)
        self._local.xids = self._xids()
        self._before()
        self._local.observed = {}
        try:
            yield
        finally:
            self._local.snapshot = None

    def seen(self, health: AgentHealth) -> Observed:
        """What this collection reads: its snapshot, and the GPUs' health and XID counts read for it."""
        return Observed(self.snapshot(), health, getattr(self._local, "devices", ()), getattr(self._local, "xids", ()))

    def snapshot(self) -> Snapshot:
        pinned: Snapshot | None = getattr(self._local, "snapshot", None)
        # Outside a reader's collection (not expected): still one sweep per
        # max_age, through the sampler's own sharing.
        return pinned if pinned is not None else self._sampler.snapshot(self.max_age)

    def record(self, instrument: str, observations: Observations) -> None:
        """What `instrument` observed in this collection: (attributes, value) per series."""
        observed = getattr(self._local, "observed", None)
        if observed is not None:
            observed[instrument] = observations

    def observed(self) -> dict[str, Observations]:
        result: dict[str, Observations] = getattr(self._local, "observed", None) or {}
        return result


class Telemetry:
    """The meter provider, its Prometheus reader, and every instrument."""

    def __init__(
        self,
        sampler: Sampler,
        health: AgentHealth,
        min_interval: float,
        node_name: str,
        seed_metrics: bool,
        otlp: OtlpSettings | None = None,
        families: Sequence[Family[Any]] = FAMILIES,
        devices: DeviceHealth | None = None,
        xids: XidCounts | None = None,
    ) -> None:
        """`families`: those of the contract to publish (--metric-allowlist, --metric-denylist);
        `devices`, `xids`: where the GPUs' health figures and XID counts come from, if published."""
        # Before anything is built on them: the private parts this relies on.
        check_versions()
        use_ratio_suffix()
        fast_attribute_paths()
        self._health = health
        self._prune_works = True
        self.scope = CollectionScope(
            sampler,
            min_interval,
            before=self._record_histograms,
            devices=devices.rows if devices is not None else lambda max_age: (),
            xids=xids.rows if xids is not None else tuple,
        )
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
        # The families of the semantic-conventions push alone are collected by the scrape's reader
        # too (the SDK has no reader of its own instruments), and left out of what it renders.
        leave_out = frozenset(family.name for family in families if family.needs is Feature.SEMCONV)
        self._renderer = Renderer(leave_out=leave_out)
        readers: list[MetricReader] = [self.reader]
        self.pusher: OtlpPusher | None = None
        if otlp is not None:
            self.pusher = OtlpPusher(
                make_exporter(otlp),
                otlp,
                scope=lambda: self.scope.collection("otlp"),
                after_collect=self._prune,
                health=health,
                cardinality_limits=limits,
            )
            readers.append(self.pusher)
        self.resource = agent_resource(node_name)
        self.provider = MeterProvider(
            resource=self.resource,
            metric_readers=readers,
            # Gauges of GPU state have no traces to link to; sampling exemplars
            # would cost a reservoir per series per collection for nothing.
            exemplar_filter=AlwaysOffExemplarFilter(),
            views=[
                # Each instrument matches one view (two would make two streams).
                View(instrument_type=ObservableGauge, exemplar_reservoir_factory=no_exemplars),
                View(instrument_type=ObservableCounter, exemplar_reservoir_factory=no_exemplars),
                *(
                    View(
                        instrument_name=family.name,
                        aggregation=ExplicitBucketHistogramAggregation(boundaries=family.buckets),
                        exemplar_reservoir_factory=no_exemplars,
                    )
                    for family in families
                    if family.instrument is Instrument.HISTOGRAM
                ),
            ],
        )
        features = {Feature.SEED_METRICS} if seed_metrics else set()
        if self.pusher is not None:
            features.add(Feature.OTLP)
        if otlp is not None and otlp.names == OTLP_SEMCONV:
            features.add(Feature.SEMCONV)
        meter = self.provider.get_meter("otel_vgpu", __version__)
        self._observables: list[Family[Any]] = []
        """The observable families, in the order the SDK runs their callbacks."""
        self._histograms = self._instruments(meter, families, features)
        # A scrape writes what the callbacks observe without the SDK (export/direct.py): the
        # reader above stays registered, never collected by a scrape, as the reference the
        # tests compare the scrape's bytes against.
        self._leave_out = leave_out
        self._direct = DirectScrape(
            [family for family in self._observables if family.name not in leave_out]
            + [family for family, _ in self._histograms if family.name not in leave_out],
            CARDINALITY_LIMIT,
        )
        self._render_lock = threading.Lock()
        self._encoded: tuple[Snapshot, list[Series], dict[tuple[bool, str], bytes]] | None = None
        """The last snapshot, its collection and its bodies by format (under the render lock)."""
        self._rows_lock = threading.Lock()
        self._rows: tuple[Snapshot, dict[str, tuple[Sequence[Any], list[Mapping[str, str]]]]] | None = None
        """The last snapshot's rows and their attributes, by subject."""

    def _instruments(
        self, meter: metrics.Meter, families: Sequence[Family[Any]], features: set[Feature]
    ) -> list[tuple[Family[Any], metrics.Histogram]]:
        """Each of `families` that `features` allow, as an instrument; the histograms returned,
        which are recorded at the start of each collection (`_record_histograms`)."""
        histograms = []
        for family in families:
            if family.needs is not None and family.needs not in features:
                continue
            if family.instrument is Instrument.HISTOGRAM:
                histogram = meter.create_histogram(family.name, unit=family.unit, description=family.description)
                histograms.append((family, histogram))
                continue
            # Counters (cumulative monotonic sums over OTLP) and gauges alike read their rows when collected.
            create = (
                meter.create_observable_counter
                if family.instrument is Instrument.COUNTER
                else meter.create_observable_gauge
            )
            create(family.name, [self._callback(family)], unit=family.unit, description=family.description)
            self._observables.append(family)
        return histograms

    def start(self) -> None:
        """Start pushing, where OTLP is on (scrapes need nothing started)."""
        if self.pusher is not None:
            self.pusher.start()

    def _record_histograms(self) -> None:
        # Sweeps made since the last collection, whoever asked for them (a
        # readiness probe too), go into the histogram before it is read.
        for family, histogram in self._histograms:
            rows, attributes = self._rows_of(family.subject)
            for row, labels in zip(rows, attributes, strict=True):
                value = family.value(row)
                if value is not None:
                    histogram.record(value, dict(labels))
                    self._direct.record(family.name, value, labels)

    # --- rendering -----------------------------------------------------------------

    @property
    def min_interval(self) -> float:
        return self.scope.max_age

    @property
    def stuck(self) -> bool:
        """Whether a reader's pass in flight is past its deadline: no body made before is served."""
        return self._health.stuck()

    def render(self, fmt: Format) -> bytes:
        return self.render_snapshot(fmt)[1]

    def render_snapshot(self, fmt: Format) -> tuple[Snapshot, bytes]:
        """One collection, as `fmt` asks (the process's metrics, then target_info and every
        OpenTelemetry family), and the snapshot it was made from."""
        # The sweep comes first, outside the lock, so scrapes arriving together
        # share the sweep in flight; the SDK's storage (and its pruning) and
        # the renderer's label texts see one collection at a time.
        with self.scope.collection("scrape"), self._render_lock:
            snapshot = self.scope.snapshot()
            # One collection per snapshot, and one encoding per body it is asked in: the
            # variants (OpenMetrics or not, four escapings, gzip) cost their encoding at
            # most, never another run of every callback over the same rows. Save while a
            # reader is stuck past its deadline (a sweep in a hung driver call makes no new
            # snapshot): each collection then says so, and for how long.
            done = self._encoded
            if done is None or done[0] is not snapshot or self.stuck:
                series = self._direct.collect(self._scrape_observations())
                if self._renderer.new_collection():
                    trim()  # the label texts of escapings no longer asked for: their memory back
                done = self._encoded = (snapshot, series, {})
            body = done[2].get(fmt.body)
            if body is None:
                resource = (self.resource, self.resource.attributes)
                rendered = self._renderer.render_series(resource, done[1], fmt).encode()
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

    def _callback(self, family: Family[Any]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            observations = self._observations(family)
            self.scope.record(family.name, observations)
            return [Observation(v, attrs) for attrs, v in observations]

        return callback

    def _observations(self, family: Family[Any]) -> Observations:
        """What `family` observes in this collection: (attributes, value) per row that has a value."""
        rows, attributes = self._rows_of(family.subject)
        value = family.value
        return [(attrs, v) for row, attrs in zip(rows, attributes, strict=True) if (v := value(row)) is not None]

    def _scrape_observations(self) -> dict[str, Observations]:
        """Every observable family's observations for a scrape, in the SDK's callback order: the
        families a scrape leaves out are read too, as the SDK ran their callbacks (a subject's rows
        may be taken as they are read), and a family that fails is logged as the SDK logs it."""
        observed: dict[str, Observations] = {}
        for family in self._observables:
            try:
                observations = self._observations(family)
            except Exception:  # the SDK's rule: one failing callback costs its family only
                _sdk_log.exception("Callback failed for instrument %s.", family.name)
                continue
            self.scope.record(family.name, observations)
            if family.name not in self._leave_out:
                observed[family.name] = observations
        return observed

    def _rows_of(self, subject: Subject[Any]) -> tuple[Sequence[Any], list[Mapping[str, str]]]:
        """The rows of `subject` in this collection, with their attributes: built once per
        snapshot and shared by the subject's families where they follow from the snapshot."""
        observed = self.scope.seen(self._health)
        if not subject.per_snapshot:
            rows = subject.rows(observed)
            return rows, [subject.attributes(row) for row in rows]
        with self._rows_lock:
            cached = self._rows
            if cached is None or cached[0] is not observed.snapshot:
                cached = self._rows = (observed.snapshot, {})
            built = cached[1].get(subject.name)
            if built is None:
                rows = subject.rows(observed)
                built = cached[1][subject.name] = (rows, [subject.attributes(row) for row in rows])
        return built

    def _prune(self, reader: Any) -> None:
        """Forget attribute sets that the last collection did not observe.

        The SDK keeps every attribute set an observable instrument has ever
        reported (it reports only the observed ones, so no stale series
        appear), which on a node where pods come and go grows without bound
        and eventually pushes new pods into the overflow series. This reaches
        into SDK internals (sdk_internals.py; the versions are checked at
        start); tests/unit/export/test_telemetry.py proves it on the pinned SDK, and any
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
                    keep = {frozenset(attributes.items()) for attributes, _ in current}
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
