"""The agent's own CPU, reader by reader, on a large node, without the simulator's cost.

For each GPU count (40 processes a GPU, in pods of 4, each pod holding a share of its GPU), a
simulated node is asked ahead of time, in this process, what the agent's readers ask, for
the whole run (testkit/nvml_replay.py `record`); its proc tree stays on disk. Each row then
runs in a fresh process: the agent is built as `otel-vgpu --simulate` builds it, on a
simulated clock, with the recording's replay (`Replay`) standing where the simulated node
would, so that the backend's answers cost an index and the rest is the agent's own code. Each
reader is called by hand at the agent's default cadence (otel_vgpu/config.py and the readers'
modules): a sweep about every 2 s (jittered as collect/sweeper.py draws it), the process watch
every 0.25 s, the health read every 10 s, the XID take every 1 s, the kubelet's pod-resources
every 5 s (over gRPC to testkit/kubelet_double.py, its server's threads not counted), a
scrape every `--scrape-every` s (its collection and its render apart) and the OTLP push every
60 s (collected, translated and encoded as OTLP/HTTP protobuf; not sent). GPM reads are made
inside the sweeps: their time is shown apart from the sweep's. Not included: the Kubernetes
API's watch (events per pod change, not per cadence; bench/kube_client_cost.py) and the
HTTP server (bench/scrape_bench.py).

CPU is `time.process_time` around each call (every thread: the health and XID reads run on
worker threads), the pod-resources call's `time.thread_time` (the kubelet double serves on
threads of this process), over `--seconds` of the simulated clock after 30 s of warm-up,
as a share of one core. RSS is the resident memory the agent's parts added to the process
(after the recording was loaded, before the agent was built; the SDK's imports included).
The reference beside it: the same backend calls replayed alone, at the same instants, and one
read of each process's /proc files, which any exporter of per-pod figures makes.

    .venv/bin/python bench/agent_cost.py [--gpus 1 8 16] [--scrapes 15 1] [--seconds 120]
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A row runs on a simulated clock, set before the agent's modules bind time.monotonic as their
# clocks' defaults: sweeps, windows and cadences move with it, without waiting for them.
ROW = "--row" in sys.argv
_NOW = [0.0]
_real_monotonic = time.monotonic
if ROW:
    time.monotonic = lambda: _NOW[0]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit import nvml_replay  # noqa: E402

WARMUP_S = 30.0
PROCESSES_PER_POD = 4
# The readers of a row, in the order of the table's columns.
READERS = ("sweep", "gpm", "watch", "health", "xid", "pod_resources", "collect", "render", "otlp")


def scenario(gpus: int, per_gpu: int) -> dict[str, object]:
    """`gpus` H100s, each with `per_gpu` processes in pods of four holding a share of it; each
    process's SM and DRAM use waves, so that every figure (samples, GPM, engines) moves."""
    pods = []
    for gpu in range(gpus):
        for n in range(per_gpu // PROCESSES_PER_POD):
            pods.append(
                {
                    "namespace": f"team-{n % 5}",
                    "name": f"gpu{gpu}-workload-{n}",
                    "shares": {gpu: 1},
                    "processes": [
                        {
                            "gpu": gpu,
                            "memory": f"{256 + 64 * k}MiB",
                            "sm": {"mean": 0.02, "amplitude": 0.01, "period_s": 30 + n % 10},
                            "dram": 0.01 * (k % 3),
                        }
                        for k in range(PROCESSES_PER_POD)
                    ],
                }
            )
    return {"node": "cost-node", "gpus": [{"model": "NVIDIA H100 80GB HBM3", "memory": "80GiB"}] * gpus, "pods": pods}


@dataclass
class Row:
    """One row's CPU seconds by reader, over `seconds` of the simulated clock."""

    gpus: int
    processes: int
    scrape_every: float
    seconds: float
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(READERS, 0.0))
    replayed: float = 0.0
    """Of the readers' time, the replay's answers: the same backend calls made alone after the run."""
    wrapper: float = 0.0
    """Of the readers' time, the bench's own wrapper around each backend call (`wrapper_cost`)."""
    reference: float = 0.0
    rss_mib: float = 0.0
    rss_total_mib: float = 0.0
    series: int = 0
    command: str = ""

    def share(self, seconds: float) -> float:
        """`seconds` of CPU over the run, in % of a core."""
        return 100 * seconds / self.seconds

    def total(self) -> float:
        return sum(self.cpu.values())


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- one row, in a process of its own ------------------------------------------------------


@dataclass
class CallLog:
    """Every backend call the agent made in the measured period. Only listed: timing each call
    inside the run (two `thread_time` calls and a thread-local depth a call) cost the readers
    more than the replay's answers did; their time is taken apart, by the same calls made alone
    after the run (`reference`). The replay's methods call none of each other, so no call
    nests."""

    calls: list[tuple[float, str, tuple[Any, ...]]] = field(default_factory=list)
    on: bool = False

    def wrap(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        calls = self.calls

        def wrapper(*args: Any) -> Any:
            if self.on:
                calls.append((_NOW[0], name, args))
            return call(*args)

        return wrapper


def wrapper_cost(log: CallLog, rounds: int = 200_000) -> float:
    """CPU seconds a call spends in `CallLog`'s wrapper (a call's layer and its listing), beyond
    the call itself: what the readers' figures hold of the bench, measured apart."""

    def bare(*args: Any) -> None:
        return None

    probe = CallLog(on=True)
    wrapped = probe.wrap("probe", bare)
    best = []
    for call in (bare, wrapped, bare, wrapped):
        started = time.process_time()
        for _ in range(rounds):
            call(1)
        best.append(time.process_time() - started)
        probe.calls.clear()
    return max(0.0, (min(best[1], best[3]) - min(best[0], best[2])) / rounds) * len(log.calls)


BACKEND_CALLS = (
    "device_count",
    "device",
    "energy",
    "processes",
    "memory_used",
    "utilization_samples",
    "gpu_utilization_samples",
    "exclusive_process",
    "accounting_pids",
    "accounting_stats",
    "health",
    "gpm",
    "xid_events",
)


class EncodingExporter:
    """Stands for the OTLP/HTTP exporter: encodes each push as it would, sends nothing."""

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics  # noqa: PLC0415
        from opentelemetry.sdk.metrics.export import MetricExportResult  # noqa: PLC0415

        encode_metrics(metrics_data).SerializeToString()
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def kubelet_double(socket: Path, view: Any) -> Any:
    """The kubelet's pod-resources API answering the recording's view."""
    from testkit.kubelet_double import KubeletDouble  # noqa: PLC0415

    double = KubeletDouble(socket)
    for assigned in view.devices:
        double.assign(
            assigned.namespace, assigned.pod, {assigned.container: list(assigned.device_ids)}, assigned.resource
        )
    double.allocatable = {resource: list(ids) for resource, ids in view.allocatable or ()}
    return double.start()


def run_row(directory: Path, scrape_every: float, seconds: float) -> Row:
    from otel_vgpu.collect import gpm_reads  # noqa: PLC0415
    from otel_vgpu.collect.device_health import HEALTH_EVERY_S  # noqa: PLC0415
    from otel_vgpu.collect.sweeper import next_wait  # noqa: PLC0415
    from otel_vgpu.collect.xids import POLL_S, XidWatch  # noqa: PLC0415
    from otel_vgpu.export.exposition import TEXT  # noqa: PLC0415
    from otel_vgpu.kubernetes.podresources import PodResourcesClient  # noqa: PLC0415
    from otel_vgpu.memory import quiet_collector  # noqa: PLC0415
    from otel_vgpu.sim import node as sim_node  # noqa: PLC0415

    recording = nvml_replay.load(directory)
    _NOW[0] = recording.start_s
    before = rss_mib()
    replay = nvml_replay.Replay(recording)
    log = CallLog()
    for name in BACKEND_CALLS:
        setattr(replay, name, log.wrap(name, getattr(replay, name)))
    # `--simulate` builds the simulated node here: the replay stands in its place.
    sim_node.SimulatedNode = lambda *args, **kwargs: replay  # type: ignore[assignment,misc]
    spent: dict[str, float] = dict.fromkeys(READERS, 0.0)
    measuring = [False]

    def timed(reader: str, call: Callable[..., Any], clock: Callable[[], float] = time.process_time) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return call(*args, **kwargs)
            finally:
                if measuring[0]:
                    spent[reader] += clock() - started

        return wrapper

    # GPM is read inside the sweeps: its time is shown apart (and taken from the sweep's).
    gpm_reads.GpmReads.read = timed("gpm", gpm_reads.GpmReads.read)  # type: ignore[method-assign]
    agent = build_agent(directory)
    try:
        # The bench drives the health reads on the cadence (as `start` would on a thread): a
        # collection then serves the last read and never reads itself.
        if agent.devices is not None:
            agent.devices._thread = threading.Thread(target=lambda: None)
        if agent.telemetry.pusher is not None:
            agent.telemetry.pusher._exporter = EncodingExporter()
        reader = agent.telemetry.reader
        reader.collect_data = timed("collect", reader.collect_data)
        xids = XidWatch(agent._backend, agent.xids, agent.health, agent.sampler.gpu_indices) if agent.xids else None
        double = kubelet_double(directory / "kubelet.sock", recording.view)
        client = PodResourcesClient(directory / "kubelet.sock")
        client._loop.time = _real_monotonic  # type: ignore[method-assign]  # its timeouts in real time
        config = agent.config
        draw = random.Random(1)
        cadences: dict[str, float] = {
            "watch": config.watch_interval,
            "health": HEALTH_EVERY_S,
            "xid": POLL_S,
            "pod_resources": config.pod_resources_interval,
            "scrape": scrape_every,
        }
        if agent.telemetry.pusher is not None and agent.otlp is not None:
            cadences["otlp"] = agent.otlp.interval_s
        calls: dict[str, Callable[[], Any]] = {
            "sweep": agent.sampler.sweep,
            "watch": agent.sampler.watch,
            "health": agent.devices.refresh if agent.devices is not None else lambda: None,
            "xid": xids.take if xids is not None else lambda: None,
            "scrape": lambda: agent.telemetry.render(TEXT),
            "otlp": agent.telemetry.pusher.push if agent.telemetry.pusher is not None else lambda: None,
        }
        start = recording.start_s
        end = start + WARMUP_S + seconds
        events: list[tuple[float, str]] = [(start, "sweep"), *((start + 0.1, name) for name in cadences)]
        heapq.heapify(events)
        agent.sampler.drive()
        body = b""
        while events:
            t, name = heapq.heappop(events)
            if t >= end:
                break
            _NOW[0] = t
            if not measuring[0] and t >= start + WARMUP_S:
                quiet_collector()  # as the agent does once it serves
                measuring[0] = log.on = True
            if name == "pod_resources":
                timed(name, client.list, time.thread_time)()
            elif name == "scrape":
                took = time.process_time()
                body = calls[name]()
                if measuring[0]:
                    spent["render"] += time.process_time() - took
            else:
                timed(name, calls[name])()
            wait = next_wait(config.sweep_interval, draw) if name == "sweep" else cadences[name]
            heapq.heappush(events, (t + wait, name))
        log.on = False
        spent["render"] -= spent["collect"]
        spent["sweep"] -= spent["gpm"]
        row = Row(
            gpus=len(recording.exclusive),
            processes=sum(len(p) for p in recording.ticks[0].processes),
            scrape_every=scrape_every,
            seconds=seconds,
            cpu=spent,
            rss_mib=rss_mib() - before,
            rss_total_mib=rss_mib(),
            series=sum(1 for line in body.splitlines() if line and not line.startswith(b"#")),
        )
        row.replayed, row.reference = reference(replay, log.calls, recording.proc_root)
        row.wrapper = wrapper_cost(log)
        client.close()
        double.stop()
        return row
    finally:
        # The push thread was never started (the bench pushes by hand): nothing to stop.
        agent.telemetry.pusher = None
        agent.close()


def build_agent(directory: Path) -> Any:
    from otel_vgpu.agent import Agent  # noqa: PLC0415
    from otel_vgpu.config import parse_config  # noqa: PLC0415
    from testkit.agent import free_port  # noqa: PLC0415

    argv = ["--simulate", str(directory / "node.json"), "--address", "127.0.0.1", "--port", str(free_port())]
    # The OTLP push on, to a collector never reached: its exporter is swapped for `EncodingExporter`.
    argv += ["--otlp-endpoint", "http://127.0.0.1:4318", "--otlp-protocol", "http/protobuf"]
    return Agent(parse_config(argv, {}))


def reference(
    replay: nvml_replay.Replay, calls: list[tuple[float, str, tuple[Any, ...]]], proc_root: Path
) -> tuple[float, float]:
    """CPU seconds of the same backend calls made alone, at the same instants (the replay's part
    of the readers' time), and of those and one read of each process's /proc files: what any
    exporter of per-pod figures pays at the least."""
    raw = nvml_replay.Replay(replay.recording)
    started = time.process_time()
    for t, name, args in calls:
        _NOW[0] = t
        getattr(raw, name)(*args)
    replayed = time.process_time() - started
    for directory in proc_root.iterdir():
        if directory.name.isdigit():
            (directory / "cgroup").read_bytes()
            (directory / "stat").read_bytes()
    return replayed, time.process_time() - started


# --- the table ---------------------------------------------------------------------------


def record_node(directory: Path, gpus: int, per_gpu: int, seconds: float) -> float:
    """The node's answers recorded in `directory`; the seconds the recording took."""
    from otel_vgpu.sim.scenario_file import load_scenario  # noqa: PLC0415

    node = directory / "node.json"
    node.write_text(json.dumps(scenario(gpus, per_gpu)))
    started = _real_monotonic()
    nvml_replay.record(load_scenario(str(node)), directory, WARMUP_S + seconds + 5).save(directory)
    return _real_monotonic() - started


def row_command(directory: Path, scrape_every: float, seconds: float) -> list[str]:
    return [
        sys.executable,
        __file__,
        "--row",
        str(directory),
        "--scrape-every",
        f"{scrape_every:g}",
        "--seconds",
        f"{seconds:g}",
    ]


def print_table(rows: list[Row]) -> None:
    names = ("sweep", "GPM", "process watch", "health", "XID", "pod-resources", "collect", "render", "OTLP push")
    print(
        "| GPUs | processes | scrape | "
        + " | ".join(names)
        + " | total | of which the replay | of which the bench's wrapper | reference | total ÷ reference"
        + " | RSS (agent's parts) |"
    )
    print("|---" * (len(names) + 9) + "|")
    for row in rows:
        cells = [f"{row.share(row.cpu[reader]):.2f}" for reader in READERS]
        total = row.total()
        print(
            f"| {row.gpus} | {row.processes} | {row.scrape_every:g} s | "
            + " | ".join(cells)
            + f" | **{row.share(total):.2f}** | {row.share(row.replayed):.2f} | {row.share(row.wrapper):.2f} "
            f"| {row.share(row.reference):.3f} "
            f"| {total / row.reference:.0f}x | {row.rss_mib:.1f} MiB |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--per-gpu", type=int, default=40, help="processes a GPU")
    parser.add_argument("--scrapes", type=float, nargs="+", default=[15.0, 1.0], help="scrape intervals, seconds")
    parser.add_argument("--seconds", type=float, default=120.0, help="of the simulated clock, measured")
    parser.add_argument("--keep", type=Path, help="record into this directory and keep it (bench/flamegraph.py)")
    parser.add_argument("--record-only", action="store_true", help="record into --keep, measure nothing")
    parser.add_argument("--row", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scrape-every", type=float, default=15.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row is not None:
        row = run_row(args.row, args.scrape_every, args.seconds)
        print(json.dumps(dataclasses.asdict(row)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="agent-cost-") as temporary:
        for gpus in args.gpus:
            directory = (args.keep or Path(temporary)) / f"{gpus}-gpus"
            directory.mkdir(parents=True, exist_ok=True)
            took = record_node(directory, gpus, args.per_gpu, args.seconds)
            print(f"recorded {gpus} GPUs x {args.per_gpu} processes in {took:.0f} s", file=sys.stderr)
            for scrape_every in [] if args.record_only else args.scrapes:
                command = row_command(directory, scrape_every, args.seconds)
                out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
                row = Row(**json.loads(out.strip().splitlines()[-1]))
                row.command = " ".join(command[1:])
                rows.append(row)
    if args.record_only:
        return 0
    print(
        f"% of a core, over {args.seconds:g} s of a simulated clock after {WARMUP_S:g} s of warm-up, "
        "at the agent's default cadences\n"
    )
    print_table(rows)
    print("\n" + "\n".join(f"- {row.gpus} GPUs, {row.scrape_every:g} s: {row.series} series" for row in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
