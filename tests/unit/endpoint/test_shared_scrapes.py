"""Scrapes share work: one sweep and one render for the scrapes that arrive
while it is made, and the body for those that follow until a new sweep is
due; `Cache-Control: no-cache` asks for a render of its own."""

from __future__ import annotations

import gzip
import threading
from pathlib import Path

from testkit.agent import InProcessAgent, agent_in_process, clean_env, get, wait_until

SLOW_NODE = """
node: slow
gpus: [{memory: 80GiB}]
pods:
  - {name: trainer, shares: {0: 1}, processes: [{gpu: 0, memory: 1GiB, sm: 0.5}]}
faults:
  - {call: device_count, delay_s: 2.0}   # every sweep takes 2 s
"""
NODE = """
node: quick
gpus: [{memory: 80GiB}]
pods:
  - {name: trainer, shares: {0: 1}, processes: [{gpu: 0, memory: 1GiB, sm: 0.5}]}
"""


def scenario(tmp_path: Path, text: str) -> str:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return str(path)


def no_sweeper(node: str, ratio_file: Path, min_interval: str) -> tuple[str, ...]:
    """The agent's flags, without sweeps of its own: the sweeps and renders counted are the scrapes'."""
    return (
        "--simulate",
        node,
        "--allocation-file",
        str(ratio_file),
        "--min-interval",
        min_interval,
        "--sweep-interval",
        "0",
    )


def metrics(agent: InProcessAgent, **headers: str) -> bytes:
    status, body, received = get(f"{agent.url}/metrics", headers, timeout=30)
    assert status == 200
    return gzip.decompress(body) if received.get("content-encoding") == "gzip" else body


def test_scrapes_arriving_during_a_render_share_its_sweep_and_body(tmp_path: Path, ratio_file: Path) -> None:
    args = no_sweeper(scenario(tmp_path, SLOW_NODE), ratio_file, "0")
    with agent_in_process(*args, env=clean_env()) as agent:
        sampler, endpoint = agent.agent.sampler, agent.agent.endpoint
        bodies: list[bytes] = []
        lock = threading.Lock()

        def scrape() -> None:
            body = metrics(agent)
            with lock:
                bodies.append(body)

        first = threading.Thread(target=scrape)
        first.start()
        wait_until(lambda: sampler.stuck_for() > 0, what="the first scrape's sweep to start")
        sweeps_before = sampler.sweeps
        others = [threading.Thread(target=scrape) for _ in range(15)]
        for thread in others:
            thread.start()
        for thread in (first, *others):
            thread.join(timeout=30)
        # Sixteen scrapes at once, with --min-interval 0: one sweep, one render, one body.
        assert len(bodies) == 16
        assert len(set(bodies)) == 1
        assert endpoint.renders == 1
        assert sampler.sweeps == sweeps_before == 1
        assert b'pod="trainer"' in bodies[0]


def test_a_body_serves_its_snapshot_and_no_cache_renders_anew(tmp_path: Path, ratio_file: Path) -> None:
    args = no_sweeper(scenario(tmp_path, NODE), ratio_file, "30")
    with agent_in_process(*args, env=clean_env()) as agent:
        endpoint = agent.agent.endpoint
        first = metrics(agent)
        # Within --min-interval: the same bytes, process metrics included, and no render.
        assert metrics(agent) == first
        assert endpoint.renders == 1
        # A fresh render when asked for; it is then the body others get.
        fresh = metrics(agent, **{"Cache-Control": "no-cache"})
        assert endpoint.renders == 2
        assert metrics(agent) == fresh
        metrics(agent, Pragma="no-cache")
        assert endpoint.renders == 3
        # Each format and encoding is rendered once for the snapshot.
        openmetrics = metrics(agent, Accept="application/openmetrics-text; version=1.0.0")
        assert openmetrics.endswith(b"# EOF\n")
        assert metrics(agent, Accept="application/openmetrics-text; version=1.0.0") == openmetrics
        zipped = metrics(agent, **{"Accept-Encoding": "gzip"})
        assert metrics(agent, **{"Accept-Encoding": "gzip"}) == zipped
        assert endpoint.renders == 5
        assert agent.agent.sampler.sweeps == 1


def test_a_new_sweep_gets_a_new_body(tmp_path: Path, ratio_file: Path) -> None:
    args = no_sweeper(scenario(tmp_path, NODE), ratio_file, "0.2")
    with agent_in_process(*args, env=clean_env()) as agent:
        sampler, endpoint = agent.agent.sampler, agent.agent.endpoint
        metrics(agent)
        assert endpoint.renders == 1
        wait_until(lambda: sampler.fresh(0.2) is None, what="the snapshot to age past --min-interval")
        metrics(agent)
        assert endpoint.renders == 2
        assert sampler.sweeps == 2
