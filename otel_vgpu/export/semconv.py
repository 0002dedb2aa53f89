"""The OTLP push under OpenTelemetry's semantic conventions (`--otlp-names semconv`): one
collection of the SDK's, rewritten, by a pure function that reads the contract table's
declarations (each `Family`'s `semconv` form, otel_vgpu/conventions.py). The scrape and the
push of the agent's own names never come here.

- A family with a form takes its name, unit and instrument (a gauge of the agent's pushed as an
  updowncounter is a cumulative non-monotonic sum), and its points the form's fixed attributes:
  families of one name become one metric (hw.gpu.utilization of each `hw.gpu.task`,
  hw.temperature of each `hw.sensor_location`, hw.errors of each `error.type`). A family
  without one keeps its name; the original exporter's (--seed-metrics) are left out.
- The scrape's labels never reach a point: a GPU's become the hardware conventions' GPU
  attributes (`hw.id` its UUID, `hw.name` gpu<index>, `hw.model`, `hw.vendor`, and
  `hw.driver_version` from the GPU's vgpu.gpu.info point; `hw.type` gpu on every hw.* metric,
  which hw.energy, hw.power and hw.errors require); a pod's point keeps the GPU's `hw.id` alone;
  every other label is `vgpu.<label>` (vgpu.xid, vgpu.reader, vgpu.mig.profile). A label
  without a value is left out, as Prometheus reads it.
- `hw.gpu.memory.utilization` is made, for each GPU with both, as its hw.gpu.memory.usage over
  its hw.gpu.memory.limit: the fraction of memory used the convention means, not the memory's
  busy time (vgpu.gpu.memory_copy.utilization, which keeps its name).
- Each pod's points go to a Resource of their own (each pod and container's, with
  --by-container), as the Collector's kubeletstats receiver emits pods: the node's attributes and
  `k8s.pod.uid`, `k8s.pod.name`, `k8s.namespace.name` (`k8s.container.name`, or `container.id`
  where the container is known by its ID alone), which the k8sattributes processor associates by,
  reading Resource attributes only. A pod the Kubernetes API did not name has its UID alone.
  The node's Resource drops the agent's own pod attributes (the manifests put them in
  OTEL_RESOURCE_ATTRIBUTES), which would otherwise stand for every GPU series' pod.
- Equal Resources are one ResourceMetrics: the SDK's encoder keys them by Resource, and would
  keep one of two.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_vgpu.conventions import Form, Kind
from otel_vgpu.export.families import FAMILIES, Family, Feature

SCRAPE_ONLY = ("pod", "namespace", "pod_uid", "container", "gpu_id", "gpu_uuid", "gpu_model")
"""The scrape's labels that name a pod or a GPU: on this push, Resource and hw.* attributes."""
AGENT_POD = ("k8s.pod.uid", "k8s.pod.name", "k8s.namespace.name", "k8s.container.name")
"""The agent's own pod, which the node's Resource leaves out: each pod's Resource names its own."""
VENDOR = "NVIDIA"
MEMORY_UTILIZATION = Form(
    "hw.gpu.memory.utilization",
    "1",
    Kind.GAUGE,
    "Fraction of GPU memory used: hw.gpu.memory.usage over hw.gpu.memory.limit.",
)
"""Made from the two forms it divides (`MEMORY_PARTS`), never from the memory's busy time."""
MEMORY_PARTS = ("hw.gpu.memory.usage", "hw.gpu.memory.limit")
# A container runtime's ID (pods/cgroups.py); a container's name is a DNS label, 63 at most.
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")

_BY_NAME: dict[str, Family[Any]] = {family.name: family for family in FAMILIES}


def forms() -> tuple[tuple[Form, tuple[Family[Any], ...]], ...]:
    """Each name of this push that is not a family's own, with its form (the fixed attributes
    left out) and the families it is made from, in the table's order; hw.gpu.memory.utilization
    from the two it divides."""
    made: dict[str, tuple[Form, list[Family[Any]]]] = {}
    for family in FAMILIES:
        if family.semconv is not None:
            form = dataclasses.replace(family.semconv, attributes=())
            made.setdefault(form.name, (form, []))[1].append(family)
    parts = [family for name in MEMORY_PARTS for family in made[name][1]]
    made[MEMORY_UTILIZATION.name] = (MEMORY_UTILIZATION, parts)
    return tuple((form, tuple(families)) for form, families in made.values())


def translate(data: MetricsData, start_time_unix_nano: int) -> MetricsData:
    """`data`, one collection of the agent's names, under the semantic conventions.
    `start_time_unix_nano`: the start of an updowncounter made from a gauge, whose points have none."""
    out = _Out(start_time_unix_nano)
    for resource_metrics in data.resource_metrics:
        given = resource_metrics.resource
        node = Resource(
            {k: v for k, v in given.attributes.items() if k not in AGENT_POD}, resource_metrics.resource.schema_url
        )
        for scope_metrics in resource_metrics.scope_metrics:
            drivers = _drivers(scope_metrics.metrics)
            for metric in scope_metrics.metrics:
                family = _BY_NAME.get(metric.name)
                if family is not None and family.needs is Feature.SEED_METRICS:
                    continue
                form = family.semconv if family is not None else None
                for point in metric.data.data_points:
                    labels = point.attributes or {}
                    resource = node if "pod_uid" not in labels else _pod_resource(node, labels)
                    attributes = _attributes(labels, drivers, hardware=form is not None and form.name.startswith("hw."))
                    if form is not None:
                        attributes.update(form.fixed)
                    changed = _point(point, attributes, form)
                    out.add(resource, scope_metrics.scope, metric, form, changed)
    return out.data()


def _point(point: Any, attributes: dict[str, Any], form: Form | None) -> Any:
    """`point` with `attributes`, its value an integer where `form` says so."""
    if not isinstance(point, NumberDataPoint):  # a histogram's, which keeps its name
        return dataclasses.replace(point, attributes=attributes)
    value = round(point.value) if form is not None and form.integer else point.value
    return dataclasses.replace(point, attributes=attributes, value=value)


def _drivers(metrics: Sequence[Metric]) -> dict[str, str]:
    """Each GPU's driver version, by UUID, as its vgpu.gpu.info point says."""
    info = next((m for m in metrics if m.name == "vgpu.gpu.info"), None)
    if info is None:
        return {}
    return {
        str(labels["gpu_uuid"]): str(labels["driver_version"])
        for labels in (point.attributes or {} for point in info.data.data_points)
        if labels.get("gpu_uuid") and labels.get("driver_version")
    }


def _pod_resource(node: Resource, labels: Mapping[str, Any]) -> Resource:
    """The Resource of a pod's point: the node's, and the pod (and its container) it is of."""
    pod = {"k8s.pod.uid": str(labels["pod_uid"])}
    # A pod the Kubernetes API did not name has no namespace, and its UID for a name
    # (collect/aggregate.py): it is told by its UID alone, which k8sattributes fills in from.
    if labels.get("namespace"):
        pod["k8s.pod.name"] = str(labels["pod"])
        pod["k8s.namespace.name"] = str(labels["namespace"])
    container = str(labels.get("container") or "")
    if container:
        pod["container.id" if _CONTAINER_ID.fullmatch(container) else "k8s.container.name"] = container
    return Resource({**node.attributes, **pod}, node.schema_url)


def _attributes(labels: Mapping[str, Any], drivers: Mapping[str, str], hardware: bool) -> dict[str, Any]:
    """A point's attributes from its scrape labels: a GPU's point has the GPU attributes of the
    hardware conventions (`hw.type` on an hw.* metric), a pod's the GPU's hw.id alone."""
    out: dict[str, Any] = {}
    uuid = labels.get("gpu_uuid")
    if uuid:
        out["hw.id"] = uuid
        if "pod_uid" not in labels:
            out["hw.name"] = f"gpu{labels.get('gpu_id', '')}"
            out["hw.model"] = labels.get("gpu_model", "")
            out["hw.vendor"] = VENDOR
            out["hw.driver_version"] = drivers.get(str(uuid), "")
            if hardware:
                out["hw.type"] = "gpu"
    for label, value in labels.items():
        if label in SCRAPE_ONLY:
            continue
        name = "hw.driver_version" if label == "driver_version" else "vgpu." + label.replace("_", ".")
        out[name] = value
    return {k: v for k, v in out.items() if v != ""}


@dataclass
class _Metric:
    """One metric of the output as it is gathered: its first source's header, and its points."""

    source: Metric
    form: Form | None
    points: list[Any] = field(default_factory=list)


@dataclass
class _Out:
    """The output, gathered by Resource, scope and name, in the order they come."""

    start_time_unix_nano: int
    resources: dict[Resource, dict[InstrumentationScope, dict[str, _Metric]]] = field(default_factory=dict)

    def add(
        self, resource: Resource, scope: InstrumentationScope, source: Metric, form: Form | None, point: Any
    ) -> None:
        # Resource's equality and hash are its attributes' (and schema URL's): equal ones are one.
        metrics = self.resources.setdefault(resource, {}).setdefault(scope, {})
        name = form.name if form is not None else source.name
        metrics.setdefault(name, _Metric(source, form)).points.append(point)

    def data(self) -> MetricsData:
        resources = []
        for resource, scopes in self.resources.items():
            scope_metrics = []
            for scope, metrics in scopes.items():
                _add_memory_utilization(metrics)
                built = [self._metric(gathered) for gathered in metrics.values()]
                scope_metrics.append(ScopeMetrics(scope, built, ""))
            resources.append(ResourceMetrics(resource, scope_metrics, resource.schema_url))
        return MetricsData(resources)

    def _metric(self, gathered: _Metric) -> Metric:
        source, form = gathered.source, gathered.form
        if form is None:
            kept: Any = source.data  # its own kind: a gauge, a sum or a histogram
            return dataclasses.replace(source, data=dataclasses.replace(kept, data_points=gathered.points))
        data: Gauge | Sum
        if form.kind is Kind.GAUGE:
            data = Gauge(gathered.points)
        elif form.kind is Kind.COUNTER:
            # A counter's form is a counter family's (tests/system/test_otlp_semconv.py): its sum as it is.
            data = Sum(gathered.points, AggregationTemporality.CUMULATIVE, is_monotonic=True)
        else:
            points = [
                dataclasses.replace(point, start_time_unix_nano=point.start_time_unix_nano or self.start_time_unix_nano)
                for point in gathered.points
            ]
            data = Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=False)
        return Metric(form.name, form.description, form.unit, data)


def _add_memory_utilization(metrics: dict[str, _Metric]) -> None:
    """hw.gpu.memory.utilization of each GPU that has both its usage and its limit here."""
    usage, limit = (metrics.get(name) for name in MEMORY_PARTS)
    if usage is None or limit is None:
        return
    limits = {point.attributes.get("hw.id"): point.value for point in limit.points}
    points = [
        NumberDataPoint(point.attributes, None, point.time_unix_nano, point.value / limits[hw_id])  # type: ignore[arg-type]
        for point in usage.points
        if limits.get(hw_id := point.attributes.get("hw.id"))
    ]
    if points:
        metrics[MEMORY_UTILIZATION.name] = _Metric(usage.source, MEMORY_UTILIZATION, points)
