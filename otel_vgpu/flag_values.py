"""Each flag's text read into its value, or refused with one line that says what is valid.

The parsers of the flag table (config.py's FLAGS) and the words they know: argparse calls
each on a flag's text, and `Flag.from_text` on an environment variable's; a bad value raises
argparse.ArgumentTypeError, whose message names the value and what was expected.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_vgpu.logs import FORMATS as LOG_FORMATS
from otel_vgpu.patterns import PatternError, compile_pattern

# Resources that are quantities, not devices: HAMi's memory and cores. Summed
# as shares they would turn `nvidia.com/gpumem: 4000` into 4000 GPUs.
NOT_DEVICE_COUNTS = ("nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores")
LOG_LEVELS = ("debug", "info", "warning", "error")
# Other names of a level: WARN, as Go's and Java's loggers and most charts spell it.
LOG_LEVEL_ALIASES = {"warn": "warning"}
# The levels as --help and an error say them, the other names beside theirs.
LOG_LEVEL_WORDS = ", ".join(
    " or ".join([level, *(alias for alias, named in LOG_LEVEL_ALIASES.items() if named == level)])
    for level in LOG_LEVELS
)
# How a switch's environment twin says on and off.
TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"", "0", "false", "no", "off"}
BUILTIN_SCENARIO = "builtin"


def number(kind: type[int] | type[float], what: str, low: float, high: float, low_open: bool = False) -> Any:
    """A parser: a number of `kind` within [low, high] ((low, high] with low_open)."""
    if kind is int:
        valid = f"a whole number from {low:g} to {high:g}"
    else:
        valid = f"a number {'above' if low_open else 'from'} {low:g} {'and at most' if low_open else 'to'} {high:g}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: expected {valid}") from None
        if not (low < value if low_open else low <= value) or value > high:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: expected {valid}")
        return value

    return parse


# The shortest interval any loop of the agent's may take: NVML's per-process and device samples
# come one per 200 ms period (bench/results/h200-nvml-samples.md), so a sweep or a look more
# often than twice a period reads nothing new, and only burns CPU (a sweep interval of 1e-9
# took 96 % of a core).
MIN_INTERVAL_S = 0.1


def interval(what: str, high: float, off: str | None = None) -> Any:
    """A parser: seconds from MIN_INTERVAL_S to `high`; with `off`, also 0, which means `off`."""
    valid = f"a number of seconds from {MIN_INTERVAL_S:g} to {high:g}"
    if off is not None:
        valid = f"0 ({off}) or {valid}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: expected {valid}") from None
        if (value == 0 and off is not None) or MIN_INTERVAL_S <= value <= high:
            return value
        raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: expected {valid}")

    return parse


OTLP_SEMCONV = "semconv"
OTLP_NAMES = ("vgpu", OTLP_SEMCONV)
"""--otlp-names: the agent's own names on the OTLP push, or the semantic conventions' (export/semconv.py)."""


def otlp_names(text: str) -> str:
    if text.strip().lower() not in OTLP_NAMES:
        raise argparse.ArgumentTypeError(
            f"invalid OTLP names {text!r}: expected vgpu (the agent's own, as scraped) or semconv "
            "(OpenTelemetry's semantic conventions)"
        )
    return text.strip().lower()


def log_level_name(text: str) -> str:
    """A level in any case (`WARN`, `Info`), WARN being warning's other name."""
    word = text.strip().lower()
    word = LOG_LEVEL_ALIASES.get(word, word)
    if word not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"invalid log level {text!r}: expected one of {LOG_LEVEL_WORDS}, in any case")
    return word


def log_format(text: str) -> str:
    """How each log line is written: text (as ever), or a JSON object or logfmt pairs for log pipelines."""
    word = text.strip().lower()
    if word not in LOG_FORMATS:
        raise argparse.ArgumentTypeError(f"invalid log format {text!r}: expected one of {', '.join(LOG_FORMATS)}")
    return word


@dataclass(frozen=True, slots=True)
class RenamedVariable:
    """A variable found set under its former name `old`: read as `new` is, unless the flag or
    `new` is given too (`ignored_for` names which), so that a deployment keeps working while a
    warning asks for the rename."""

    old: str
    new: str
    ignored_for: str | None = None

    def warning(self) -> str:
        if self.ignored_for:
            return f"{self.old} is deprecated, and ignored as {self.ignored_for} is given: remove it"
        return f"{self.old} is deprecated: rename it {self.new} (until then it is read as {self.new})"


def metric_patterns(text: str) -> tuple[str, ...]:
    """Comma-separated regular expressions over family names, as kube-state-metrics takes them."""
    patterns = tuple(part.strip() for part in text.split(",") if part.strip())
    for pattern in patterns:
        try:
            compile_pattern(pattern)
        except PatternError as error:
            raise argparse.ArgumentTypeError(
                f"invalid pattern {pattern!r}: {error}; expected comma-separated RE2 regular expressions over "
                "family names, as Prometheus writes them (no lookarounds or backreferences), e.g. vgpu_pod_energy.*"
            ) from None
    return patterns


def namespaces(text: str) -> tuple[str, ...]:
    """Comma-separated names (namespaces): each a DNS label, as Kubernetes names namespaces."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name):
            raise argparse.ArgumentTypeError(
                f"invalid namespace {name!r}: expected comma-separated namespaces (lower-case letters, digits "
                "and '-', at most 63), e.g. gpu-operator,nvidia-device-plugin"
            )
    return names


def optional_path(text: str) -> Path | None:
    """A file, or none where the text is empty (a variable set to "")."""
    return Path(text) if text.strip() else None


def scenario(text: str) -> str | None:
    """`--simulate`'s value: a scenario file or `builtin`; in the environment also true (the
    built-in node) or false (none)."""
    word = text.strip()
    if word.lower() in FALSE_WORDS:
        return None
    return BUILTIN_SCENARIO if word.lower() in TRUE_WORDS else word


def gpu_resource(text: str) -> str:
    """An extended resource whose devices count as GPUs (a name, or a prefix ending in `*`)."""
    name = text.strip()
    if name in NOT_DEVICE_COUNTS:
        raise argparse.ArgumentTypeError(
            f"{name}: a quantity (HAMi's memory or cores), not a count of devices; HAMi's allocation is read "
            "from its pod annotations, so name only device resources (for example nvidia.com/gpu)"
        )
    return name


KAI_MODES = ("auto", "on", "off")
"""--kai: KAI Scheduler's BindRequests read once a reservation pod runs on the node, always, or never."""


def kai_mode(text: str) -> str:
    word = text.strip().lower()
    if word not in KAI_MODES:
        raise argparse.ArgumentTypeError(
            f"invalid KAI mode {text!r}: expected auto (once a reservation pod of KAI's runs on this node), on or off"
        )
    return word


_NAMESPACE = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_SERVICE_ACCOUNT = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
_LABEL_VALUE = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"


def kai_reservation(text: str) -> tuple[str, str, str]:
    """`NAMESPACE[/SERVICE_ACCOUNT[/APP_LABEL]]`: where KAI Scheduler's binder runs its reservation
    pods, their service account and their `app` label, as its chart's values
    global.resourceReservation.{namespace,serviceAccount,appLabel} say; each one left out is the
    namespace's name, as KAI's defaults and Run:ai's (runai-reservation) name all three."""
    parts = [part.strip() for part in text.strip().split("/")]
    patterns = (_NAMESPACE, _SERVICE_ACCOUNT, _LABEL_VALUE)[: len(parts)]
    if len(parts) > 3 or not all(re.fullmatch(p, part) for p, part in zip(patterns, parts, strict=True)):
        raise argparse.ArgumentTypeError(
            f"invalid KAI reservation {text!r}: expected NAMESPACE[/SERVICE_ACCOUNT[/APP_LABEL]] as KAI's "
            "global.resourceReservation values name them, e.g. kai-resource-reservation or runai-reservation"
        )
    namespace = parts[0]
    return (namespace, parts[1] if len(parts) > 1 else namespace, parts[2] if len(parts) > 2 else namespace)
