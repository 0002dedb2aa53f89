"""The scrape's collection, made from the agent's own observations rather than the SDK's storage.

The OpenTelemetry SDK keeps the instruments and serves the OTLP push; a scrape used to run
through it as well: every observation became an Observation, a Measurement, a cleaned and
hashed copy of its attributes, an aggregation and a data point, which exposition.py then
wrote out. A scrape reads the same observations (Telemetry's `_observations`, what the
callbacks return) and hands them to the writer directly; what the SDK's storage decides of the
output is kept here as the storage keeps it, so that the bytes are those the SDK's path wrote
(tests/unit/export/test_direct_scrape.py renders both ways, collection after collection, and compares):

- the families in the order of their first measurement: an observable family's first
  observation by a scrape, a histogram's first record (whatever reader's collection made it);
- a family's series in the order its attribute set was first observed, kept while observed and
  pruned as Telemetry's `_prune` prunes the SDK's storage (only when it holds more sets than the
  collection observed), each series' first attribute dict kept, whose identity the writer's
  label texts are looked up by;
- an attribute set observed twice in one collection: a gauge's last value, a counter's sum;
- past the cardinality limit, the SDK's overflow series;
- a histogram's cumulative buckets and sum, its records folded in at each scrape collection as
  the SDK folds them at each of its reader's collections (the same float additions, in order).

Not thread-safe as a whole: one collection at a time (Telemetry collects under its render lock);
`record` may come from any reader's thread.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import Any

from otel_vgpu.export.exposition import Buckets, Series, family_of
from otel_vgpu.export.family import Family, Instrument

Key = frozenset[tuple[str, Any]]
Observations = Sequence[tuple[Mapping[str, Any], float]]
"""One family's observations in one collection: (attributes, value), in the callback's order."""

# The SDK's overflow series (opentelemetry.sdk.metrics._internal._view_instrument_match).
_OVERFLOW_ATTRIBUTES: Mapping[str, Any] = {"otel.metric.overflow": True}
_OVERFLOW_KEY: Key = frozenset(_OVERFLOW_ATTRIBUTES.items())


class _Keys:
    """Content keys of attribute dicts, made once per dict in one collection: the rows' attribute
    dicts are shared by every family of their subject (Telemetry's `_rows_of`)."""

    def __init__(self) -> None:
        self._made: dict[int, tuple[Mapping[str, Any], Key]] = {}

    def __call__(self, attributes: Mapping[str, Any]) -> Key:
        made = self._made.get(id(attributes))
        if made is None or made[0] is not attributes:
            made = self._made[id(attributes)] = (attributes, frozenset(attributes.items()))
        return made[1]


class _Stream:
    """One observable family's series as the SDK's storage for a reader holds them."""

    __slots__ = ("held", "sums")

    def __init__(self, sums: bool) -> None:
        self.sums = sums
        """A counter: observations of one attribute set in one collection add up (the SDK's sum)."""
        self.held: dict[Key, Mapping[str, Any]] = {}

    def points(self, observations: Observations, keys: _Keys, limit: int) -> list[tuple[Mapping[str, Any], float]]:
        held = self.held
        values: dict[Key, float] = {}
        for attributes, value in observations:
            key = keys(attributes)
            if key not in held:
                if len(held) >= limit:
                    key = _OVERFLOW_KEY
                    held.setdefault(key, dict(_OVERFLOW_ATTRIBUTES))
                else:
                    held[key] = attributes
            # The SDK's sum starts at 0 (so -0.0 reads 0.0); its last value is the value.
            values[key] = values.get(key, 0) + value if self.sums else value
        points = [(attributes, values[key]) for key, attributes in held.items() if key in values]
        if len(held) > len(observations):
            # Telemetry._prune's rule: the sets this collection did not observe go (the overflow too).
            observed = {keys(attributes) for attributes, _ in observations}
            self.held = {key: attributes for key, attributes in held.items() if key in observed}
        return points


class _HistogramSeries:
    """One histogram attribute set: records since the last scrape collection, and the cumulative."""

    __slots__ = ("attributes", "counts", "pending", "pending_sum", "sum")

    def __init__(self, attributes: Mapping[str, Any]) -> None:
        self.attributes = attributes
        self.pending: list[int] | None = None
        self.pending_sum: float = 0
        self.counts: list[int] | None = None
        self.sum: float = 0

    def fold(self, bounds: tuple[float, ...]) -> Buckets:
        """The SDK's cumulative collection of a synchronous histogram: this interval's counts and
        sum added to the previous ones (the sum as `interval + previous`, its order)."""
        empty = [0] * (len(bounds) + 1)
        self.counts = [a + b for a, b in zip(self.pending or empty, self.counts or empty, strict=False)]
        self.sum = self.pending_sum + self.sum
        self.pending, self.pending_sum = None, 0
        return Buckets(self.attributes, bounds, tuple(self.counts), self.sum)


class DirectScrape:
    """The families a scrape shows, collection by collection, in the SDK's order."""

    def __init__(self, families: Sequence[Family[Any]], cardinality_limit: int) -> None:
        self._limit = cardinality_limit
        self._identity = {
            family.name: family_of(family.name, family.unit, family.description, family.instrument.value)
            for family in families
        }
        self._streams = {
            family.name: _Stream(family.instrument is Instrument.COUNTER)
            for family in families
            if family.instrument is not Instrument.HISTOGRAM
        }
        self._bounds = {
            family.name: tuple(family.buckets) for family in families if family.instrument is Instrument.HISTOGRAM
        }
        self._histograms: dict[str, dict[Key, _HistogramSeries]] = {}
        self._order: dict[str, None] = {}
        """Families by first measurement, as the SDK's storage lists its instruments."""
        self._lock = threading.Lock()

    def record(self, name: str, value: float, attributes: Mapping[str, Any]) -> None:
        """A histogram's record, at the start of any reader's collection (as the SDK's is)."""
        bounds = self._bounds.get(name)
        if bounds is None or value < 0:
            return  # not a family the scrape shows; or one the SDK drops (and warns of)
        with self._lock:
            histogram = self._histograms.setdefault(name, {})
            self._order.setdefault(name, None)
            key: Key = frozenset(attributes.items())
            series = histogram.get(key)
            if series is None:
                # The SDK's limit holds here too, but a histogram's sets are the sweeps' (one).
                series = histogram[key] = _HistogramSeries(dict(attributes))
            if series.pending is None:
                series.pending = [0] * (len(bounds) + 1)
            series.pending_sum += value
            series.pending[bisect_left(bounds, value)] += 1

    def collect(self, observed: Mapping[str, Observations]) -> list[Series]:
        """One scrape collection: each observable family's observations (every family the
        scrape collects, in the order the SDK ran their callbacks; a family whose callback
        failed is absent), as the families to write, in the SDK's order."""
        keys = _Keys()
        with self._lock:
            points: dict[str, Series] = {}
            for name, observations in observed.items():
                if observations:
                    self._order.setdefault(name, None)
                found = self._streams[name].points(observations, keys, self._limit)
                if found:
                    points[name] = Series(self._identity[name], found)
            for name, histogram in self._histograms.items():
                bounds = self._bounds[name]
                points[name] = Series(self._identity[name], buckets=[s.fold(bounds) for s in histogram.values()])
            return [points[name] for name in self._order if name in points]

    def held(self, name: str) -> int:
        """Attribute sets the family holds (ended ones pruned), as the SDK's storage would."""
        return len(self._streams[name].held)
