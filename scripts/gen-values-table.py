#!/usr/bin/env python3
"""Rewrites the table of the chart's values in docs/chart-values.md and the chart's README, made from
the `# --` comment above each key of charts/otel-vgpu/values.yaml (tests/system/test_chart.py checks
that both hold exactly this): .venv/bin/python scripts/gen-values-table.py

A key with a comment is one row, its default the whole value below it; a key
without one is a section, and each key under it needs a comment of its own."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

VALUES = Path(__file__).resolve().parents[1] / "charts" / "otel-vgpu" / "values.yaml"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][\w]*):(?P<rest>.*)$")
_DOC = re.compile(r"^ *# -- ?(?P<text>.*)$")


def rows(text: str, where: str = "values.yaml") -> list[tuple[str, str]]:
    """(dotted key, description) for every documented key, in file order."""
    found: list[tuple[str, str]] = []
    path: list[tuple[int, str]] = []
    inside: int | None = None  # the indent of the documented key whose value the lines are part of
    doc: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        comment = _DOC.match(line)
        match = _KEY.match(line)
        if comment:
            doc = comment.group("text")
        elif match:
            indent = len(match.group("indent"))
            if inside is not None and indent > inside:
                continue  # a key of a documented value: part of its default
            inside = None
            while path and path[-1][0] >= indent:
                path.pop()
            path.append((indent, match.group("key")))
            dotted = ".".join(key for _, key in path)
            if doc is not None:
                found.append((dotted, doc))
                inside = indent
            elif match.group("rest").strip():
                raise ValueError(f"{where}:{number}: {dotted} has no `# --` comment above it")
            doc = None
        elif line.strip() and not line.lstrip().startswith("#") and inside is None:
            raise ValueError(f"{where}:{number}: {line.strip()!r} belongs to no documented key")
    return found


def _default(values: dict[str, Any], dotted: str) -> str:
    value: Any = values
    for key in dotted.split("."):
        value = value[key]
    return json.dumps(value, separators=(", ", ": "))


def values_table(text: str) -> str:
    values = yaml.safe_load(text)
    lines = ["| value | default | what it does |", "|---|---|---|"]
    for dotted, doc in rows(text):
        default = _default(values, dotted).replace("|", "\\|")
        described = doc.replace("|", "\\|")
        lines.append(f"| `{dotted}` | `{default}` | {described} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from doc_blocks import write_block

    try:
        table = values_table(VALUES.read_text())
    except ValueError as error:
        print(error, file=sys.stderr)
        sys.exit(1)
    write_block("chart values table", table)
