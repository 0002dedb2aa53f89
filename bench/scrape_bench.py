"""Scrape cost of the agent on a simulated node, against the floor, in one run.

The floor (testkit/floor_exporter.py) is plain prometheus_client serving the same
series from a snapshot taken once: each scrape only renders what is
precomputed. Every figure below is taken in the same run, agent and floor
one after the other, on the same machine; absolute times vary by machine,
the ratios are what to compare.

1. One scraper, scrapes sharing a sweep (`--min-interval 60`): what a scrape
   costs when it gets the body kept for the sweep, as scrapes within
   `--min-interval` of each other do (with `Cache-Control: no-cache` too: a
   sweep is collected and encoded once, whatever its scrapes ask; a render
   alone is measured in process by scrape_profile.py). Median and p99
   latency, CPU.
2. One scraper, a sweep per scrape (`--min-interval 0 --sweep-interval 0`): the whole
   metrics path, sweep, collection and exposition.
3. 32 scrapers at once for 10 s: at the default `--min-interval 1`, and at
   `--min-interval 0 --sweep-interval 0` (every scrape wants a sweep of its own, so only those
   arriving together share one): responses, incomplete ones, p50 and p99
   against the median of one scraper whose every scrape sweeps (2).
4. A scrape while 200 idle connections are open, against one without.
5. Resident memory at the realistic size with the Kubernetes API and
   pod-resources clients loaded and in use (the API and kubelet doubles of
   testkit/ serve the node's pods), and what each dependency costs.

With `--replay`, the agent serves each node recorded ahead of time (testkit/replay_agent.py):
its process then does the agent's work alone, where on the simulated node each sweep also works
out the node's answers in the agent's process (sim/node.py), which a real node's driver does not.
Part 5, the agent's memory, is measured on the simulated node only: the recorded node's
process holds the whole recording.

    python bench/scrape_bench.py                        # 80 and 384 pods
    python bench/scrape_bench.py --sizes 80             # the realistic size only
    python bench/scrape_bench.py --sizes 80 --replay    # the agent alone, on the recorded node
"""

from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import yaml

from otel_vgpu.sim.scenario_file import load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import free_port
from testkit.procstat import compile_bytecode, cpu_seconds, rss_mib
from testkit.scrape_load import FRESH, Served, agent_on, floor_command, scenario, scrape, serving
from testkit.scrape_load import agent_command as simulated_agent_command
from testkit.sim_cluster import sim_cluster

GOALS = {"sweep": 2.5, "concurrent": 3.0, "idle_ms": 100.0, "rss_mb": 60.0}
# A sweep per scrape on the recorded node, at most: 384 pods take about 0.2 s (bench/README.md).
SWEEP_S = 0.25


def recorded_s(args: argparse.Namespace) -> float:
    """How much of the recorded node's clock an agent may serve: each starts at the recording's
    beginning, and the longest-lived (part 2's scrapes, a sweep each, then part 3's scrapers)
    must stay inside it, past which the answers would stand still."""
    scrapes, seconds = int(args.scrapes + args.warmup), float(args.seconds)
    return 30 + SWEEP_S * scrapes + 2 * seconds + 30


# --- HTTP --------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- 1, 2: one scraper ---------------------------------------------------------------


@dataclass
class Sequential:
    median_ms: float
    p99_ms: float
    cpu_ms: float
    series: int
    size_kib: float


def sequential(served: Served, scrapes: int, warmup: int, headers: dict[str, str] | None = None) -> Sequential:
    for _ in range(warmup):
        scrape(served.port, headers=headers)
    latencies = []
    cpu_before = cpu_seconds(served.process.pid)
    for _ in range(scrapes):
        started = time.perf_counter()
        body = scrape(served.port, headers=headers)
        latencies.append(time.perf_counter() - started)
    cpu = cpu_seconds(served.process.pid) - cpu_before
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return Sequential(
        median_ms=statistics.median(latencies) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        cpu_ms=cpu / scrapes * 1000,
        series=series,
        size_kib=len(body) / 1024,
    )


# --- 3: many scrapers ----------------------------------------------------------------


@dataclass
class Concurrent:
    responses: int
    incomplete: int
    p50_ms: float
    p99_ms: float
    cpu_ms: float
    """The server's CPU per response."""


def concurrent(served: Served, clients: int, seconds: float) -> Concurrent:
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client() -> None:
        connection: http.client.HTTPConnection | None = None
        start.wait()
        while time.monotonic() < stop_at[0]:
            began = time.perf_counter()
            try:
                if connection is None:
                    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
                scrape(served.port, connection)
                with lock:
                    latencies.append(time.perf_counter() - began)
            except (OSError, http.client.HTTPException) as error:
                with lock:
                    failures.append(str(error))
                if connection is not None:
                    connection.close()
                connection = None  # the floor's server closes every connection: reconnect
        if connection is not None:
            connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    cpu_before = cpu_seconds(served.process.pid)
    stop_at[0] = time.monotonic() + seconds
    start.wait()
    for thread in threads:
        thread.join()
    cpu = cpu_seconds(served.process.pid) - cpu_before
    # The floor (wsgiref, HTTP/1.0) closes after each response: a closed keep-alive
    # connection is the server's choice, not an incomplete response.
    incomplete = [f for f in failures if "Remote end closed" not in f and "Broken pipe" not in f]
    return Concurrent(
        responses=len(latencies),
        incomplete=len(incomplete),
        p50_ms=statistics.median(latencies) * 1000 if latencies else float("nan"),
        p99_ms=percentile(latencies, 0.99) * 1000 if latencies else float("nan"),
        cpu_ms=cpu / max(1, len(latencies)) * 1000,
    )


# --- 4: idle connections -------------------------------------------------------------


@dataclass
class IdleDelay:
    without_ms: float
    with_median_ms: float
    with_max_ms: float
    still_open: int
    """Idle connections still accepted or queued by the server after the scrapes (it shed or closed the rest)."""

    @property
    def delay_ms(self) -> float:
        return self.with_max_ms - self.without_ms


def idle_delay(served: Served, idle: int, scrapes: int) -> IdleDelay:
    def timed() -> float:
        began = time.perf_counter()
        scrape(served.port, headers=FRESH)
        return (time.perf_counter() - began) * 1000

    without = statistics.median(timed() for _ in range(scrapes))
    sockets = []
    try:
        for _ in range(idle):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", served.port))
            sockets.append(sock)
        time.sleep(0.5)  # the connections are established and accepted (or queued)
        with_idle = [timed() for _ in range(scrapes)]
        still_open = 0
        for sock in sockets:
            try:
                still_open += sock.recv(1, socket.MSG_PEEK) != b""
            except BlockingIOError:
                still_open += 1  # nothing to read, not closed
            except OSError:
                pass
    finally:
        for sock in sockets:
            sock.close()
    return IdleDelay(without, statistics.median(with_idle), max(with_idle), still_open)


# --- 5: memory -----------------------------------------------------------------------

DEPENDENCIES = [
    ("Python interpreter", ""),
    ("OpenTelemetry SDK", "import opentelemetry.sdk.metrics, opentelemetry.sdk.resources"),
    ("opentelemetry-exporter-prometheus, prometheus_client", "import opentelemetry.exporter.prometheus"),
    ("h11, asyncio, ssl (the HTTP endpoint)", "import h11, asyncio, ssl"),
    ("nvidia-ml-py", "import pynvml"),
    ("lightkube, httpx (Kubernetes API)", "import lightkube, lightkube.resources.core_v1"),
    (
        "grpclib, h2, protobuf (pod-resources)",
        "import grpclib.client, otel_vgpu.kubernetes.podresources, otel_vgpu.kubernetes.kubelet.podresources_pb2",
    ),
    ("bcrypt (basic auth)", "import bcrypt"),
    (
        "OTLP exporters, grpcio (only with OTLP on)",
        "import opentelemetry.exporter.otlp.proto.grpc.metric_exporter, "
        "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    ),
]
PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
last = rss()
for statement in sys.argv[2:]:
    exec(statement)
    now = rss()
    print(now - last if statement else now)
    last = now
"""


def dependency_costs() -> list[tuple[str, float]]:
    """Resident memory each dependency adds, imported in this order in one fresh interpreter."""
    root = str(Path(__file__).resolve().parents[1])
    statements = [statement for _, statement in DEPENDENCIES]
    out = subprocess.run(
        [sys.executable, "-c", PROBE, root, *statements], capture_output=True, text=True, check=True
    ).stdout.split()
    return [(name, float(mib)) for (name, _), mib in zip(DEPENDENCIES, out, strict=True)]


# --- the run -------------------------------------------------------------------------


def met(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def row(label: str, agent: float, floor: float, unit: str, goal: float | None = None) -> str:
    ratio = agent / floor if floor else float("nan")
    verdict = "" if goal is None else f"  goal <= {goal:.1f}x: {met(ratio <= goal)}"
    return f"  {label:34} {agent:9.1f}{unit:>4} {floor:9.1f}{unit:>4} {ratio:9.2f}x{verdict}"


def header(title: str) -> None:
    print(f"\n{title}\n  {'':34} {'agent':>13} {'floor':>13} {'agent/floor':>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="+", default=[80, 384], help="pods; 4 processes each")
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle", type=int, default=200)
    parser.add_argument("--port", type=int, default=0, help="where the agent and the floor serve; 0: a free one")
    parser.add_argument("--replay", action="store_true", help="the agent on each node recorded ahead of time")
    args = parser.parse_args()
    compile_bytecode()  # the figures are the agent's, not Python compiling its imports
    port = args.port or free_port()

    with tempfile.TemporaryDirectory() as tmp:
        ratio = Path(tmp) / "gpu_allocation.txt"
        ratio.write_text("4\n")
        for size_index, pods in enumerate(args.sizes):
            processes = 4 * pods
            scenario_path = Path(tmp) / f"node-{pods}.yaml"
            scenario_path.write_text(yaml.safe_dump(scenario(args.gpus, pods, processes)))
            recording = Path(tmp) / f"recording-{pods}" if args.replay else None
            agent_command = agent_on(scenario_path, recording, recorded_s(args))
            node_name = "simulated" if recording is None else "recorded ahead"
            print(f"\n=== {args.gpus} GPUs, {pods} pods, {processes} processes, the node {node_name} ===")
            realistic = size_index == 0
            with serving(floor_command(scenario_path, ratio, port), port) as floor:
                floor_seq = sequential(floor, args.scrapes, args.warmup)
                floor_rss = rss_mib(floor.process.pid)
                if realistic:
                    floor_concurrent = concurrent(floor, args.clients, args.seconds)
                    floor_idle = idle_delay(floor, args.idle, 30)
            with serving(agent_command(ratio, port, "60"), port) as agent:
                kept = sequential(agent, args.scrapes, args.warmup)
                if realistic:
                    agent_idle = idle_delay(agent, args.idle, 30)
            # A sweep per scrape: with sweeps of its own (--sweep-interval, every 2 s by default)
            # the agent serves the body of its last sweep, whatever --min-interval says.
            per_scrape = ("--sweep-interval", "0")
            with serving(agent_command(ratio, port, "0", *per_scrape), port) as agent:
                sweep = sequential(agent, args.scrapes, args.warmup)
                if realistic:
                    every_sweep = concurrent(agent, args.clients, args.seconds)
            if realistic:
                with serving(agent_command(ratio, port, "1"), port) as agent:
                    default = concurrent(agent, args.clients, args.seconds)
            print(
                f"  series per scrape: agent {kept.series}, floor {floor_seq.series}; response {kept.size_kib:.0f} KiB"
            )
            header("1. one scraper, scrapes sharing a sweep (--min-interval 60): the body kept for the sweep")
            print(row("latency median", kept.median_ms, floor_seq.median_ms, "ms"))
            print(row("latency p99", kept.p99_ms, floor_seq.p99_ms, "ms"))
            print(row("CPU per scrape", kept.cpu_ms, floor_seq.cpu_ms, "ms"))
            header("2. one scraper, a sweep per scrape (--min-interval 0 --sweep-interval 0)")
            print(row("latency median", sweep.median_ms, floor_seq.median_ms, "ms", GOALS["sweep"]))
            print(row("latency p99", sweep.p99_ms, floor_seq.p99_ms, "ms"))
            print(row("CPU per scrape", sweep.cpu_ms, floor_seq.cpu_ms, "ms"))
            if not realistic:
                continue
            for title, figures in (
                ("--min-interval 1, the default", default),
                ("--min-interval 0 --sweep-interval 0", every_sweep),
            ):
                header(f"3. {args.clients} scrapers at once for {args.seconds:g} s, {title}")
                a, f = figures, floor_concurrent
                print(f"  {'responses':34} {a.responses:13d} {f.responses:13d}")
                print(f"  {'incomplete responses':34} {a.incomplete:13d} {f.incomplete:13d}")
                print(row("latency p50", a.p50_ms, f.p50_ms, "ms"))
                print(row("latency p99", a.p99_ms, f.p99_ms, "ms"))
                print(row("server CPU per response", a.cpu_ms, f.cpu_ms, "ms"))
                # Against one scraper whose every scrape sweeps and renders (2): the slowest of
                # 32 at once should wait not much longer than one scrape that does all the work.
                within = a.p99_ms / sweep.median_ms
                verdict = met(within <= GOALS["concurrent"] and a.incomplete == 0)
                goal = f"goal <= {GOALS['concurrent']:.0f}x, none incomplete: {verdict}" if figures is default else ""
                print(f"  agent p99 / one scraper's median with a sweep each (2): {within:.2f}x  {goal}")
            header(f"4. one scraper while {args.idle} idle connections are open")
            print(row("latency median, none idle", agent_idle.without_ms, floor_idle.without_ms, "ms"))
            print(row("latency median, idle open", agent_idle.with_median_ms, floor_idle.with_median_ms, "ms"))
            print(row("latency max, idle open", agent_idle.with_max_ms, floor_idle.with_max_ms, "ms"))
            print(
                f"  agent delay (max with - median without): {agent_idle.delay_ms:.1f} ms  goal <= "
                f"{GOALS['idle_ms']:.0f} ms: {met(agent_idle.delay_ms <= GOALS['idle_ms'])}; "
                f"idle connections still held (accepted or queued): agent {agent_idle.still_open}, "
                f"floor {floor_idle.still_open}"
            )
            if recording is None:
                memory(scenario_path, ratio, port, floor_rss, Path(tmp) / f"cluster-{pods}")
        if args.replay:
            # The recorded node's process holds the whole recording: its memory is not the agent's.
            print("\n5. memory: measured on the simulated node, without --replay")
        print("\n5b. what each dependency adds to a fresh interpreter's resident memory")
        for name, mib in dependency_costs():
            print(f"  {name:54} {mib:6.1f} MiB")


def memory(scenario_path: Path, ratio: Path, port: int, floor_rss: float, where: Path) -> None:
    header("5. resident memory after the scrapes, at this size")
    with serving(simulated_agent_command(scenario_path, ratio, port, "1"), port) as agent:
        sequential(agent, 50, 0)
        alone = rss_mib(agent.process.pid)
    with ExitStack() as stack:
        cluster = stack.enter_context(sim_cluster(load_scenario(str(scenario_path)), where))
        command = simulated_agent_command(
            scenario_path, ratio, port, "1", *cluster.args, "--pod-resources-interval", "1"
        )
        agent = stack.enter_context(serving(command, port, cluster.env))
        deadline = time.monotonic() + 30
        while b'namespace="inference"' not in scrape(port):  # names come from the API double
            if time.monotonic() > deadline:
                raise SystemExit("the agent did not take the pods' names from the API double")
            time.sleep(0.2)
        sequential(agent, 50, 0)
        clustered = rss_mib(agent.process.pid)
        calls = cluster.kubelet.calls
    print(row("RSS, simulated node alone", alone, floor_rss, "MiB"))
    print(row("RSS, API and kubelet clients", clustered, floor_rss, "MiB"))
    megabytes = clustered * 1024 * 1024 / 1e6
    print(
        f"  with the clients: {megabytes:.1f} MB ({calls} pod-resources calls answered)  goal <= "
        f"{GOALS['rss_mb']:.0f} MB: {met(megabytes <= GOALS['rss_mb'])}"
    )


if __name__ == "__main__":
    main()
