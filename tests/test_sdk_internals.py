"""The private parts of the OpenTelemetry SDK and exporters the agent uses:
pinned in pyproject.toml, checked at start, and a loud refusal on any other version."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

import pytest

from otel_vgpu.agent import Agent, StartupError
from otel_vgpu.config import EXIT_USAGE, parse_config
from otel_vgpu.export import sdk_internals
from otel_vgpu.export.sdk_internals import SUPPORTED, SdkMismatch, check_versions
from testkit.agent import ROOT, free_port


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
    port = str(free_port())
    config = parse_config(["--simulate", "--allocation-file", str(ROOT / "gpu_allocation.txt"), "--port", port], {})
    with pytest.raises(StartupError) as caught:
        Agent(config)
    assert caught.value.status == EXIT_USAGE
    assert "opentelemetry-exporter-prometheus 0.70b0 (needs 0.66b*)" in str(caught.value)


def test_a_changed_unit_table_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.exporter.prometheus import _mapping  # noqa: PLC0415

    monkeypatch.delattr(_mapping, "_UNIT_MAPPINGS")
    with pytest.raises(SdkMismatch, match="unit table"):
        sdk_internals.use_ratio_suffix()
