"""The agent's CPU on a real GPU beside its floor, an earlier version and nvitop-exporter, in one window.

Run as root on a GPU node from the repository root (bench/README.md says what the GPU scripts need):

    kubectl kustomize kustomize/base > base.yaml
    python3 bench/gpu_cost_side_by_side.py --pod base.yaml [--before DIR] [--processes 48]
        [--rounds 2] [--seconds 45] [--out results.md]

`--processes` CUDA processes in pods on GPU 0 (a third compute-bound, a third memory-bound, a
third idle; testkit/cpu_compare.py `load_gpu`), then each contestant in turn over the same
processes, scraped every 15 s as Prometheus would, `--rounds` times in a rotating order so
that a drift over the run falls on each alike:

- `now`: this checkout's agent as the manifest runs it (testkit/pod_harness.py), its CPU
  from the pod's cgroup;
- `before` (with `--before`, a directory holding an earlier `otel_vgpu`): that version, the
  same way;
- `floor`: the NVML and /proc calls one sweep makes and nothing else, on the agent's sweep
  cadence (testkit/raw_sweep.py), a process of its own: the reference the agent is quoted
  against (issue 57: at most 1.3x);
- `floor+bill`: the same with the reads the bill needs beyond them (`raw_sweep --bill`: the
  GPU's own SM samples each sweep, the energy counter every 10 s), which no exporter that
  only lists per-process use makes: the agent over it is its own work, beside the driver's;
- `nvitop-exporter`, if it is installed, at the same interval.

Each is measured `--seconds` after SETTLE_S of warm-up (past the agent's first engine and GPM
windows).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import wait_serving
from testkit.cpu_compare import SCRAPE_EVERY_S, SETTLE_S, load_gpu
from testkit.gpu_node import AGENT_PORT, NODE, Doubles, gpu_node, nvitop_exporter_command, pod_harness, wait_for_metrics
from testkit.host_pods import HostPod, stop_pods
from testkit.procstat import cpu_seconds, rss_mib
from testkit.report import Report, publish, scraped_for

SWEEP_EVERY_S = 2.0
"""The agent's default sweep interval (otel_vgpu/config.py), the floor's and nvitop-exporter's."""
NVITOP_PORT = 8010
FLOOR_BOUND = 1.3
BEFORE_BOUND = 1.15

Measure = Callable[[], tuple[float, float]]
"""CPU seconds so far, and resident memory in MiB."""


@contextlib.contextmanager
def agent(manifest: Path, workdir: Path, cluster: Doubles, code: Path | None) -> Iterator[tuple[str, Measure]]:
    harness = pod_harness(manifest, workdir, cluster, NODE, code=code)
    url = f"http://127.0.0.1:{AGENT_PORT}"
    wait_serving(url, harness.start(), harness.log.read_text, timeout=60)
    try:
        yield f"{url}/metrics", lambda: (harness.cpu_seconds(), rss_mib(harness.agent_pid()))
    finally:
        harness.stop()


@contextlib.contextmanager
def process(command: list[str], url: str | None) -> Iterator[tuple[str | None, Measure]]:
    started = subprocess.Popen(
        command, stdout=subprocess.PIPE if url is None else subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
    )
    try:
        if url is None:
            assert started.stdout is not None
            if started.stdout.readline().strip() != "ready":
                raise SystemExit(f"{command} did not start")
        else:
            wait_for_metrics(url, started)  # type: ignore[arg-type]
        yield url, lambda: (cpu_seconds(started.pid), rss_mib(started.pid))
    finally:
        started.terminate()
        started.wait(timeout=15)


def measured(url: str | None, measure: Measure, seconds: float) -> tuple[float, float]:
    """CPU in percent of a core over `seconds`, scraped every 15 s where it serves; RSS at the end."""
    time.sleep(SETTLE_S)
    before, _ = measure()
    if url is None:
        wall_started = time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - wall_started
    else:
        wall = scraped_for(url, seconds, SCRAPE_EVERY_S)
    after, rss = measure()
    return 100 * (after - before) / wall, rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pod", type=Path, required=True, metavar="MANIFEST")
    parser.add_argument("--before", type=Path, help="a directory holding an earlier otel_vgpu")
    parser.add_argument("--processes", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    node = gpu_node("gpu-cost-")
    model, gpu_uuid, driver, tmp, cluster = node.model, node.gpu_uuid, node.driver, node.directory, node.cluster
    report = Report()
    lines, check = report.lines, report.check
    nvitop = nvitop_exporter_command()
    contestants: dict[str, Callable[[int], contextlib.AbstractContextManager[tuple[str | None, Measure]]]] = {
        "now": lambda n: agent(args.pod, tmp / f"now-{n}", cluster, None),
        "floor": lambda n: process([sys.executable, "-m", "testkit.raw_sweep", "--every", f"{SWEEP_EVERY_S:g}"], None),
        "floor+bill": lambda n: process(
            [sys.executable, "-m", "testkit.raw_sweep", "--every", f"{SWEEP_EVERY_S:g}", "--bill"], None
        ),
    }
    if args.before is not None:
        contestants["before"] = lambda n: agent(args.pod, tmp / f"before-{n}", cluster, args.before)
    if nvitop is not None:
        contestants["nvitop-exporter"] = lambda n: process(
            [*nvitop, "--bind-address", "127.0.0.1", "--port", str(NVITOP_PORT), "--interval", f"{SWEEP_EVERY_S:g}"],
            f"http://127.0.0.1:{NVITOP_PORT}/metrics",
        )
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in contestants}
    pods: list[HostPod] = []
    try:
        pods, started = load_gpu(cluster, args.processes, gpu_uuid)
        names = list(contestants)
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                with contestants[name](round_) as (url, measure):
                    figures[name].append(measured(url, measure, args.seconds))
                print(f"round {round_} {name}: {figures[name][-1][0]:.2f} %", flush=True)
    finally:
        stop_pods(pods)
        cluster.stop()
    lines += [
        f"GPU: {model}, driver {driver}; {len(started)} CUDA processes in {len(pods)} pods on GPU 0 (a third "
        f"compute-bound, a third memory-bound, a third idle); each contestant alone over them in turn, "
        f"{args.rounds} rounds of {args.seconds:g} s after {SETTLE_S:g} s of warm-up, the order rotating each round; "
        f"the agents as {args.pod.name} runs them (pod harness, sweeps every {SWEEP_EVERY_S:g} s, CPU from the pod's "
        f"cgroup), scraped every {SCRAPE_EVERY_S:g} s; the floor every {SWEEP_EVERY_S:g} s; nvitop-exporter at "
        f"--interval {SWEEP_EVERY_S:g}" + ("" if nvitop else " (not installed)"),
        "",
        "| contestant | CPU of a core, each round | mean | RSS, last round | mean over the floor's "
        "| mean over floor+bill's |",
        "|---|---|---|---|---|---|",
    ]
    mean = {name: statistics.mean(cpu for cpu, _ in values) for name, values in figures.items()}
    for name, values in figures.items():
        each = ", ".join(f"{cpu:.3f} %" for cpu, _ in values)
        lines.append(
            f"| {name} | {each} | {mean[name]:.3f} % | {values[-1][1]:.1f} MiB | {mean[name] / mean['floor']:.2f}x "
            f"| {mean[name] / mean['floor+bill']:.2f}x |"
        )
    lines.append("")
    over_floor = mean["now"] / mean["floor"]
    check(over_floor <= FLOOR_BOUND, f"now over the floor: {over_floor:.2f}x (at most {FLOOR_BOUND}x, issue 57)")
    if "before" in mean:
        change = mean["now"] / mean["before"]
        check(change <= BEFORE_BOUND, f"now over before: {change:.3f}x (at most {BEFORE_BOUND}x, issue 55)")
    if "nvitop-exporter" in mean:
        check(
            mean["now"] < mean["nvitop-exporter"],
            f"now {mean['now']:.3f} % below nvitop-exporter's {mean['nvitop-exporter']:.3f} %",
        )
    publish("The agent's CPU on a real GPU, side by side", lines, args.out)
    return 1 if report.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
