#!/usr/bin/env python3
"""What a user sees of the agent, written to a folder, so that a change meant to keep behaviour
can show that it does: `diff -r` of two folders, one written before the change and one after.

- `help.txt`: `python -m otel_vgpu --help`;
- `expositions/`: the built-in node, each scenario of tests/data/sharing/ and three the tests
  write inline (`INLINE`), swept and scraped
  on a clock moved by hand (six sweeps 2.5 s apart, health read and XID events taken at each),
  in the text format and in OpenMetrics; the process's own metrics (CPU, memory, GC) are left
  out, and the readers' durations read `measured`, since they time this run;
- `chart/`: `helm template` of the chart's defaults and of each `charts/otel-vgpu/ci/*.yaml`;
- `kustomize/`: `kubectl kustomize` of each overlay, where kubectl is on PATH.

Run from the repository root: `.venv/bin/python scripts/behaviour_snapshot.py OUT`."""

from __future__ import annotations

import argparse
import importlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# testkit, and the tests' inline scenarios imported from tests/.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.allocation.ratio import RatioSource
from otel_vgpu.collect.device_health import DeviceHealth
from otel_vgpu.collect.reading import GpuReader
from otel_vgpu.collect.xids import XidCounts
from otel_vgpu.export.exposition import TEXT, negotiate
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario import BUILTIN, Scenario
from otel_vgpu.sim.scenario_file import load_scenario, parse_scenario
from testkit.clock import Clock
from testkit.sim_sampler import sim_sampler

ROOT = Path(__file__).resolve().parent.parent
SWEEPS, STEP_S = 6, 2.5
OPENMETRICS = negotiate("application/openmetrics-text; version=1.0.0")
# The process's own families (prometheus_client's process, platform and GC collectors).
OWN = ("process_", "python_")
# Families whose values time this run's reads on the machine's clock: their series are kept, their values not.
MEASURED = ("vgpu_agent_reader_duration_seconds",)


# Scenarios the tests write inline, by module and name: a Hopper GPU with GPM and NVLink beside an
# Ampere one, a node of every kind of pod, and the tests' steady node.
INLINE = (
    ("tests.system.test_dcgm_names", "TWO_GPUS"),
    ("tests.unit.export.test_exposition", "MIXED"),
    ("tests.conftest", "STEADY"),
)


def expositions(out: Path) -> None:
    out.mkdir(parents=True)
    scenarios = {"builtin": load_scenario(BUILTIN)}
    scenarios |= {p.stem: load_scenario(str(p)) for p in sorted((ROOT / "tests/data/sharing").glob("*.yaml"))}
    for module, constant in INLINE:
        text = getattr(importlib.import_module(module), constant)
        scenarios[f"{module.rsplit('.', 1)[1]}.{constant}"] = parse_scenario(text, f"{constant}.yaml")
    for name, scenario in scenarios.items():
        text, openmetrics = _scraped(scenario)
        (out / f"{name}.txt").write_text(text)
        (out / f"{name}.openmetrics.txt").write_text(openmetrics)


def _scraped(scenario: Scenario) -> tuple[str, str]:
    clock = Clock()
    with tempfile.TemporaryDirectory() as folder:
        node = SimulatedNode(scenario, Path(folder) / "proc", clock=clock.monotonic, wall_clock_us=clock.wall_us)
        health = AgentHealth()
        sampler = sim_sampler(
            node,
            RatioSource(Path(folder) / "absent", fallback=scenario.ratio),
            health=health,
            clock=clock.monotonic,
            reader=GpuReader(node, clock=clock.monotonic, engine_every_s=0.0),
        )
        devices = DeviceHealth(sampler, health, clock=clock.monotonic)
        xids = XidCounts()
        telemetry = Telemetry(
            sampler, health, min_interval=0.0, node_name="node-a", seed_metrics=True, devices=devices, xids=xids
        )
        try:
            for _ in range(SWEEPS):
                clock.t += STEP_S
                for index in range(len(scenario.gpus)):
                    xids.add(node.xid_events(index, 1000))
                text = telemetry.render(TEXT).decode()
            openmetrics = telemetry.render(OPENMETRICS).decode()
        finally:
            telemetry.shutdown()
            node.close()
    return _without_own(text), _without_own(openmetrics)


def _without_own(body: str) -> str:
    def own(line: str) -> bool:
        words = line.split(" ", 3)
        return (words[2] if line.startswith("#") and len(words) > 2 else line).startswith(OWN)

    def kept(line: str) -> str:
        return line.rsplit(" ", 1)[0] + " measured" if line.startswith(MEASURED) else line

    return "".join(kept(line) + "\n" for line in body.splitlines() if line.strip() and not own(line))


def renders(out: Path) -> None:
    helm = shutil.which("helm", path=str(ROOT / ".venv/bin")) or shutil.which("helm")
    if helm is not None:
        (out / "chart").mkdir(parents=True)
        chart = ROOT / "charts/otel-vgpu"
        for values in [None, *sorted((chart / "ci").glob("*.yaml"))]:
            extra = [] if values is None else ["-f", str(values)]
            name = "defaults" if values is None else values.stem
            (out / "chart" / f"{name}.yaml").write_text(
                _run([helm, "template", "otel-vgpu", str(chart), "--namespace", "otel-vgpu", *extra])
            )
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        (out / "kustomize").mkdir(parents=True)
        for overlay in sorted((ROOT / "kustomize/overlays").iterdir()):
            (out / "kustomize" / f"{overlay.name}.yaml").write_text(_run([kubectl, "kustomize", str(overlay)]))


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    return done.stdout + (f"\n# exit {done.returncode}\n{done.stderr}" if done.returncode else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write (must not exist)")
    out = parser.parse_args().out
    out.mkdir(parents=True)
    (out / "help.txt").write_text(_run([sys.executable, "-m", "otel_vgpu", "--help"]))
    expositions(out / "expositions")
    renders(out)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
