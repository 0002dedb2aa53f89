"""The bill on a real GPU: each pod's SM-busy seconds against what its processes ran.

Run as root on a GPU node from the repository root (bench/README.md says what the GPU scripts need):

    kubectl kustomize kustomize/base > base.yaml
    python3 bench/gpu_validate_bill.py --pod base.yaml [--rounds 3] [--seconds 30] [--out results.md]

One agent, as the manifest runs it (testkit/pod_harness.py, sweeps at the base's cadence),
scraped every 15 s as Prometheus would, sees `--rounds` rounds of four scenarios, one after
the other, each with pods of its own (so each pod's counter is that scenario's bill):

- `restarts`: a tenant runs fresh CUDA processes back to back, each computing 1 s once its
  context is up, beside a steady pod running kernels 30 % of every 100 ms (issue 55, the
  restarts);
- `idle-context`: a pod works 6 s at half of every 100 ms, then keeps its context idle,
  beside a steady pod at 40 % (an inference server after a batch: the idle neighbour);
- `batches`: a server busy 2 s of every 8 s, its context idle in between, beside a steady
  pod at 40 % (the batches beside a steady pod);
- `two-busy`: two pods running kernels back to back (a saturated GPU).

What each process ran is counted by itself: the steps it completed times one step's time
alone on the GPU (testkit/cuda_workloads.py), written again when it is stopped (SIGTERM,
as a pod's deletion stops it). Time-slicing stretches a process's wall time, not its
work, so on a shared GPU the processes' work adds up to less than the GPU's busy time (the
context switches are the GPU's, and no process counted them): the report gives each pod's
billed over ran, and its share of the pods' bill against its share of their work.

Goals (issue 55, on the simulated node; here they are checked on the driver itself): in a
scenario with a tenant, the victim at most 1.05 and the tenant at least 0.90 of what it
ran; the batches within 5 % in share; the saturated split within 10 %; and, at the end, the
GPU's SM-busy seconds equal to the pods' and every unattributed reason's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import wait_serving
from testkit.cuda_workloads import work_of
from testkit.gpu_node import AGENT_PORT, NODE, gpu_node, pod_harness
from testkit.host_pods import HostPod, start_in, stop_pods
from testkit.report import Report, Samples, publish, scrape

URL = f"http://127.0.0.1:{AGENT_PORT}/metrics"
SCRAPE_EVERY_S = 15.0
GAP_S = 4.0
"""Idle between scenarios: each starts apart from the last one's ends."""
SETTLE_S = 20.0
"""After the last scenario, before the bill is read: past NVML's 14.2 s trailing window
(docs/nvml-sampling.md), so every life's last sample is in and settled."""
DEVICES = 64


@dataclass
class Scenario:
    """A scenario's pods in one round: the victim (the pod that must not pay for the other),
    the other, and each pod's work files."""

    name: str
    victim: HostPod
    other: HostPod
    works: dict[str, list[Path]] = field(default_factory=dict)


def steady(pod: HostPod, work: Path, share: float, **env: str) -> None:
    start_in(pod, ["batches" if env else "steady"], 1.0, {"WORK_FILE": str(work), **env}, burst_ms=1000 * share)


def run_scenario(kind: str, scenario: Scenario, workdir: Path, seconds: float) -> None:
    """Start the scenario's workloads in its pods, let them run `seconds`, stop them as a
    deletion does (SIGTERM: each writes its last work)."""
    victim, other = scenario.victim, scenario.other

    def work(pod: HostPod, n: int = 0) -> Path:
        path = workdir / f"{pod.name}-{n}.work"
        scenario.works.setdefault(pod.name, []).append(path)
        return path

    started = time.monotonic()
    if kind == "restarts":
        steady(victim, work(victim), 0.3)
        n = 0
        while time.monotonic() - started < seconds:
            once = start_in(other, ["once"], 1.0, {"WORK_FILE": str(work(other, n)), "ONCE_S": "1.0"})[0]
            once.wait()
            n += 1
    else:
        if kind == "idle-context":
            steady(victim, work(victim), 0.5, BATCH_ON_S="6", BATCH_EVERY_S="100000")
            steady(other, work(other), 0.4)
        elif kind == "batches":
            steady(victim, work(victim), 1.0, BATCH_ON_S="2", BATCH_EVERY_S="8")
            steady(other, work(other), 0.4)
        else:  # two-busy
            for pod in (victim, other):
                start_in(pod, ["busy"], 1.0, {"WORK_FILE": str(work(pod))})
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    for process in victim.processes + other.processes:
        if process.poll() is None:
            process.terminate()
    for process in victim.processes + other.processes:
        process.wait()


KINDS = ("restarts", "idle-context", "batches", "two-busy")
ROLES = {  # (the victim's name, the other's)
    "restarts": ("steady", "restarting"),
    "idle-context": ("idle-after-work", "steady"),
    "batches": ("server", "steady"),
    "two-busy": ("busy-a", "busy-b"),
}


def pod_counter(metrics: Samples, family: str, pod: str) -> float:
    return sum(v for labels, v in metrics.get(family, []) if labels.get("pod") == pod)


def scraper(stop: threading.Event) -> Callable[[], None]:
    def loop() -> None:
        while not stop.wait(SCRAPE_EVERY_S):
            scrape(URL)

    return loop


@dataclass
class Row:
    kind: str
    round: int
    pod: str
    role: str
    billed: float
    ran: float


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pod", type=Path, required=True, metavar="MANIFEST")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="each scenario's length")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", type=Path, help="also write every pod's figures here")
    args = parser.parse_args()
    node = gpu_node("gpu-bill-")
    model, gpu_uuid, driver, tmp, cluster = node.model, node.gpu_uuid, node.driver, node.directory, node.cluster
    report = Report()
    lines, check = report.lines, report.check
    cluster.kubelet.allocatable = {"nvidia.com/gpu": [f"{gpu_uuid}::{n}" for n in range(DEVICES)]}
    harness = pod_harness(args.pod, tmp / "pod", cluster, NODE)
    wait_serving(URL.removesuffix("/metrics"), harness.start(), harness.log.read_text, timeout=60)
    stop = threading.Event()
    threading.Thread(target=scraper(stop), daemon=True).start()
    cpu_before, wall_before = harness.cpu_seconds(), time.monotonic()
    done: list[Scenario] = []
    rounds: list[tuple[int, str, Scenario]] = []
    devices = iter(range(DEVICES))
    try:
        for round_ in range(args.rounds):
            for kind in args.kinds:
                names = ROLES[kind]
                victim, other = (HostPod("bill", f"{kind}-{name}-{round_}", "systemd", "burstable") for name in names)
                for pod in (victim, other):
                    cluster.add(pod, {"main": [f"{gpu_uuid}::{next(devices)}"]})
                scenario = Scenario(kind, victim, other)
                try:
                    run_scenario(kind, scenario, tmp, args.seconds)
                finally:
                    stop_pods([victim, other])
                done.append(scenario)
                rounds.append((round_, kind, scenario))
                print(f"round {round_} {kind}: done", flush=True)
                time.sleep(GAP_S)
        time.sleep(SETTLE_S)
        final = scrape(URL)
        cpu = harness.cpu_seconds() - cpu_before
        wall = time.monotonic() - wall_before
    finally:
        stop.set()
        log = harness.stop()
        cluster.stop()
    rows = [
        Row(
            kind,
            round_,
            pod.name,
            role,
            pod_counter(final, "vgpu_pod_sm_busy_seconds_total", pod.name),
            sum(work_of(p) for p in scenario.works.get(pod.name, [])),
        )
        for round_, kind, scenario in rounds
        for role, pod in (("victim", scenario.victim), ("other", scenario.other))
    ]
    if args.json:
        args.json.write_text(json.dumps([row.__dict__ for row in rows], indent=1))
    gpu_busy = sum(v for labels, v in final.get("vgpu_gpu_sm_busy_seconds_total", []) if labels.get("gpu_id") == "0")
    unattributed = {
        labels.get("reason", ""): v
        for labels, v in final.get("vgpu_gpu_sm_unattributed_seconds_total", [])
        if labels.get("gpu_id") == "0"
    }
    pods_busy = sum(v for labels, v in final.get("vgpu_pod_sm_busy_seconds_total", []) if labels.get("gpu_id") == "0")
    lines += [
        f"GPU: {model}, driver {driver}; one agent through the pod harness ({args.pod.name}), scraped every "
        f"{SCRAPE_EVERY_S:g} s; {args.rounds} rounds of {len(args.kinds)} scenarios, {args.seconds:g} s each, "
        f"{GAP_S:g} s apart; the bill read {SETTLE_S:g} s after the last. The agent's CPU over the run: "
        f"{cpu:.1f} s in {wall:.0f} s ({100 * cpu / wall:.2f} % of a core).",
        "",
        "Billed: the pod's `vgpu_pod_sm_busy_seconds_total`; ran: its processes' own count (steps x one step's "
        "solo time). Share: the pod's part of the two pods' bill, against its part of their work.",
        "",
        "| scenario | round | pod | billed s | ran s | billed / ran | share billed | share ran |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_scenario: dict[tuple[str, int], list[Row]] = {}
    for row in rows:
        by_scenario.setdefault((row.kind, row.round), []).append(row)

    def share(row: Row, of: str) -> float:
        pair = by_scenario[(row.kind, row.round)]
        total = sum(getattr(r, of) for r in pair)
        return getattr(row, of) / total if total > 0 else float("nan")

    for row in rows:
        ratio = row.billed / row.ran if row.ran > 0 else float("nan")
        lines.append(
            f"| {row.kind} | {row.round} | {row.pod} | {row.billed:.2f} | {row.ran:.2f} | {ratio:.3f} | "
            f"{share(row, 'billed'):.3f} | {share(row, 'ran'):.3f} |"
        )
    lines += [
        "",
        "Each scenario over its rounds: billed / ran, worst and spread (max - min); share billed / share ran, worst.",
        "",
        "| scenario | pod | billed / ran: each round | spread | share billed / share ran: each round |",
        "|---|---|---|---|---|",
    ]
    for kind in args.kinds:
        for role in ("victim", "other"):
            mine = [r for r in rows if r.kind == kind and r.role == role]
            each = [r.billed / r.ran for r in mine if r.ran > 0]
            shares = [share(r, "billed") / share(r, "ran") for r in mine if r.ran > 0]
            if not each:
                lines.append(f"| {kind} | {role} | its processes wrote no work | | |")
                continue
            lines.append(
                f"| {kind} | {ROLES[kind][0 if role == 'victim' else 1]} ({role}) | "
                f"{', '.join(f'{x:.3f}' for x in each)} | {max(each) - min(each):.3f} | "
                f"{', '.join(f'{x:.3f}' for x in shares)} |"
            )
    lines += [
        "",
        f"GPU 0 at the end: SM-busy {gpu_busy:.2f} s; the pods' {pods_busy:.2f} s; unattributed by reason "
        f"{ {k: round(v, 2) for k, v in sorted(unattributed.items())} }",
        "",
        "| check | what |",
        "|---|---|",
    ]

    def ratios(kind: str, role: str, measure: Callable[[Row], float]) -> list[float]:
        return [measure(r) for r in rows if r.kind == kind and r.role == role and r.ran > 0]

    def in_share(r: Row) -> float:
        return share(r, "billed") / share(r, "ran")

    for kind in ("restarts", "idle-context"):
        if kind in args.kinds:
            paid, got = (
                max(ratios(kind, "victim", in_share), default=float("nan")),
                min(ratios(kind, "other", in_share), default=float("nan")),
            )
            check(paid <= 1.05, f"{kind}: the victim's share billed at most 1.05 of its share ran ({paid:.3f})")
            check(got >= 0.90, f"{kind}: the other's share billed at least 0.90 of its share ran ({got:.3f})")
    for kind, bound in (("batches", 0.05), ("two-busy", 0.10)):
        if kind in args.kinds:
            worst = max(
                ratios(kind, "victim", in_share) + ratios(kind, "other", in_share),
                key=lambda x: abs(x - 1),
                default=float("nan"),
            )
            check(
                abs(worst - 1) <= bound,
                f"{kind}: each pod's share billed within {bound:.0%} of its share ran ({worst:.3f})",
            )
    gap = gpu_busy - pods_busy - sum(unattributed.values())
    check(abs(gap) <= 0.01, f"the GPU's SM-busy seconds = the pods' + the unattributed (gap {gap:.4f} s)")
    said = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
    lines += [
        "",
        f"agent log: {len(log.splitlines())} lines; errors: {len(said)}",
        *[f"    {s[:200]}" for s in said[:4]],
    ]
    median = statistics.median(r.billed / r.ran for r in rows if r.ran > 0)
    lines += ["", f"Median billed / ran over every pod: {median:.3f}"]
    publish("The bill on a real GPU, against what each process ran", lines, args.out)
    return 1 if report.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
