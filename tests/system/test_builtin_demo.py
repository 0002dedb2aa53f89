"""The built-in simulated node is a node that could exist, at every moment of its cycle:
the pods' SM never adds up to more than the GPU's, allocations stay within what the
ratio allows, memory fits, and one pod (notebook-alice) uses more than its share, above the
line of the VGPUPodOverSMShare alert. And the README says what it shows: its scrape is
scripts/demo-scrape.py's of a live demo, and its prose quotes that scrape."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_vgpu.allocation.ratio import RatioSource
from otel_vgpu.collect.estimator import REASONS
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario import BUILTIN, Scenario, sm_asked
from otel_vgpu.sim.scenario_file import load_scenario
from testkit.agent import ROOT, get, running_agent
from testkit.clock import Clock
from testkit.scripts import load as load_script
from testkit.sim_sampler import sim_sampler

STEP_S = 2.5
CYCLE_S = 600  # every period of the built-in node (15 s to 300 s) divides it
DEMO = load_script("demo-scrape.py")
RULES = ROOT / "deploy" / "prometheus" / "otel-vgpu-rules.yaml"
GIB = 1024**3
# How far a figure of the README's scrape may be from a live one's. Those that do not move, to
# the README's five figures. Those that move, by how far each swings over the scenario's cycle:
# the notebook's memory 4-8 GiB (and the GPU's with it); the pods' SM as NVML's whole percents
# and the estimator read them, the trainer's 0.17-0.29 and the notebook's 0.66-0.70 a little
# wider, their vGPU use twice that at ratio 2 over one share, the GPU's SM their sum's.
STEADY_REL = 1e-3
MOVING = {
    "vgpu_pod_memory_used_bytes": 4.5 * GIB,
    "vgpu_gpu_memory_used_bytes": 4.5 * GIB,
    "vgpu_pod_sm_utilization_ratio": 0.2,
    "vgpu_pod_vgpu_utilization_ratio": 0.4,
    "vgpu_gpu_sm_utilization_ratio": 0.2,
}
# Counters grow with the demo's age: they are held to adding up instead (`adds_up`), and a
# reason that is 0 in the README is 0 live.
GPU_BUSY = "vgpu_gpu_sm_busy_seconds_total"
BUSY_PARTS = ("vgpu_pod_sm_busy_seconds_total", "vgpu_gpu_sm_unattributed_seconds_total")
COUNTERS = (GPU_BUSY, *BUSY_PARTS)
# A live scrape that matches the README's may take the demo a few sweeps (its first GPU figure
# is of less than a window); on a loaded machine, more.
MATCH_TIMEOUT_S = 90


def over_share_line() -> float:
    """The vGPU utilization above which VGPUPodOverSMShare fires, as the shipped rules hold it."""
    rules = yaml.safe_load(RULES.read_text())
    alerts = {rule.get("alert"): rule["expr"] for group in rules["groups"] for rule in group["rules"]}
    match = re.fullmatch(r"vgpu_pod_vgpu_utilization_ratio > (?P<line>[0-9.]+)", alerts["VGPUPodOverSMShare"].strip())
    assert match, alerts["VGPUPodOverSMShare"]
    return float(match["line"])


def on_a_clock(scenario: Scenario, tmp_path: Path, clock: Clock) -> tuple[SimulatedNode, Sampler]:
    """The node and a sampler on `clock`, the scenario's ratio in force (no ratio file)."""
    node = SimulatedNode(scenario, tmp_path / "proc", clock=clock.monotonic, wall_clock_us=clock.wall_us)
    sampler = sim_sampler(node, RatioSource(tmp_path / "absent", fallback=scenario.ratio), clock=clock.monotonic)
    return node, sampler


@pytest.mark.unit
def test_the_builtin_node_adds_up_at_every_moment(tmp_path: Path) -> None:
    scenario = load_scenario(BUILTIN)
    line = over_share_line()
    assert scenario.ratio == 2
    clock = Clock()
    node, sampler = on_a_clock(scenario, tmp_path, clock)
    over_users: set[str] = set()
    moments = windows = 0
    try:
        for _ in range(int(CYCLE_S / STEP_S)):
            clock.t += STEP_S
            snapshot = sampler.snapshot(0.0)
            assert snapshot.ok and len(snapshot.gpus) == 4
            for gpu in snapshot.gpus:
                rows = [row for row in snapshot.pods if row.gpu_index == gpu.index]
                # what vgpu_gpu_sm_utilization_ratio publishes: the GPU's figure over the interval
                published = gpu.interval_utilization
                assert published is not None and gpu.device.utilization_window is not None
                pods_sm = sum(row.sm_utilization or 0.0 for row in rows)
                assert pods_sm <= published + 1e-9, (clock.t, gpu.index, pods_sm, published)
                assert sum(row.memory_allocated for row in rows) <= gpu.device.memory_total, (clock.t, gpu.index)
                assert sum(row.shares for row in rows) <= scenario.ratio, (clock.t, gpu.index)
                used = sum(row.memory_used for row in rows) + (gpu.unattributed_memory or 0)
                assert used <= gpu.device.memory_total
                # Each engine: the pods under the GPU's figure of the same window; none lacking.
                assert "encoder" not in gpu.engine_utilization
                for engine, figure in gpu.engine_utilization.items():
                    pods_engine = sum(row.engine_utilization.get(engine, 0.0) for row in rows)
                    assert pods_engine <= figure + 1e-9, (clock.t, gpu.index, engine, pods_engine, figure)
                    windows += 1
            for row in snapshot.pods:
                if row.vgpu_utilization is not None and row.vgpu_utilization > 1.0:
                    over_users.add(row.pod)
            by_pod = {row.pod: row.engine_utilization for row in snapshot.pods}
            memory = {gpu.index: gpu.engine_utilization.get("memory_copy") for gpu in snapshot.gpus}
            if memory[1] is not None:
                # The memory-bound LLM server's GPU is the one whose memory is busiest, and
                # one pod lives on the decoders.
                assert max(memory, key=lambda index: memory[index] or 0.0) == 1, memory
                decoder = {pod: figures.get("decoder", 0.0) for pod, figures in by_pod.items()}
                assert [pod for pod, figure in decoder.items() if figure > 0] == ["video-analytics-5c8d7"]
            # Above the alert's line at every moment, so that the alert fires on the demo.
            notebook = [row for row in snapshot.pods if row.pod == "notebook-alice"]
            assert notebook and notebook[0].vgpu_utilization is not None
            assert notebook[0].vgpu_utilization > line, (clock.t, notebook[0].vgpu_utilization)
            moments += 1
    finally:
        node.close()
    assert moments == CYCLE_S / STEP_S
    assert windows > 4 * 4 * 4  # engine windows closed on every GPU, four engines each
    assert over_users == {"notebook-alice"}
    # And it needs no scaling: no GPU's processes ask for more SM than it has.
    assert max(sm_asked(scenario).values()) <= 1.0


@pytest.mark.unit
def test_a_gpu_asked_for_more_than_its_sms_shares_them(tmp_path: Path) -> None:
    """Processes asking 0.9 + 0.6 of one GPU share it as time-slicing does on the recorded driver
    (docs/nvml-sampling.md): each has the GPU alone while the other has nothing queued and half
    of it while both do, so a gets 0.9 x (1 - 0.6 / 2) and b 0.6 x (1 - 0.9 / 2), scaled to the
    whole GPU: 0.656 and 0.344, not the 0.6 and 0.4 of a split in proportion."""
    scenario_text = """
gpus: [{memory: 80GiB}]
pods:
  - {name: a, processes: [{gpu: 0, memory: 1GiB, sm: 0.9}]}
  - {name: b, processes: [{gpu: 0, memory: 1GiB, sm: 0.6}]}
"""
    path = tmp_path / "busy.yaml"
    path.write_text(scenario_text)
    scenario = load_scenario(str(path))
    assert sm_asked(scenario) == {0: 1.5}
    clock = Clock()
    node, sampler = on_a_clock(scenario, tmp_path, clock)
    try:
        clock.t += 5
        snapshot = sampler.snapshot(0.0)
    finally:
        node.close()
    sm = {row.pod: row.sm_utilization for row in snapshot.pods}
    alone_or_halved = {"a": 0.9 * (1 - 0.6 / 2), "b": 0.6 * (1 - 0.9 / 2)}
    whole = sum(alone_or_halved.values())
    # Each figure to NVML's whole percent.
    assert sm["a"] == pytest.approx(alone_or_halved["a"] / whole, abs=0.01)
    assert sm["b"] == pytest.approx(alone_or_halved["b"] / whole, abs=0.01)
    assert snapshot.gpus[0].device.utilization == 1.0


@pytest.mark.unit
def test_a_static_pods_uid_is_its_mirrors_as_the_api_gives_it(tmp_path: Path) -> None:
    # The static pod's cgroups carry its config hash; the API's mirror pod has a UID of its own,
    # the one kube_pod_info{uid} carries, and pod_uid is that one.
    scenario = load_scenario(BUILTIN)
    static = next(pod for pod in scenario.pods if pod.static)
    clock = Clock()
    node, sampler = on_a_clock(scenario, tmp_path, clock)
    try:
        clock.t += STEP_S
        rows = [row for row in sampler.snapshot(0.0).pods if row.pod == static.name]
    finally:
        node.close()
    assert rows and len(static.uid) == 32
    assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", r.pod_uid) for r in rows)
    assert all(r.pod_uid.replace("-", "") != static.uid for r in rows)


def readme_rows() -> list[Any]:
    """The rows of the README's scrape, in its order."""
    rows: list[Any] = DEMO.rows_of(DEMO.readme_block((ROOT / "README.md").read_text()))
    return rows


def readme_section() -> str:
    """The README's "What the demo shows", its lines joined as a reader reads them."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## What the demo shows", 1)[1].split("\n## ", 1)[0]
    return " ".join(section.split())


def adds_up(rows: list[Any], slack: float) -> bool:
    """Whether GPU 0's busy seconds are its pods' and the unattributed reasons' together."""
    gpu = sum(row.value for row in rows if row.name == GPU_BUSY)
    parts = sum(row.value for row in rows if row.name in BUSY_PARTS)
    return math.isclose(gpu, parts, abs_tol=slack)


@pytest.mark.unit
def test_the_readmes_prose_quotes_its_scrape() -> None:
    rows = readme_rows()
    block = DEMO.readme_block((ROOT / "README.md").read_text())
    rewrite = "rewrite it: .venv/bin/python scripts/demo-scrape.py --write"
    assert block == "".join(f"{row.line()}\n" for row in rows), f"not as the script prints it: {rewrite}"
    section = readme_section()
    for fragment in DEMO.quoted(rows):
        assert fragment in section, f"the prose does not quote the scrape: {fragment!r}"
    # What it promises of the notebook holds of the scrape it shows, and it names every reason
    # the GPU's SM is in no pod's bill.
    line = over_share_line()
    assert DEMO.find(rows, "vgpu_pod_vgpu_utilization_ratio", pod="notebook-alice") > line
    assert f"`> {line:g} for 15m`" in section
    for reason in REASONS:
        assert f"`{reason}`" in section, reason
    # Its busy seconds add up, to the rounding of its four decimals.
    assert adds_up(rows, slack=len(rows) * 0.5e-4)


def mismatches(readme: list[Any], live: list[Any]) -> list[str]:
    """How the README's rows differ from a live scrape's, beyond the stated tolerances."""
    if [row.key for row in readme] != [row.key for row in live]:
        return ["series: " + repr(sorted({row.key for row in readme} ^ {row.key for row in live}))]
    found = []
    for ours, theirs in zip(readme, live, strict=True):
        if ours.name in COUNTERS:
            ok = ours.value > 0 or theirs.value == 0
        elif ours.name in MOVING:
            ok = abs(ours.value - theirs.value) <= MOVING[ours.name]
        else:
            ok = math.isclose(ours.value, theirs.value, rel_tol=STEADY_REL)
        if not ok:
            found.append(f"{ours.key}: README {ours.value:g}, live {theirs.value:g}")
    total = sum(row.value for row in live if row.name == GPU_BUSY)
    if not adds_up(live, slack=1e-9 * max(1.0, total)):
        found.append("the live busy seconds do not add up")
    return found


def test_the_readmes_scrape_is_what_the_demo_serves() -> None:
    # The demo as the README's first command runs it, in the repository (its gpu_allocation.txt),
    # scraped until a scrape matches the README's: the same series and labels in the same
    # order, as scripts/demo-scrape.py selects them, each value within its tolerance.
    readme = readme_rows()
    with running_agent("--simulate") as agent:
        deadline = time.monotonic() + MATCH_TIMEOUT_S
        while found := mismatches(readme, DEMO.shown(get(f"{agent.url}/metrics")[1].decode())):
            assert time.monotonic() < deadline, "\n".join(found)
            time.sleep(0.5)
        agent.stop()
