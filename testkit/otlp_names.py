"""Prometheus' names for OTLP metrics, as its OTLP ingestion builds them.

The rules of prometheus/otlptranslator (`metric_namer.go`,
`UnderscoreEscapingWithSuffixes`, the default of Prometheus' OTLP receiver
and of the Collector's Prometheus exporters with suffixes on), written out so
a test can compare what a push becomes in Prometheus with what a scrape
serves:

- the name is split into tokens at every character outside [a-zA-Z0-9];
- the unit, with any `{annotation}` removed, maps to a suffix (`By` bytes,
  `s` seconds, `%` percent, ...; `x/y` to `x_per_y`), added unless a token
  already is that suffix;
- a monotonic sum gets `total`, a gauge of unit `1` gets `ratio`, each moved
  to the end if already there;
- the tokens are joined with `_`.
"""

from __future__ import annotations

import re

_UNITS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "%": "percent",
}
_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}


def _tokens(text: str) -> list[str]:
    return [token for token in re.split(r"[^a-zA-Z0-9]+", text) if token]


def prometheus_name(name: str, unit: str, data_type: str, monotonic: bool = True) -> str:
    """The name Prometheus gives an OTLP metric of this name, unit and type (Gauge, Sum, Histogram)."""
    tokens = _tokens(name)
    unit = re.sub(r"\{[^}]*\}", "", unit).strip()
    main, _, per = unit.partition("/")
    main_suffix = "" if main == "1" else _UNITS.get(main, main)
    for suffix in _tokens(main_suffix):
        if suffix not in tokens:
            tokens.append(suffix)
    if per:
        per_suffix = _PER_UNITS.get(per, per)
        if per_suffix and per_suffix not in tokens:
            tokens += ["per", *_tokens(per_suffix)]
    if data_type == "Sum" and monotonic:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if data_type == "Gauge" and unit == "1":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    return "_".join(tokens)


def prometheus_label(attribute: str) -> str:
    """A data point or resource attribute's label name: invalid characters become `_`."""
    label = re.sub(r"[^a-zA-Z0-9_]", "_", attribute)
    return f"key_{label}" if label[:1].isdigit() else label
