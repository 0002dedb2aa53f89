"""OpenTelemetry's semantic conventions as their YAML says them (tests/data/semconv/, copied from
open-telemetry/semantic-conventions at tag v1.44.0, each file's first line naming its commit and
path): each metric's instrument, unit and value type, its attributes by requirement level with
its attribute groups expanded and a refinement's applied, and each attribute of the registries.

The metric files are weaver's `definition/2` schema (`metrics:`, `metric_refinements:`,
`attribute_groups:`, attributes as `ref` or `ref_group`); the registries are `groups:` of
attributes by `id`. Both are read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testkit.agent import ROOT

MODEL = ROOT / "tests" / "data" / "semconv" / "model"
TAG = "v1.44.0"


@dataclass(frozen=True)
class Attribute:
    name: str
    stability: str
    members: tuple[str, ...]
    """An enum's values; empty for a string (or other) attribute."""


@dataclass(frozen=True)
class MetricConvention:
    name: str
    instrument: str
    """gauge, counter or updowncounter."""
    unit: str
    value_type: str
    """int or double (`annotations.code_generation.metric_value_type`)."""
    attributes: dict[str, Any]
    """Each attribute's requirement level: required, recommended, or {conditionally_required: ...}."""


def _documents() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(MODEL.rglob("*.yaml")):
        text = path.read_text()
        assert text.startswith(f"# open-telemetry/semantic-conventions, tag {TAG} "), path
        out.append((path, yaml.safe_load(text)))
    return out


def registry() -> dict[str, Attribute]:
    """Every attribute the registries copied here define, by name."""
    out = {}
    for _, document in _documents():
        for group in document.get("groups") or ():
            if group.get("type") != "attribute_group":  # the k8s metrics and entities, in the old schema
                continue
            for attribute in group.get("attributes") or ():
                kind = attribute.get("type")
                members = (
                    tuple(m["value"] if "value" in m else m["id"] for m in kind["members"])
                    if isinstance(kind, dict)
                    else ()
                )
                out[attribute["id"]] = Attribute(attribute["id"], attribute["stability"], members)
    return out


def _expanded(attributes: list[dict[str, Any]], groups: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attribute in attributes:
        if "ref_group" in attribute:
            out.update(_expanded(groups[attribute["ref_group"]], groups))
        else:
            out[attribute["ref"]] = attribute.get("requirement_level", "recommended")
    return out


def metrics(refinement: str = "gpu") -> dict[str, MetricConvention]:
    """Every metric of the files copied here, by name, with the refinement `metric.hw.<refinement>.*`
    applied where one refines it: its attributes added, a requirement level it leaves unsaid the base's."""
    documents = [document for _, document in _documents()]
    groups = {g["id"]: g["attributes"] for d in documents for g in d.get("attribute_groups") or ()}
    out: dict[str, MetricConvention] = {}
    for document in documents:
        for metric in document.get("metrics") or ():
            out[metric["name"]] = MetricConvention(
                metric["name"],
                metric["instrument"],
                metric["unit"],
                metric["annotations"]["code_generation"]["metric_value_type"],
                _expanded(metric["attributes"], groups),
            )
    for document in documents:
        for refined in document.get("metric_refinements") or ():
            if not refined["id"].startswith(f"metric.hw.{refinement}."):
                continue
            base = out[refined["ref"]]
            added: dict[str, Any] = {}
            for attribute in refined["attributes"]:
                if "ref_group" in attribute:
                    added.update(_expanded(groups[attribute["ref_group"]], groups))
                else:
                    name = attribute["ref"]
                    added[name] = attribute.get("requirement_level", base.attributes.get(name, "recommended"))
            out[base.name] = MetricConvention(
                base.name, base.instrument, base.unit, base.value_type, {**base.attributes, **added}
            )
    return out
