"""The operator's patterns over family names (--metric-allowlist, --metric-denylist), matched
as Prometheus and kube-state-metrics match theirs: RE2 syntax, whole names, in time linear in
the name. Python's `re` backtracks: `(\\w|\\w)*!` took 0.6 s on a 22-character name, doubling
with each character, and hung the agent's start. RE2 (google-re2, Google's own binding)
never backtracks, and refuses what it cannot match so: lookarounds, backreferences.

The chart checks the same patterns with Go's RE2 (charts/otel-vgpu/templates/_helpers.tpl),
so that a pattern refused by one is refused by the other; tests/system/test_chart.py holds them to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import re2

# Go's RE2 refuses \C (any byte), which C++ RE2 takes: refused here too, as the chart does.
GO_REFUSES = ("\\C",)

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refusal is the caller's to say, once, not RE2's on stderr


class PatternError(ValueError):
    """A pattern RE2 refuses; the message says why, in RE2's words."""


@dataclass(frozen=True, slots=True)
class Pattern:
    """One compiled pattern, matching whole names."""

    text: str
    _compiled: re2._Regexp

    def names(self, name: str) -> bool:
        return self._compiled.fullmatch(name) is not None


def compile_pattern(text: str) -> Pattern:
    """`text` compiled as RE2; PatternError where RE2 (C++ or Go's) refuses it."""
    for construct in GO_REFUSES:
        if _escapes(text, construct):
            raise PatternError(f"invalid escape sequence: {construct}")
    try:
        # Anchored as Prometheus anchors its own (^(?:<regex>)$) and as the chart checks it
        # ((?:<regex>)|): a pattern is read alike by the three.
        return Pattern(text, re2.compile(f"(?:{text})", _OPTIONS))
    except re2.error as error:
        reason = error.args[0] if error.args else error
        said = reason.decode() if isinstance(reason, bytes) else str(reason)
        raise PatternError(said.replace(f"(?:{text})", text)) from None


def _escapes(text: str, construct: str) -> bool:
    """Whether `construct` (a backslash escape) occurs in `text` as an escape, not after an
    escaped backslash."""
    at = text.find(construct)
    while at >= 0:
        backslashes = len(text[:at]) - len(text[:at].rstrip("\\"))
        if backslashes % 2 == 0:
            return True
        at = text.find(construct, at + 1)
    return False
