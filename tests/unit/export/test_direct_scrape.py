"""A scrape written from the agent's own observations (export/direct.py) against the SDK's path.

Each step scrapes the agent, then collects the same snapshot through the SDK's reader and
renders that collection as the agent did before: the bytes after the process's own metrics
must be equal, while pods come and go past a small cardinality limit (the SDK's overflow
series and its pruning), a family's callback fails at some steps, and the sweeps' histogram
grows, in the text format and in OpenMetrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.export import telemetry as telemetry_module
from otel_vgpu.export.exposition import TEXT, Format, Renderer, negotiate
from otel_vgpu.export.families import FAMILIES
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario import Scenario

from ...conftest import make_sampler, wide_scenario

pytestmark = pytest.mark.unit

OPENMETRICS = negotiate("application/openmetrics-text; version=1.0.0")
STEPS = 12
FAILING = FAMILIES[0].prometheus_name


class Failing:
    """A family's value that raises at every third step: its callback fails, as the SDK sees it."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.step = 0

    def __call__(self, row: Any) -> Any:
        if self.step % 3 == 2:
            raise RuntimeError("a failing callback")
        return self.value(row)


def sdk_render(telemetry: Telemetry, renderer: Renderer, fmt: Format) -> str:
    """The same snapshot collected through the SDK's reader and rendered, as scrapes were."""
    with telemetry.scope.collection("scrape"), telemetry._render_lock:
        data = telemetry.reader.collect_data()
        telemetry._prune(telemetry.reader)
    return renderer.render(data, fmt)


def families(body: bytes) -> str:
    """The body less the process's own metrics, which come first."""
    text = body.decode()
    return text[text.index("# HELP target") :]


@pytest.fixture
def churn(tmp_path: Path, ratio_file: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Telemetry, Failing]]:
    monkeypatch.setattr(telemetry_module, "CARDINALITY_LIMIT", 5)
    base = wide_scenario(2, 2)
    node = SimulatedNode(base, tmp_path / "proc")
    failing = Failing(FAMILIES[0].value)
    chosen = [dataclasses.replace(FAMILIES[0], value=failing), *FAMILIES[1:]]
    # One snapshot a step, shared by the scrape and the SDK's collection after it.
    telemetry = Telemetry(
        make_sampler(node, ratio_file), AgentHealth(), 3600.0, "n", seed_metrics=True, families=chosen
    )
    telemetry.base = base  # type: ignore[attr-defined]
    telemetry.node = node  # type: ignore[attr-defined]
    yield telemetry, failing
    telemetry.shutdown()
    node.close()


def next_step(telemetry: Telemetry, step: int) -> None:
    """Pods come and go (a different pair each step, some back from before) and a new snapshot."""
    base: Scenario = telemetry.base  # type: ignore[attr-defined]
    pods = [
        dataclasses.replace(base.pods[0], name=f"job-{n}", uid=f"{n:08x}-1111-4000-8000-000000000000")
        for n in (step % 4, step // 2, step)
    ]
    telemetry.node.scenario = dataclasses.replace(base, pods=(base.pods[1], *pods[: 1 + step % 3]))  # type: ignore[attr-defined]
    telemetry.scope.max_age = 0.0
    telemetry.scope.snapshot()
    telemetry.scope.max_age = 3600.0


@pytest.mark.parametrize("fmt", [TEXT, OPENMETRICS], ids=["text", "openmetrics"])
def test_the_scrape_writes_what_the_sdks_path_wrote(churn: tuple[Telemetry, Failing], fmt: Format) -> None:
    telemetry, failing = churn
    renderer = Renderer(leave_out=telemetry._leave_out)
    seen = set()
    for step in range(STEPS):
        failing.step = step
        next_step(telemetry, step)
        ours = families(telemetry.render(fmt))
        assert ours == sdk_render(telemetry, renderer, fmt), step
        seen |= {case for case in ("otel_metric_overflow", FAILING) if case in ours}
    # The cases are there: the overflow series, and the failing family (at its other steps).
    assert seen == {"otel_metric_overflow", FAILING}


def test_an_ended_series_is_pruned_as_the_sdk_prunes_it(churn: tuple[Telemetry, Failing]) -> None:
    telemetry, _ = churn
    for step in range(STEPS):
        next_step(telemetry, step)
        telemetry.render(TEXT)
        for family in telemetry._observables:
            # What the SDK would hold for the scrape: at most the limit and its overflow series.
            assert telemetry._direct.held(family.name) <= 6, (step, family.name)
