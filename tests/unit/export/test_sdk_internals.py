"""The private parts of the OpenTelemetry SDK and exporters the agent uses:
pinned in pyproject.toml, checked at start, and a loud refusal on any other version."""

from __future__ import annotations

import random
import re
import tomllib
from importlib import metadata
from typing import Any

import pytest
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider

from otel_vgpu.agent import Agent, StartupError
from otel_vgpu.config import EXIT_USAGE, parse_config
from otel_vgpu.export import sdk_internals
from otel_vgpu.export.reader import ScrapeReader
from otel_vgpu.export.sdk_internals import SUPPORTED, SdkMismatch, check_versions
from testkit.agent import ROOT

pytestmark = pytest.mark.unit


def test_the_installed_versions_are_the_supported_ones() -> None:
    check_versions()
    for name, prefix in SUPPORTED.items():
        assert metadata.version(name).startswith(prefix), name


def test_pyproject_pins_exactly_the_supported_minor_versions() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {re.split(r"[<>=!~ ]", dep, maxsplit=1)[0]: dep for dep in project["dependencies"]}
    for name, prefix in SUPPORTED.items():
        if name not in pins:
            continue  # a dependency of a pinned package
        minor = prefix.rstrip(".b")
        major, _, number = minor.partition(".")
        assert f">={minor}" in pins[name] and f"<{major}.{int(number) + 1}" in pins[name], pins[name]


def test_another_version_is_refused_with_its_name_and_the_supported_one() -> None:
    versions = {"opentelemetry-sdk": "1.46.0"}
    with pytest.raises(SdkMismatch) as caught:
        check_versions(lambda name: versions.get(name) or metadata.version(name))
    assert "opentelemetry-sdk 1.46.0 (needs 1.45.*)" in str(caught.value)


def test_the_agent_will_not_start_on_another_version(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version
    monkeypatch.setattr(
        metadata,
        "version",
        lambda name: "0.70b0" if name == "opentelemetry-exporter-prometheus" else real(name),
    )
    config = parse_config(["--simulate", "--allocation-file", str(ROOT / "gpu_allocation.txt")], {})
    # refused before it opens anything: a unit test may bind no socket
    with pytest.raises(StartupError) as caught:
        Agent(config)
    assert caught.value.status == EXIT_USAGE
    assert "opentelemetry-exporter-prometheus 0.70b0 (needs 0.66b*)" in str(caught.value)


def test_a_changed_unit_table_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.exporter.prometheus import _mapping  # noqa: PLC0415

    monkeypatch.delattr(_mapping, "_UNIT_MAPPINGS")
    with pytest.raises(SdkMismatch, match="unit table"):
        sdk_internals.use_ratio_suffix()


def attribute_cases() -> list[object]:
    """Flat string mappings (the fast path) and every other kind of attributes (the original's)."""
    rng = random.Random(16)
    alphabet = 'abcXYZ._-/09 üñ"\\\n'
    flat: list[object] = [
        {
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))): "".join(
                rng.choice(alphabet) for _ in range(rng.randint(0, 12))
            )
            for _ in range(rng.randint(0, 8))
        }
        for _ in range(200)
    ]
    others: list[object] = [
        None,
        {},
        {"a": 1},
        {"a": True, "b": "x"},
        {"a": 1.5},
        {"a": None},
        {"a": b"bytes"},
        {"a": ("x", "y")},
        {"a": ["x", 1]},
        {"a": {"nested": "map"}},
        {"": "empty key"},
        {1: "int key"},
        {"b": "x", "a": "y", "a ": "z"},
        "just a string",
        ("a", "b"),
        7,
    ]
    return flat + others


def test_the_fast_attribute_paths_return_what_the_originals_return() -> None:
    from opentelemetry.sdk.metrics._internal import _view_instrument_match, measurement  # noqa: PLC0415

    sdk_internals.fast_attribute_paths()
    clean: Any = measurement._clean_attribute_value  # type: ignore[attr-defined]
    hash_: Any = _view_instrument_match._hash_attributes
    original_clean, original_hash = clean.fast_path_of, hash_.fast_path_of
    fast_taken = 0
    for case in attribute_cases():
        for limit in (None, 3):
            assert clean(case, limit) == original_clean(case, limit), (case, limit)
        if isinstance(case, dict | list | tuple | str | int | type(None)):
            assert hash_(clean(case, None)) == original_hash(original_clean(case, None)), case
        fast_taken += sdk_internals._flat_strings(case)
    assert fast_taken >= 200  # the flat mappings took the fast path
    # Installed once: a second call does not wrap the wrappers.
    sdk_internals.fast_attribute_paths()
    assert measurement._clean_attribute_value is clean  # type: ignore[attr-defined]
    assert _view_instrument_match._hash_attributes is hash_


def test_measurements_go_through_the_fast_paths() -> None:
    from opentelemetry.sdk.metrics._internal import _view_instrument_match  # noqa: PLC0415

    sdk_internals.fast_attribute_paths()
    calls = []
    fast: Any = _view_instrument_match._hash_attributes

    def counting(value: Any) -> Any:
        calls.append(value)
        return fast(value)

    reader = ScrapeReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        provider.get_meter("t").create_observable_gauge(
            "g", [lambda options: [Observation(1.0, {"pod": "a", "gpu_id": "0"})]]
        )
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_view_instrument_match, "_hash_attributes", counting)
            data = reader.collect_data()
    finally:
        provider.shutdown()
    assert data is not None and calls == [{"pod": "a", "gpu_id": "0"}]


def test_a_changed_attribute_path_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.metrics._internal import measurement  # noqa: PLC0415

    monkeypatch.setattr(measurement, "_clean_attribute_value", lambda value, limit: value, raising=False)
    with pytest.raises(SdkMismatch, match="cleans and hashes"):
        sdk_internals.fast_attribute_paths()
