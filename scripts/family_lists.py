"""The lists docs/metrics.md gives of the families, made from their declarations
(otel_vgpu/export/families.py, otel_vgpu/agent_health.py) so that a new figure, read or stage is in
them without an edit:

- the denylist that turns the health and GPM families off (those that need a health, GPM or XID
  read), which bench/health_families_cost.py turns them off with too;
- which families each of a sweep's optional reads is made for;
- the stages of vgpu_agent_collection_errors_total;
- the names of the push with --otlp-names semconv that are no family's own, each with what
  Prometheus' OTLP ingestion names it (testkit/otlp_names.py, otlptranslator's rules).

scripts/gen-metric-tables.py writes them where scripts/doc_blocks.py says; tests/system/test_docs.py
fails when one is stale. A release note names the block, never the pattern: the note is frozen
when it ships, and the pattern grows with each figure (docs/upgrading.md).
"""

from __future__ import annotations

import ast
import inspect
import itertools

from otel_vgpu.agent_health import COLLECTION_STAGES
from otel_vgpu.collect.reading import Read
from otel_vgpu.conventions import Kind
from otel_vgpu.export.families import FAMILIES, POD
from otel_vgpu.export.semconv import forms
from testkit.otlp_names import prometheus_name

# The reads the health and GPM families are made for: the health figures (read every 10 s
# off the scrape's path), GPM's windows and the XID events' thread. With every family that
# needs one of them off, the agent makes none of their NVML calls (Family.reads).
HEALTH_AND_GPM = frozenset({Read.HEALTH, Read.GPM, Read.XID_EVENTS})


def health_and_gpm_off() -> tuple[str, ...]:
    """Patterns for --metric-denylist that name, by Prometheus name, exactly the families that
    need a health, GPM or XID read: one pattern per prefix (`vgpu_gpu_`, `vgpu_pod_`), each an
    alternation of whole names, so that none names a family beside them."""
    by_prefix: dict[str, list[str]] = {}
    for family in FAMILIES:
        if family.reads & HEALTH_AND_GPM:
            subject, kind, rest = family.prometheus_name.split("_", 2)
            by_prefix.setdefault(f"{subject}_{kind}_", []).append(rest)
    return tuple(f"{prefix}({'|'.join(names)})" for prefix, names in by_prefix.items())


def health_and_gpm_off_markdown() -> str:
    """The block of docs/metrics.md that holds the denylist, as one value of the flag."""
    return f"```text\n{','.join(health_and_gpm_off())}\n```\n"


def _member_docs(enum: type) -> dict[str, str]:
    """Each member's docstring, the string under its assignment in the class's source (Python
    keeps no docstring of an attribute): one line."""
    tree = ast.parse(inspect.getsource(enum))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out = {}
    for statement, after in itertools.pairwise(body):
        if (
            isinstance(statement, ast.Assign)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            target = statement.targets[0]
            if isinstance(target, ast.Name):
                out[target.id] = " ".join(after.value.value.split())
    return out


def reads_markdown() -> str:
    """Each read a sweep makes only for some families (collect/reading.py's Read), what it
    is, and the families that need it: with all of them off, it is not made."""
    docs = _member_docs(Read)
    rows = ["| read | what it is | made for |", "|---|---|---|"]
    for read in Read:
        families = ", ".join(f"`{f.prometheus_name}`" for f in FAMILIES if read in f.reads)
        rows.append(f"| `{read.value}` | {docs.get(read.name, '')} | {families} |")
    return "\n".join(rows) + "\n"


def stages_markdown() -> str:
    """The stages vgpu_agent_collection_errors_total counts failures by (otel_vgpu/agent_health.py)."""
    names = [f"`{stage.value}`" for stage in COLLECTION_STAGES]
    return f"The stages of `vgpu_agent_collection_errors_total{{stage}}` are {', '.join(names[:-1])} and {names[-1]}.\n"


# The attributes of a GPU's point and of a pod's, and a pod's Resource, on the semconv push (export/semconv.py).
_GPU_POINT = "`hw.id`, `hw.name`, `hw.model`, `hw.vendor`, `hw.driver_version`"
_POD_POINT = (
    "`hw.id`; its Resource: `k8s.pod.uid`, `k8s.pod.name`, `k8s.namespace.name` "
    "(`k8s.container.name` or `container.id`)"
)


def semconv_names_markdown() -> str:
    """Each name of the push with --otlp-names semconv that no family has of its own: its
    instrument, unit and attributes, the name Prometheus' OTLP ingestion gives it (the default
    UnderscoreEscapingWithSuffixes), and the families it is made from."""
    rows = [
        "| OTLP name | instrument | unit | attributes | in Prometheus (OTLP ingestion) | made from |",
        "|---|---|---|---|---|---|",
    ]
    for form, families in forms():
        per_pod = all(family.subject.name.startswith(POD.name) for family in families)
        attributes = _POD_POINT if per_pod else _GPU_POINT + (", `hw.type`" if form.name.startswith("hw.") else "")
        fixed: dict[str, list[str]] = {}
        for family in families:
            for key, value in family.semconv.attributes if family.semconv else ():
                fixed.setdefault(key, []).append(value)
        told = "; ".join(f"`{key}`: {', '.join(values)}" for key, values in fixed.items())
        data_type = "Gauge" if form.kind is Kind.GAUGE else "Sum"
        prometheus = prometheus_name(form.name, form.unit, data_type, monotonic=form.kind is Kind.COUNTER)
        made_from = ", ".join(f"`{family.name}`" for family in families)
        if form.name == "hw.gpu.memory.utilization":
            made_from = " over ".join(f"`{family.name}`" for family in families)
        rows.append(
            f"| `{form.name}` | {form.kind.value} | `{form.unit}` | {attributes}{'; ' + told if told else ''} "
            f"| `{prometheus}` | {made_from} |"
        )
    return "\n".join(rows) + "\n"


# Each block of docs/metrics.md this module makes, by the name scripts/doc_blocks.py gives it.
BLOCKS = {
    "semconv names": semconv_names_markdown,
    "health and GPM off": health_and_gpm_off_markdown,
    "family reads": reads_markdown,
    "collection stages": stages_markdown,
}
