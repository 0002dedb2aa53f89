"""The lists docs/metrics.md gives of the families, made from their declarations
(otel_vgpu/export/families.py, otel_vgpu/health.py) so that a new figure, read or stage is in
them without an edit:

- the denylist that turns the health and GPM families off (those that need a health, GPM or XID
  read), which bench/health_families_cost.py turns them off with too;
- which families each of a sweep's optional reads is made for;
- the stages of vgpu_agent_collection_errors_total.

scripts/gen-metric-tables.py writes them where scripts/doc_blocks.py says; tests/test_docs.py
fails when one is stale. A release note names the block, never the pattern: the note is frozen
when it ships, and the pattern grows with each figure (docs/upgrading.md).
"""

from __future__ import annotations

import ast
import inspect
import itertools

from otel_vgpu.collect.reading import Read
from otel_vgpu.export.families import FAMILIES
from otel_vgpu.health import COLLECTION_STAGES

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
    """The stages vgpu_agent_collection_errors_total counts failures by (otel_vgpu/health.py)."""
    names = [f"`{stage.value}`" for stage in COLLECTION_STAGES]
    return f"The stages of `vgpu_agent_collection_errors_total{{stage}}` are {', '.join(names[:-1])} and {names[-1]}.\n"


# Each block of docs/metrics.md this module makes, by the name scripts/doc_blocks.py gives it.
BLOCKS = {
    "health and GPM off": health_and_gpm_off_markdown,
    "family reads": reads_markdown,
    "collection stages": stages_markdown,
}
