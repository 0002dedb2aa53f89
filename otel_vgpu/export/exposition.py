"""The Prometheus text and OpenMetrics exposition, written straight from the SDK's `MetricsData`.

What `opentelemetry-exporter-prometheus` and `prometheus_client` would write
for the same collection, byte for byte (tests/unit/export/test_exposition.py renders
both ways and compares), without their per-scrape cost: the exporter builds
a `prometheus_client` family and a label dict per series on every scrape,
then `prometheus_client` sorts, validates and escapes every label again.

The naming rules are the exporter's own functions (`_mapping`: name
sanitising, unit suffixes), so names cannot drift from it; the sample lines
follow `prometheus_client`'s exposition (HELP/TYPE/UNIT, label order and
escaping, Go float formatting, `_total` for counters, the `# EOF` of
OpenMetrics). What makes it cheap: a series' label text depends only on its
attribute set and its family's label names, and the SDK keeps one attribute
dict per series for as long as the series lives, so the text is made once
and looked up by that dict's identity on every later scrape.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, cast

from opentelemetry.exporter.prometheus._mapping import map_unit, sanitize_attribute, sanitize_full_name
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    Metric,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client import utils
from prometheus_client.exposition import CONTENT_TYPE_LATEST, CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics import exposition as om

# prometheus_client's value formatting (Go's float format), typed.
_value = cast("Callable[[float], str]", utils.floatToGoString)

OPENMETRICS_1 = om.CONTENT_TYPE_LATEST
_NO_ATTRIBUTES: Mapping[str, Any] = {}
ESCAPINGS = (om.ALLOWUTF8, om.UNDERSCORES, om.DOTS, om.VALUES)


@dataclass(frozen=True, slots=True)
class Format:
    """An exposition format as a scraper's Accept header asks for it."""

    content_type: str
    openmetrics: bool = False
    escaping: str = om.UNDERSCORES
    """How names outside Prometheus' legacy character set are written (only `dots` changes
    the agent's names, which are all legacy-valid)."""

    @property
    def body(self) -> tuple[bool, str]:
        """What the body depends on: clients that name other versions in Accept share it
        (the Content-Type, which echoes the version, is set per response). Each escaping
        is its own body: the agent's names are legacy-valid, but target_info's labels are
        the resource's attribute keys (`k8s.node.name`), which each escaping writes its way."""
        return self.openmetrics, self.escaping


TEXT = Format(CONTENT_TYPE_PLAIN_0_0_4)


def negotiate(accept: str) -> Format:
    """The format for an Accept header, chosen as prometheus_client's `choose_encoder` chooses
    (the first acceptable media range wins, in header order; no q-values): OpenMetrics 1.0.0 or
    later, text/plain 1.0.0 or later with its escaping scheme, else the 0.0.4 text format."""
    for accepted in (accept or "").split(","):
        tokens = accepted.split(";")
        media_type = tokens[0].strip()
        if media_type not in ("application/openmetrics-text", "text/plain"):
            continue
        version, escaping = _parameters(tokens[1:])
        if version and not _PLAIN_VERSION.fullmatch(version):
            # Echoed in the Content-Type: a version that is no short ASCII word (a client's
            # "²", 5,000 digits) is answered as the plain 1.0.0 it stands for.
            version = "1.0.0" if _at_least_1(version) else ""
        if media_type == "application/openmetrics-text":
            if not version:
                return Format(OPENMETRICS_1, openmetrics=True)
            if _at_least_1(version):
                content_type = f"application/openmetrics-text; version={version}; charset=utf-8; escaping={escaping}"
                return Format(content_type, openmetrics=True, escaping=escaping)
        elif version and _at_least_1(version):
            return Format(f"{CONTENT_TYPE_LATEST}; escaping={escaping}", escaping=escaping)
    return TEXT


def _parameters(tokens: Iterable[str]) -> tuple[str, str]:
    version, escaping = "", ""
    for token in tokens:
        if "=" not in token:
            continue
        key, value = token.strip().split("=", 1)
        if key == "version" and not version:
            version = value
        elif key == "escaping" and not escaping:
            escaping = value if value in ESCAPINGS else om.UNDERSCORES
    return version, escaping or om.UNDERSCORES


_LEGACY_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_PLAIN_VERSION = re.compile(r"[0-9A-Za-z.+-]{1,32}")


def _at_least_1(version: str) -> bool:
    first = version.split(".", 1)[0]
    # prometheus_client compares parsed tuples: a non-numeric first part sorts after any number.
    # Only ASCII digits are a number (str.isdigit also takes "²"), and a number is at least 1
    # when a digit other than 0 is in it: no int() of a client's 5,000 digits.
    if not (first.isascii() and first.isdigit()):
        return True
    return first.strip("0") != ""


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _label_value(value: Any) -> str:
    # The exporter's rule: strings as they are, anything else as JSON.
    return value if isinstance(value, str) else json.dumps(value, default=str)


@dataclass(frozen=True, slots=True)
class _Family:
    """A metric's Prometheus identity, as the exporter and prometheus_client derive it."""

    name: str
    """The family's name in OpenMetrics (a counter's without `_total`)."""
    kind: str
    """counter, gauge or histogram."""
    unit: str
    help: str


def _family(metric: Metric) -> _Family | None:
    data = metric.data
    if isinstance(data, Sum):
        # Cumulative sums that may go down are gauges (the Prometheus compatibility specification).
        counter = data.is_monotonic or data.aggregation_temporality != AggregationTemporality.CUMULATIVE
        kind = "counter" if counter else "gauge"
    elif isinstance(data, Gauge):
        kind = "gauge"
    elif isinstance(data, Histogram):
        kind = "histogram"
    else:
        return None  # the exporter skips what it cannot translate (exponential histograms)
    return family_of(metric.name, metric.unit or "", metric.description or "", kind)


@functools.lru_cache(maxsize=1024)
def family_of(name: str, unit: str, description: str, kind: str) -> _Family:
    """A metric's Prometheus identity from its instrument's name, unit, description and kind
    (counter, gauge or histogram), by the exporter's naming rules."""
    name = sanitize_full_name(name)
    unit = map_unit(unit)
    if kind == "counter" and name.endswith("_total"):
        name = name[: -len("_total")]
    if unit and not name.endswith("_" + unit):
        name = f"{name}_{unit}"
    return _Family(name, kind, unit, description)


@dataclass(frozen=True, slots=True)
class Buckets:
    """One histogram series: what its exposition reads of the SDK's HistogramDataPoint."""

    attributes: Mapping[str, Any]
    explicit_bounds: Sequence[float]
    bucket_counts: Sequence[int]
    sum: float


@dataclass(frozen=True, slots=True)
class Series:
    """One family of a collection, ready to write: its identity and its points in order,
    each (attribute dict, value), or a histogram's `Buckets`. A series' attribute dict must be
    the same object from one collection to the next while the series lives (the label texts
    are looked up by its identity), as the SDK's storage keeps it."""

    family: _Family
    points: Sequence[tuple[Mapping[str, Any], float]] = ()
    buckets: Sequence[Buckets] = ()


def _series(metric: Metric) -> Series | None:
    family = _family(metric)
    if family is None:
        return None
    if family.kind == "histogram":
        return Series(family, buckets=cast("Sequence[Buckets]", metric.data.data_points))
    points = cast("Sequence[NumberDataPoint]", metric.data.data_points)
    return Series(family, [(point.attributes or _NO_ATTRIBUTES, point.value) for point in points])


class Renderer:
    """Renders collections; keeps each live series' label text from one render to the next.

    Not thread-safe: one render at a time (Telemetry renders under its lock).
    """

    def __init__(self, leave_out: frozenset[str] = frozenset()) -> None:
        """`leave_out`: the metrics, by name, that a collection may hold and no render shows."""
        self._leave_out = leave_out
        # (escaping, label names) -> id(attribute dict) -> (the dict, its label text)
        self._labels: dict[tuple[str, tuple[str, ...]], dict[int, tuple[Mapping[str, Any], str]]] = {}
        # (id(resource), OpenMetrics or not, escaping) -> (the resource, its target_info text)
        self._target: dict[tuple[int, bool, str], tuple[Resource, str]] = {}
        # Escapings rendered since the last collection, and in the one before it.
        self._escapings: set[str] = set()
        self._escapings_before: set[str] = set()

    def new_collection(self) -> bool:
        """A new collection is being rendered: an escaping not asked for in the last two has
        its label texts dropped (a client that alternated between escapings has gone).
        True when some were."""
        keep = self._escapings | self._escapings_before
        kept = {k: v for k, v in self._labels.items() if k[0] in keep}
        dropped = len(kept) != len(self._labels)
        self._labels = kept
        self._escapings_before, self._escapings = self._escapings, set()
        return dropped

    def render(self, data: MetricsData | None, fmt: Format) -> str:
        """The exposition of one collection: target_info, then every metric, then `# EOF` in OpenMetrics."""
        if data is None or not data.resource_metrics:
            return self.render_series(None, (), fmt)
        attributes: dict[str, Any] = {}
        for resource_metrics in data.resource_metrics:
            attributes.update(resource_metrics.resource.attributes)
        series = [
            found
            for resource_metrics in data.resource_metrics
            for scope_metrics in resource_metrics.scope_metrics
            for metric in scope_metrics.metrics
            if metric.name not in self._leave_out and (found := _series(metric)) is not None
        ]
        return self.render_series((data.resource_metrics[0].resource, attributes), series, fmt)

    def render_series(
        self, resource: tuple[Resource, Mapping[str, Any]] | None, series: Iterable[Series], fmt: Format
    ) -> str:
        """The exposition of one collection given as its families in order (`Series`): target_info
        from `resource` (the resource and its attributes; None: no target_info), then every family,
        then `# EOF` in OpenMetrics. The SDK's collections (`render`) and the scrape's own
        (export/direct.py) are written here alike."""
        out: list[str] = []
        used: dict[tuple[str, tuple[str, ...]], dict[int, tuple[Mapping[str, Any], str]]] = {}
        if resource is not None:
            out.append(self._target_info(resource[0], resource[1], fmt))
            for one in series:
                self._metric(one, fmt, out, used)
        # Only the label text of series that still exist is kept: ended pods' go. The other
        # escaping's texts stay for its next render (clients that alternate between dots
        # and the rest would otherwise have every series' labels written anew each time).
        # The label texts of other escapings than this render's stay too, for their next render.
        written = {fmt.escaping} if fmt.escaping == om.DOTS else {fmt.escaping, om.UNDERSCORES}
        self._labels = {**{k: v for k, v in self._labels.items() if k[0] not in written}, **used}
        if fmt.openmetrics:
            out.append("# EOF\n")
        return "".join(out)

    # --- one family -------------------------------------------------------------------

    def _metric(
        self,
        series: Series,
        fmt: Format,
        out: list[str],
        used: dict[tuple[str, tuple[str, ...]], dict[int, tuple[Mapping[str, Any], str]]],
    ) -> None:
        family = series.family
        escaping = fmt.escaping
        name = om.escape_metric_name(family.name, escaping)
        sample = om.escape_metric_name(f"{family.name}_total", escaping) if family.kind == "counter" else name
        if fmt.openmetrics:
            out.append(f"# HELP {name} {_escape_value(family.help)}\n# TYPE {name} {family.kind}\n")
            if family.unit:
                out.append(f"# UNIT {name} {family.unit}\n")
        else:
            text_help = family.help.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {sample} {text_help}\n# TYPE {sample} {family.kind}\n")
        if family.kind == "histogram":
            names = _label_names(buckets.attributes for buckets in series.buckets)
            self._escapings.add(_labelled(names, escaping))
            for buckets in series.buckets:
                self._histogram(out, family.name, names, escaping, buckets)
            return
        # Every series of a family carries the family's label names, "" where a
        # series has no such attribute (the exporter's backfill).
        names = _label_names(attributes for attributes, _ in series.points)
        labelled = _labelled(names, escaping)
        self._escapings.add(labelled)
        key = (labelled, names)
        previous = self._labels.get(key, {})
        kept = used.setdefault(key, {})
        for attributes, value in series.points:
            entry = kept.get(id(attributes))
            if entry is None or entry[0] is not attributes:
                entry = previous.get(id(attributes))
                if entry is None or entry[0] is not attributes:
                    entry = (attributes, _label_text(attributes, names, labelled))
                kept[id(attributes)] = entry
            out.append(f"{sample}{entry[1]} {_value(value)}\n")

    def _histogram(self, out: list[str], name: str, names: tuple[str, ...], escaping: str, point: Buckets) -> None:
        labels = _labels(point.attributes, names)
        total = 0
        buckets = []
        for bound, count in zip(chain(point.explicit_bounds, ["+Inf"]), point.bucket_counts, strict=False):
            total += count
            buckets.append((f"{bound}", total))
        bucket = om.escape_metric_name(f"{name}_bucket", escaping)
        for bound, cumulative in buckets:
            text = _label_text_of({**labels, "le": bound}, escaping)
            out.append(f"{bucket}{text} {_value(cumulative)}\n")
        if buckets and float(buckets[0][0]) >= 0:
            text = _label_text_of(labels, escaping)
            count_name, sum_name = (om.escape_metric_name(f"{name}_{part}", escaping) for part in ("count", "sum"))
            out.append(f"{count_name}{text} {_value(buckets[-1][1])}\n")
            out.append(f"{sum_name}{text} {_value(point.sum)}\n")

    def _target_info(self, resource: Resource, attributes: Mapping[str, Any], fmt: Format) -> str:
        """target_info: the resource's attributes as labels, made once per resource and rendering
        (keyed by what changes the text, not the content type, whose version a client may choose)."""
        key = (id(resource), fmt.openmetrics, fmt.escaping)
        cached = self._target.get(key)
        if cached is not None and cached[0] is resource:
            return cached[1]
        labels = {sanitize_attribute(k): _label_value(v) for k, v in attributes.items()}
        text = _label_text_of(labels, fmt.escaping)
        info = om.escape_metric_name("target_info", fmt.escaping)
        if fmt.openmetrics:
            target = om.escape_metric_name("target", fmt.escaping)
            head = f"# HELP {target} Target metadata\n# TYPE {target} info\n"
        else:
            head = f"# HELP {info} Target metadata\n# TYPE {info} gauge\n"
        rendered = f"{head}{info}{text} 1.0\n"
        self._target[key] = (resource, rendered)
        return rendered


def _label_names(attribute_sets: Iterable[Mapping[str, Any] | None]) -> tuple[str, ...]:
    raw: set[str] = set()
    for attributes in attribute_sets:
        raw.update(attributes or ())
    return tuple(sorted({sanitize_attribute(key) for key in raw}))


def _labelled(names: tuple[str, ...], escaping: str) -> str:
    """The escaping a family's label texts are kept under: label names of Prometheus' legacy
    set are written alike by every escaping but dots, so such a family's label texts are
    shared by underscores, values and allow-utf-8."""
    return escaping if escaping == om.DOTS or not all(map(_LEGACY_NAME.fullmatch, names)) else om.UNDERSCORES


def _labels(attributes: Mapping[str, Any] | None, names: Sequence[str]) -> dict[str, str]:
    labels = {name: "" for name in names}
    for key, value in (attributes or {}).items():
        labels[sanitize_attribute(key)] = _label_value(value)
    return labels


def _label_text(attributes: Mapping[str, Any] | None, names: Sequence[str], escaping: str) -> str:
    return _label_text_of(_labels(attributes, names), escaping)


def _label_text_of(labels: Mapping[str, str], escaping: str) -> str:
    if not labels:
        return ""
    body = ",".join(f'{_label_name(k, escaping)}="{_escape_value(v)}"' for k, v in sorted(labels.items()))
    return "{" + body + "}"


@functools.lru_cache(maxsize=4096)
def _label_name(name: str, escaping: str) -> str:
    """A label name as `escaping` writes it: a few names, written for every series, and
    prometheus_client's escaping of one is half the cost of a series' label text."""
    return str(om.escape_label_name(name, escaping))
