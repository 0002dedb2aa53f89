"""What the agent relies on inside the OpenTelemetry SDK and exporters, checked before use.

Five private pieces, with no public equivalent:

- the SDK's per-reader metric storage
  (`MeterProvider._measurement_consumer._reader_storages[reader]
  ._instrument_view_instrument_matches`, each match's `_attributes_aggregation`
  and `_lock`): ended pods' attribute sets are pruned there after each
  collection, or every pod that ever ran would be exported forever;
- the OTLP exporter's `_preferred_temporality` and `_preferred_aggregation`,
  handed to the push's own reader;
- the Prometheus exporter's naming functions (`_mapping.sanitize_full_name`,
  `map_unit`, `sanitize_attribute`), which exposition.py applies so that its
  names are the exporter's; tests/unit/export/test_exposition.py renders every collection
  both ways and compares the bytes;
- the Prometheus exporter's unit table (`_mapping._UNIT_MAPPINGS`): the
  specification maps unit `1` to the suffix `ratio`, as Prometheus' own OTLP
  ingestion does, but this exporter maps it to nothing, so a scrape and a push
  would name a 0-1 gauge differently. The agent sets the specification's
  suffix;
- two functions every measurement goes through, `_clean_attribute_value` (as
  `measurement.py` imports it) and `_hash_attributes`
  (`_view_instrument_match.py`): both walk the attribute mapping through
  abstract-class checks and a generator per value, about half of the SDK's
  cost per series. `fast_attribute_paths` gives them a fast path for the
  only attributes the agent records, flat mappings of non-empty string keys
  to string values, returning exactly what the originals return; anything
  else goes to the originals. tests/unit/export/test_sdk_internals.py compares the two
  on such mappings and on every other kind.

pyproject.toml pins these packages to the minor versions below; on any other
the agent refuses to start with a message naming them, rather than misbehave.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

# Distribution -> the version prefix the private pieces were read from.
SUPPORTED = {
    "opentelemetry-sdk": "1.45.",
    "opentelemetry-exporter-prometheus": "0.66b",
    "opentelemetry-exporter-otlp-proto-common": "1.45.",
}


class SdkMismatch(RuntimeError):
    """The installed OpenTelemetry packages are not the ones the agent was built against."""


def check_versions(version_of: Any = None) -> None:
    """Raise SdkMismatch unless every distribution is at its supported minor version."""
    version_of = version_of or metadata.version
    wrong = []
    for name, prefix in SUPPORTED.items():
        try:
            found = version_of(name)
        except metadata.PackageNotFoundError:
            found = "not installed"
        if not found.startswith(prefix):
            wrong.append(f"{name} {found} (needs {prefix}*)")
    if wrong:
        raise SdkMismatch(
            "otel-vgpu uses private parts of the OpenTelemetry SDK and exporters that differ between "
            f"versions, and these are not the ones it supports: {', '.join(wrong)}; install otel-vgpu's "
            "pinned versions (pip install otel-vgpu resolves them)"
        )


def use_ratio_suffix() -> None:
    """Make the Prometheus exporter name unit-`1` families `..._ratio`, as the specification and
    Prometheus' OTLP ingestion do (prometheus/otlptranslator: gauges of unit "1" get `ratio`)."""
    from opentelemetry.exporter.prometheus import _mapping  # noqa: PLC0415

    table = getattr(_mapping, "_UNIT_MAPPINGS", None)
    if not isinstance(table, dict) or table.get("1") not in ("", "ratio"):
        raise SdkMismatch("opentelemetry-exporter-prometheus no longer has the unit table otel-vgpu adjusts")
    table["1"] = "ratio"


def storage_matches(provider: Any, reader: Any) -> Any:
    """The SDK's instrument/view matches that hold `reader`'s attribute sets."""
    try:
        return provider._measurement_consumer._reader_storages[reader]._instrument_view_instrument_matches
    except (AttributeError, KeyError) as error:
        raise SdkMismatch(f"the OpenTelemetry SDK's metric storage is not laid out as expected ({error})") from None


def fast_attribute_paths() -> None:
    """Install the fast paths for flat string attributes (idempotent)."""
    from opentelemetry.sdk.metrics._internal import _view_instrument_match, measurement  # noqa: PLC0415

    clean = getattr(measurement, "_clean_attribute_value", None)
    hash_ = getattr(_view_instrument_match, "_hash_attributes", None)
    if getattr(clean, "fast_path_of", None) is not None and getattr(hash_, "fast_path_of", None) is not None:
        return
    if getattr(clean, "__name__", "") != "_clean_attribute_value" or getattr(hash_, "__name__", "") != (
        "_hash_attributes"
    ):
        raise SdkMismatch("the OpenTelemetry SDK no longer cleans and hashes measurement attributes as expected")
    measurement._clean_attribute_value = _fast_clean(clean)  # type: ignore[arg-type,attr-defined]
    _view_instrument_match._hash_attributes = _fast_hash(hash_)  # type: ignore[arg-type]


def _flat_strings(value: object) -> bool:
    if type(value) is not dict:
        return False
    for key, item in value.items():  # noqa: SIM110 - on every measurement: a loop beats all() over a generator
        if type(key) is not str or not key or type(item) is not str:
            return False
    return True


def _fast_clean(original: Callable[..., Any]) -> Callable[..., Any]:
    def clean(value: Any, max_string_value_length: int | None) -> Any:
        # The original copies such a mapping as it is: every key valid, every string kept whole.
        if max_string_value_length is None and _flat_strings(value):
            return dict(value)
        return original(value, max_string_value_length)

    clean.fast_path_of = original  # type: ignore[attr-defined]
    return clean


def _fast_hash(original: Callable[..., Any]) -> Callable[..., Any]:
    def hash_attributes(value: Any) -> Any:
        # The original: ("mapping", ((key, ("str", value)), ...)) in key order.
        if _flat_strings(value):
            return ("mapping", tuple([(key, ("str", item)) for key, item in sorted(value.items())]))
        return original(value)

    hash_attributes.fast_path_of = original  # type: ignore[attr-defined]
    return hash_attributes
