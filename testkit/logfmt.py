"""logfmt lines read back into their pairs, as go-logfmt (and Loki's `logfmt` stage) reads them:
`key=bare` or `key="quoted"`, pairs apart by spaces, a quoted value's escapes JSON's (go-logfmt's
unquoting is encoding/json's)."""

from __future__ import annotations

import json
import re

_PAIR = re.compile(r'([^\s="]+)=("(?:[^"\\]|\\.)*"|[^\s="]*)(?:\s+|$)')


def parse_logfmt(line: str) -> dict[str, str]:
    """The pairs of one line, in order; ValueError where the line is not logfmt."""
    pairs: dict[str, str] = {}
    text = line.rstrip("\n")
    position = 0
    while position < len(text):
        match = _PAIR.match(text, position)
        if match is None:
            raise ValueError(f"not logfmt at {position}: {text[position : position + 40]!r}")
        key, value = match.groups()
        assert key not in pairs, f"{key} twice in {line!r}"
        pairs[key] = json.loads(value) if value.startswith('"') else value
        position = match.end()
    return pairs
