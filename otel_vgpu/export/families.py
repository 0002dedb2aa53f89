"""The metric contract, in one table: every family the agent publishes, and how it is read.

Each entry (a `Family`, export/family.py) has its OpenTelemetry instrument name and UCUM
unit, the kind of instrument, its `Subject` (export/subjects.py: which rows of a collection
it has a series for, and the labels of each), how its value is read from one of those rows,
and the Prometheus name a scrape shows (`prometheus_name`, written out and held by
tests/unit/export/test_families.py to the OpenTelemetry-to-Prometheus rules of
opentelemetry-exporter-prometheus). The entries are written by subject, in
export/pod_families.py, gpu_families.py and agent_families.py, those made from gpu/'s figure
tables in export/figure_families.py; `FAMILIES` is their one table. The telemetry builds
every instrument from it in one loop, as kube-state-metrics builds its families from
`FamilyGenerator`s; the metric tables of docs/metrics.md are generated from it
(`scripts/gen-metric-tables.py`, checked current by tests/system/test_docs.py), and
tests/unit/export/test_families.py tests each subject's families as rows in, observations out.

How to add a family, by where its value comes from: docs/layout.md, "Adding a figure".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otel_vgpu.collect.reading import Read
from otel_vgpu.export.agent_families import AGENT_FAMILIES
from otel_vgpu.export.family import Family, Feature, Instrument
from otel_vgpu.export.figure_families import POD_ENGINES
from otel_vgpu.export.gpu_families import GPU_FAMILIES
from otel_vgpu.export.pod_families import POD_FAMILIES, SEED_FAMILIES
from otel_vgpu.export.subjects import (
    AGENT,
    GPU,
    GPU_HEALTH,
    GPU_INFO,
    GPU_LABELS,
    KNOWN,
    POD,
    POD_COUNTED,
    POD_LABELS,
    READERS,
    REFUSALS,
    SEED,
    SEED_LABELS,
    STAGES,
    SUBJECTS,
    SWEEPS,
    UNATTRIBUTED,
    XID,
    XID_LAST,
    Observed,
    Subject,
)
from otel_vgpu.patterns import compile_pattern

# What the rest of the agent, the scripts and the tests read of the contract, from here.
__all__ = [
    "AGENT",
    "DOC_TABLES",
    "FAMILIES",
    "GPU",
    "GPU_HEALTH",
    "GPU_INFO",
    "KNOWN",
    "POD",
    "POD_COUNTED",
    "POD_ENGINES",
    "READERS",
    "REFUSALS",
    "SEED",
    "STAGES",
    "SUBJECTS",
    "SWEEPS",
    "UNATTRIBUTED",
    "XID",
    "XID_LAST",
    "Family",
    "Feature",
    "Instrument",
    "Observed",
    "Subject",
    "families_markdown",
    "of_subject",
    "reads_of",
    "selected",
]

FAMILIES: tuple[Family[Any], ...] = (*POD_FAMILIES, *GPU_FAMILIES, *SEED_FAMILIES, *AGENT_FAMILIES)
"""The whole table, in the order a scrape shows it: the pods', the GPUs', the original
exporter's, the agent's."""


def of_subject(*subjects: Subject[Any]) -> tuple[Family[Any], ...]:
    return tuple(family for family in FAMILIES if any(family.subject is subject for subject in subjects))


def selected(allow: Sequence[str] = (), deny: Sequence[str] = ()) -> tuple[tuple[Family[Any], ...], list[str]]:
    """The families `allow` keeps (all, when empty) less those `deny` names, and the patterns
    that name no family. A pattern is a regular expression matched against the whole of a
    family's Prometheus name, its OpenTelemetry name or its semantic-conventions name (any of
    `Family.names`), as kube-state-metrics' --metric-allowlist and --metric-denylist match
    theirs: an operator who reads the semconv push writes `hw[.]gpu[.].*` and names the families
    it is pushed from. A semconv name is a metric several families make, and names each of them."""

    compiled = {text: compile_pattern(text) for text in (*allow, *deny)}

    def named(pattern: str, family: Family[Any]) -> bool:
        return any(compiled[pattern].names(name) for name in family.names)

    unmatched = [p for p in (*allow, *deny) if not any(named(p, family) for family in FAMILIES)]
    kept = tuple(
        family
        for family in FAMILIES
        if (not allow or any(named(p, family) for p in allow)) and not any(named(p, family) for p in deny)
    )
    return kept, unmatched


def reads_of(families: Sequence[Family[Any]]) -> frozenset[Read]:
    """What sweeps must read for `families`: the union of what each needs."""
    return frozenset(read for family in families for read in family.reads)


# The tables of docs/metrics.md: the subjects each covers, in order, and the line that heads it.
DOC_TABLES = (
    ((POD, POD_COUNTED), "Per (pod, GPU or MIG device), labels `namespace`, `pod`, `pod_uid`, `gpu_id`, `gpu_uuid`:"),
    ((GPU, GPU_INFO, UNATTRIBUTED, KNOWN), "Per GPU, labels `gpu_id`, `gpu_uuid`, `gpu_model`:"),
    (
        (GPU_HEALTH, XID, XID_LAST),
        "Per GPU, its health, read every 10 s off the scrape's path, labels `gpu_id`, `gpu_uuid`, `gpu_model`:",
    ),
    ((AGENT, STAGES, REFUSALS, SWEEPS, READERS), "The agent itself:"),
    ((SEED,), "With `--seed-metrics`, the original exporter's, labels `pod`, `gpu_id`:"),
)


def semconv_name(family: Family[Any]) -> str:
    """What a family is on the push with --otlp-names semconv, for the tables: its form's name,
    fixed attributes and instrument, or its own name."""
    if family.needs is Feature.SEED_METRICS:
        return "not pushed"
    form = family.semconv
    if form is None:
        return f"`{family.name}`"
    fixed = ",".join(f'{key}="{value}"' for key, value in form.attributes)
    return f"`{form.name}{{{fixed}}}` {form.kind.value}" if fixed else f"`{form.name}` {form.kind.value}"


def families_markdown() -> str:
    """The metric tables of docs/metrics.md, made from this table (scripts/gen-metric-tables.py
    writes them there, tests/system/test_docs.py checks the doc holds them): each family's name as a
    scrape shows it, its type, its name on the push with --otlp-names semconv and its help text."""
    out = []
    for subjects, heading in DOC_TABLES:
        out += [heading, "", "| name | type | with `--otlp-names semconv` | meaning |", "|---|---|---|---|"]
        for family in of_subject(*subjects):
            labels = [label for label in family.labels if label not in POD_LABELS + GPU_LABELS + SEED_LABELS]
            name = f"`{family.prometheus_name}{{{','.join(labels)}}}`" if labels else f"`{family.prometheus_name}`"
            meaning = family.description.replace("|", "\\|").replace("<", "\\<").replace("*", "\\*")
            out.append(f"| {name} | {family.instrument.value} | {semconv_name(family)} | {meaning} |")
        out.append("")
    return "\n".join(out)
