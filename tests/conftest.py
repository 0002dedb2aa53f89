"""Shared helpers: scenarios, a sampler over the simulated node, scrapes."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.allocation.ratio import RatioSource
from otel_vgpu.collect.reading import GpuReader
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario import CgroupSpec, GpuSpec, PodSpec, ProcessSpec, Scenario, Wave
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.agent import ROOT
from testkit.clock import Clock
from testkit.sim_sampler import sim_sampler

GIB = 1024**3
MIB = 1024**2

# Two GPUs, constant values, so every figure can be worked out by hand.
STEADY = """
gpus:
  - {model: NVIDIA H100 80GB HBM3, memory: 80GiB, uuid: GPU-00000000-0000-0000-0000-000000000000, lacks: [encoder]}
  - {model: NVIDIA H100 80GB HBM3, memory: 80GiB, uuid: GPU-11111111-1111-1111-1111-111111111111}
pods:
  - namespace: ml
    name: trainer
    cgroup: {version: 2, driver: systemd, runtime: containerd, qos: guaranteed}
    shares: {0: 2, 1: 1}
    processes:
      - {gpu: 0, memory: 10GiB, sm: 0.5, memory_copy: 0.3, decoder: 0.1, jpeg: 0.05}
      - {gpu: 0, memory: 2GiB, sm: 0.1, container: sidecar}
      - {gpu: 1, memory: 4GiB, sm: 0.25}
  - namespace: web
    name: api
    cgroup: {version: 1, driver: cgroupfs, runtime: docker, qos: burstable}
    processes:
      - {gpu: 1, memory: 3GiB, sm: 0.0, decoder: 0.4, encoder: 0.2, optical_flow: 0.1}
  - namespace: web
    name: idle
    cgroup: {version: 2, driver: systemd, runtime: crio, qos: besteffort}
    shares: {0: 1}
  - namespace: kube-system
    name: probe
    static: true
    cgroup: {version: 1, driver: systemd, runtime: containerd}
    processes:
      - {gpu: 0, memory: 256MiB, sm: 0.02}
  - namespace: hidden
    name: unknown-to-directory
    uid: 0e886e9a-3879-45f9-b44d-86ef9df03224
    in_directory: false
    cgroup: {version: 2, driver: cgroupfs, runtime: crio, qos: burstable}
    processes:
      - {gpu: 1, memory: 1GiB, sm: 0.05}
host_processes:
  - {gpu: 0, memory: 512MiB, sm: 0.0, cgroup: "0::/system.slice/xorg.service"}
"""


@pytest.fixture
def steady() -> Scenario:
    return parse_scenario(STEADY, "steady.yaml")


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    """STEADY in a file, for the agent run as a process."""
    path = tmp_path / "steady.yaml"
    path.write_text(STEADY)
    return path


@pytest.fixture
def ratio_file(tmp_path: Path) -> Path:
    path = tmp_path / "gpu_allocation.txt"
    path.write_text("2\n")
    return path


@pytest.fixture
def node(steady: Scenario, tmp_path: Path) -> Iterator[SimulatedNode]:
    node = SimulatedNode(steady, tmp_path / "proc")
    yield node
    node.close()


def hand_clocked(tmp_path: Path, text: str) -> tuple[Clock, SimulatedNode, Path]:
    """The scenario `text` as a simulated node on a clock the test moves by hand, and a ratio
    file of 2 beside it."""
    clock = Clock(0.0)
    node = SimulatedNode(parse_scenario(text, "node.yaml"), tmp_path / "proc", clock.monotonic, clock.wall_us)
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("2\n")
    return clock, node, ratio


def make_sampler(
    node: SimulatedNode,
    ratio_file: Path,
    host_pid_namespace: bool | None = None,
    health: AgentHealth | None = None,
    by_container: bool = False,
    **extra: Any,
) -> Sampler:
    """A sampler of `node`; `extra`: Sampler's other keywords (clock, reader...). Its engine
    windows close at every sweep after the first, so that two sweeps show every family."""
    extra.setdefault("reader", GpuReader(node, clock=extra.get("clock", time.monotonic), engine_every_s=0.0))
    return sim_sampler(
        node,
        RatioSource(ratio_file),
        health=health,
        host_pid_namespace=host_pid_namespace,
        by_container=by_container,
        **extra,
    )


def pytest_configure(config: pytest.Config) -> None:
    # A skip fails the run where every tool is installed (testkit/skips.py).
    config.pluginmanager.import_plugin("testkit.skips")


# Timed under attack: run first, before the image build loads the machine.
QUIET_FIRST = "test_hostile_clients.py"
# The files that take longest, longest first: each file's seconds in the suite's run on a loaded
# 2-core machine (`--durations`). pytest-xdist hands a worker a file at a time in the order
# collected (scripts/test.sh passes --no-loadscope-reorder to keep it: by default the files with
# the most tests go first), so the long files start at once and the short ones fill in beside
# them. By their number of tests, the files of a few long waits (Prometheus's scrapes, a hung
# driver's deadlines, the image) came last, and ran alone for the last half-minute of the run.
# The image tests come after the four longest, which outlast its build (scripts/build-test-image.sh:
# under a minute where the Debian root is kept, two where it is made): where it has not finished,
# their worker waits for it while the others go on. A file not listed runs after these, as
# collected; the order changes no test's result.
LONGEST_FIRST = (
    "test_doc_commands.py",
    "test_chart.py",
    "test_prometheus_e2e.py",
    "test_kubernetes.py",
    "test_image.py",
    "test_agent.py",
    "test_telemetry.py",
    "test_otlp.py",
    "test_endpoint_security.py",
    "test_dcgm_consumers.py",
    "test_kustomize.py",
    "test_pod_harness.py",
    "test_reliability.py",
    "test_slow_driver.py",
    "test_start_messages.py",
    "test_timing_attacks.py",
    "test_scrape_labels.py",
    "test_tenants.py",
    "test_dcgm_names.py",
    "test_usage_served.py",
    "test_bill_evidence.py",
    "test_otlp_semconv.py",
)
_build = {"wanted": False, "started": False}


def _longest_first(name: str) -> int:
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The hostile-client tests first, on a quiet machine; then the longest files first (the
    # sort is stable: each file's tests, and the files not listed, keep their order).
    items.sort(key=lambda item: (item.path.name != QUIET_FIRST, _longest_first(item.path.name)))


def pytest_collection_finish(session: pytest.Session) -> None:
    _build["wanted"] = any(
        item.path.name == "test_image.py" and "image" in getattr(item, "fixturenames", ()) for item in session.items
    )


def _xdist_controller(config: pytest.Config) -> bool:
    return config.pluginmanager.hasplugin("dsession") and not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist, the controller builds the image unless scripts/test.sh already
    does (nothing of the session is collected there yet: it builds when the image tests are
    among the paths asked for), and names the build's folder to the workers, which it starts
    after this hook."""
    from testkit.image_build import SHARED_BUILD, start_build, unbuildable  # noqa: PLC0415

    config = session.config
    if not _xdist_controller(config) or os.environ.get(SHARED_BUILD) or config.option.markexpr == "unit":
        return
    if unbuildable():
        return  # the image tests skip, saying why
    image_tests = ROOT / "tests" / "system" / "test_image.py"
    here = config.invocation_params.dir
    asked = [(here / str(arg).split("::", 1)[0]).resolve() for arg in config.args] or [ROOT / "tests"]
    if any(path == image_tests or path in image_tests.parents for path in asked):
        os.environ[SHARED_BUILD] = str(start_build().work)
        _build["started"] = True


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _xdist_controller(session.config) and _build["started"]:
        from testkit.image_build import SHARED_BUILD, start_build  # noqa: PLC0415

        os.environ.pop(SHARED_BUILD, None)
        start_build().clean()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Start the image build with the first test past the hostile-client ones."""
    if item.get_closest_marker("unit"):
        return
    if _build["wanted"] and not _build["started"] and item.path.name != QUIET_FIRST:
        _build["started"] = True
        from testkit.image_build import start_build, unbuildable  # noqa: PLC0415

        if not unbuildable():
            start_build()


class NotAUnitTest(AssertionError):
    """A test marked `unit` started a process or opened a connection."""


@pytest.fixture(autouse=True)
def _units_stay_pure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked `unit` fails the moment it starts a process, binds or connects a socket:
    `pytest -m unit` stays fast because the mark is checked, not trusted."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(what: str) -> Any:
        def refused(*args: object, **kwargs: object) -> None:
            raise NotAUnitTest(f"{what} by a test marked unit: it belongs in a file without the mark")

        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("a process started"))
    monkeypatch.setattr(socket.socket, "bind", refuse("a socket bound"))
    monkeypatch.setattr(socket.socket, "connect", refuse("a socket connected"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("a socket connected"))


def wide_scenario(gpus: int, pods: int) -> Scenario:
    """`pods` pods, each with one small process on every one of `gpus` GPUs and a share of each."""
    return Scenario(
        gpus=tuple(GpuSpec(i, f"GPU-{i:08d}", "H100", 80 * GIB) for i in range(gpus)),
        pods=tuple(
            PodSpec(
                namespace=f"ns{p % 7}",
                name=f"pod-{p}",
                uid=f"{p:08x}-0000-4000-8000-000000000000",
                cgroup=CgroupSpec(version=1 + p % 2, driver=("systemd", "cgroupfs")[p % 2]),
                shares=dict.fromkeys(range(gpus), 1),
                processes=tuple(ProcessSpec(gpu=g, memory=Wave(GIB), sm=Wave(0.001)) for g in range(gpus)),
            )
            for p in range(pods)
        ),
    )
