"""The README's generated blocks, each between `<!-- begin NAME -->` and `<!-- end NAME -->`
(HTML comments: a Markdown page shows neither): the generators rewrite their block in place, so
a new flag, family or value is one command away from its row."""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def rewritten(text: str, name: str, body: str) -> str:
    """`text` with block `name` holding `body`; ValueError if the README has no such block."""
    begin, end = f"<!-- begin {name} -->\n", f"<!-- end {name} -->"
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        raise ValueError(f"{README.name} has no block {begin.strip()} ... {end}: put the two markers where it goes")
    return text[: start + len(begin)] + body + text[stop:]


def write_block(name: str, body: str, readme: Path = README) -> None:
    """Rewrite block `name` of `readme` (the README) with `body`, and say whether it changed; exit 1
    on no block."""
    text = readme.read_text()
    try:
        new = rewritten(text, name, body)
    except ValueError as error:
        sys.exit(f"{sys.argv[0]}: {error}")
    if new != text:
        readme.write_text(new)
    print(f"{readme.relative_to(README.parent)}: {name} {'rewritten' if new != text else 'already current'}")
