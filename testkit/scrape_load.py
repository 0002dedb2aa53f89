"""The scrape benchmarks' node and servers (bench/scrape_bench.py, wrk_keepalive.py,
sweep_cost.py, scrape_profile.py): a simulated node of a given size, the agent and the floor
(testkit/floor_exporter.py) serving it, and one scrape."""

from __future__ import annotations

import functools
import http.client
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

LAYOUTS = [
    {"version": 2, "driver": "systemd", "runtime": "containerd"},
    {"version": 1, "driver": "cgroupfs", "runtime": "docker"},
    {"version": 2, "driver": "systemd", "runtime": "crio"},
    {"version": 1, "driver": "systemd", "runtime": "containerd"},
]


def scenario(gpus: int, pods: int, processes: int) -> dict[str, object]:
    """8 GPUs, pods in 8 namespaces (7 teams and one for every eighth), mixed cgroup layouts."""
    per_pod, extra = divmod(processes, pods)
    pod_list = []
    for p in range(pods):
        count = per_pod + (1 if p < extra else 0)
        pod_list.append(
            {
                "namespace": f"team-{p % 7}" if p % 8 else "inference",
                "name": f"workload-{p}",
                "cgroup": LAYOUTS[p % len(LAYOUTS)],
                "shares": {p % gpus: 1},
                "processes": [
                    {
                        "gpu": (p + i) % gpus,
                        "memory": f"{256 + 64 * (i % 8)}MiB",
                        "sm": {"mean": 0.02, "amplitude": 0.01, "period_s": 30 + p % 10},
                    }
                    for i in range(count)
                ],
            }
        )
    # H200s: 192 processes of up to 704 MiB each fit (the simulator refuses what a GPU cannot hold).
    return {"node": "bench-node", "gpus": [{"memory": "141GiB"} for _ in range(gpus)], "pods": pod_list}


FRESH = {"Cache-Control": "no-cache"}


def scrape(
    port: int, connection: http.client.HTTPConnection | None = None, headers: dict[str, str] | None = None
) -> bytes:
    """One GET /metrics, on `connection` (kept alive) or a new connection."""
    own = connection is None
    conn = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/metrics", headers=headers or {})
        response = conn.getresponse()
        body = response.read()
        expected = response.getheader("Content-Length")
        if response.status != 200 or (expected is not None and len(body) != int(expected)):
            raise OSError(f"status {response.status}, {len(body)} of {expected} bytes")
        return body
    finally:
        if own:
            conn.close()


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    port: int


@contextmanager
def serving(command: Sequence[str], port: int, env: dict[str, str] | None = None) -> Iterator[Served]:
    process = subprocess.Popen(list(command), stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                scrape(port)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit(f"{' '.join(command[:4])}... did not serve on {port}") from None
                time.sleep(0.1)
        yield Served(process, port)
    finally:
        process.terminate()
        process.wait(timeout=10)


def agent_command(scenario_path: Path, ratio: Path, port: int, min_interval: str, *extra: str) -> list[str]:
    """The agent on the simulated node `scenario_path`."""
    return [
        sys.executable,
        "-m",
        "otel_vgpu",
        "--simulate",
        str(scenario_path),
        *_flags(ratio, port, min_interval, extra),
    ]


def replayed_agent_command(recording: Path, ratio: Path, port: int, min_interval: str, *extra: str) -> list[str]:
    """The agent on a node recorded ahead of time (testkit/replay_agent.py): its process does
    the agent's work alone, where on the simulated node it works out the node's answers too."""
    from testkit import replay_agent  # noqa: PLC0415 - the recording's modules, only where one is served

    return replay_agent.command(recording, *_flags(ratio, port, min_interval, extra))


def agent_on(scenario_path: Path, recording: Path | None, seconds: float = 0.0) -> Callable[..., list[str]]:
    """The agent's command line, given its ratio file, port, --min-interval and more flags: on the
    simulated node of `scenario_path`, or (`--replay` of the benchmarks) on its recording of
    `seconds` of the node's clock, made into the folder `recording` first."""
    if recording is None:
        return functools.partial(agent_command, scenario_path)
    from testkit import replay_agent  # noqa: PLC0415 - the recording's modules, only where one is served

    replay_agent.record(recording, scenario_path, seconds)
    return functools.partial(replayed_agent_command, recording)


def _flags(ratio: Path, port: int, min_interval: str, extra: Sequence[str]) -> list[str]:
    return [
        "--allocation-file",
        str(ratio),
        "--address",
        "127.0.0.1",
        "--port",
        str(port),
        "--min-interval",
        min_interval,
        "--log-level",
        "warning",
        *extra,
    ]


def floor_command(scenario_path: Path, ratio: Path, port: int) -> list[str]:
    """The floor (testkit/floor_exporter.py) on the same node."""
    return [
        sys.executable,
        str(Path(__file__).with_name("floor_exporter.py")),
        str(scenario_path),
        str(ratio),
        str(port),
    ]
