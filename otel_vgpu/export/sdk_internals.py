"""What the agent relies on inside the OpenTelemetry SDK and exporters, checked before use.

Three private pieces, with no public equivalent:

- the SDK's per-reader metric storage
  (`MeterProvider._measurement_consumer._reader_storages[reader]
  ._instrument_view_instrument_matches`, each match's `_attributes_aggregation`
  and `_lock`): ended pods' attribute sets are pruned there after each
  collection, or every pod that ever ran would be exported forever;
- the OTLP exporter's `_preferred_temporality` and `_preferred_aggregation`,
  handed to the push's own reader;
- the Prometheus exporter's unit table (`_mapping._UNIT_MAPPINGS`): the
  specification maps unit `1` to the suffix `ratio`, as Prometheus' own OTLP
  ingestion does, but this exporter maps it to nothing, so a scrape and a push
  would name a 0-1 gauge differently. The agent sets the specification's
  suffix.

pyproject.toml pins these packages to the minor versions below; on any other
the agent refuses to start with a message naming them, rather than misbehave.
"""

from __future__ import annotations

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
