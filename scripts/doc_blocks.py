"""The docs' generated blocks, each between `<!-- begin NAME -->` and `<!-- end NAME -->`
(HTML comments: a Markdown page shows neither): each generator rewrites its block in place in
every doc that holds it, so a new flag, family or value is one command away from its row.

BLOCKS says which docs hold which block; the tests read it too, so that a block moved to
another doc is moved here once and checked where it now lives."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BLOCKS: dict[str, tuple[Path, ...]] = {
    "flag table": (ROOT / "docs" / "flags.md",),
    "metric tables": (ROOT / "docs" / "metrics.md",),
    # The lists of docs/metrics.md made from the families' declarations (family_lists.py).
    "collection stages": (ROOT / "docs" / "metrics.md",),
    "family reads": (ROOT / "docs" / "metrics.md",),
    "health and GPM off": (ROOT / "docs" / "metrics.md",),
    "semconv names": (ROOT / "docs" / "metrics.md",),
    "dcgm-exporter generations": (ROOT / "docs" / "coming-from.md",),
    "dcgm-exporter optional fields": (ROOT / "docs" / "coming-from.md",),
    # The chart's README is what `helm show readme` prints, so it carries the table too.
    "chart values table": (ROOT / "docs" / "chart-values.md", ROOT / "charts" / "otel-vgpu" / "README.md"),
}

_BEGIN = re.compile(r"^<!-- begin (?P<name>[^>]+?) -->$", re.MULTILINE)


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- begin {name} -->\n", f"<!-- end {name} -->"


def rewritten(text: str, name: str, body: str, where: str = "the doc") -> str:
    """`text` with block `name` holding `body`; ValueError if it has no such block."""
    begin, end = _markers(name)
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        raise ValueError(f"{where} has no block {begin.strip()} ... {end}: put the two markers where it goes")
    return text[: start + len(begin)] + body + text[stop:]


def block(text: str, name: str, where: str = "the doc") -> str:
    """What block `name` of `text` holds; ValueError if it has no such block."""
    begin, end = _markers(name)
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        raise ValueError(f"{where} has no block {begin.strip()} ... {end}")
    return text[start + len(begin) : stop]


def names_in(text: str) -> set[str]:
    """The blocks a doc holds, by name."""
    return {match.group("name") for match in _BEGIN.finditer(text)}


def write_block(name: str, body: str) -> None:
    """Rewrite block `name` with `body` in every doc BLOCKS names for it, and say whether each
    changed; exit 1 where a doc has no such block."""
    for doc in BLOCKS[name]:
        where = str(doc.relative_to(ROOT))
        text = doc.read_text()
        try:
            new = rewritten(text, name, body, where)
        except ValueError as error:
            sys.exit(f"{sys.argv[0]}: {error}")
        if new != text:
            doc.write_text(new)
        print(f"{where}: {name} {'rewritten' if new != text else 'already current'}")
