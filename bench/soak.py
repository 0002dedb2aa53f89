"""Soak: 5,000 pods and 100,000 processes come and go through the simulated node.

The agent runs as a process on a churning scenario (100 pods alive at a time,
each for 1 s, 20 processes each, PIDs wrapping so they are reused) and is
scraped back to back. Every couple of seconds the script records the agent's
resident memory, open file descriptors, and the pod series in the scrape.

    python bench/soak.py [--pods 5000]

tests/test_reliability.py runs the same soak and asserts on its figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.procstat import free_port, rss_mib

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Sample:
    seconds: float
    rss_mib: float
    open_fds: int
    pod_series: int
    live_pods: int
    sweeps: float


@dataclass
class Soak:
    samples: list[Sample]
    scrapes: int
    pods_seen: int
    max_live_pods: int
    returncode: int
    wrong_scrapes: list[str]
    """Scrapes whose pods were not exactly the pods alive at one moment of the churn."""


def alive_at_one_moment(indexes: set[int], pods: int, live: int) -> bool:
    """Whether `indexes` are the pods a churn has alive at some moment.

    The churn starts pod i at i x lifetime / live and ends it `lifetime`
    later, so at any moment the live pods are consecutive, `live` of them
    (fewer only as the churn starts and ends): a gap is a pod that lives and
    is not reported, an extra one a series that outlived its pod. This holds
    whatever the scrape latency, which only decides which moment is seen.
    """
    if not indexes:
        return True
    low, high = min(indexes), max(indexes)
    consecutive = indexes == set(range(low, high + 1))
    full = len(indexes) == live or low == 0 or high == pods - 1
    return consecutive and full and len(indexes) <= live


def run_soak(pods: int = 5000, live: int = 100, lifetime_s: float = 1.0, processes: int = 20) -> Soak:
    churn_s = pods * lifetime_s / live + lifetime_s
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "churn.yaml"
        scenario.write_text(
            "gpus: [{memory: 80GiB}, {memory: 80GiB}]\n"
            f"churn: {{pods: {pods}, live: {live}, lifetime_s: {lifetime_s}, processes: {processes}, memory: 256MiB}}\n"
        )
        ratio = Path(tmp) / "gpu_allocation.txt"
        ratio.write_text("2\n")
        port = free_port()
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "otel_vgpu",
                "--simulate",
                str(scenario),
                "--allocation-file",
                str(ratio),
                "--address",
                "127.0.0.1",
                "--port",
                str(port),
                "--min-interval",
                "0",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}/metrics"
        samples: list[Sample] = []
        seen: set[str] = set()
        wrong: list[str] = []
        scrapes = 0
        max_live = 0
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(url, timeout=10).read()
                    break
                except OSError:
                    if agent.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the agent did not start") from None
                    time.sleep(0.1)
            started = time.monotonic()
            last_sample = -10.0
            final = False
            # Past the churn's end, so the last pods are seen to go.
            while time.monotonic() - started < churn_s + 3:
                with urllib.request.urlopen(url, timeout=30) as response:
                    text = response.read().decode()
                scrapes += 1
                pods_now: set[str] = set()
                sweeps = 0.0
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        if sample.name == "vgpu_pod_memory_allocated_bytes":
                            pods_now.add(sample.labels["pod"])
                        elif sample.name == "vgpu_agent_collection_duration_seconds_count":
                            sweeps = sample.value
                seen |= pods_now
                indexes = {int(name.removeprefix("job-")) for name in pods_now}
                if not alive_at_one_moment(indexes, pods, live):
                    wrong.append(f"scrape {scrapes}: pods {sorted(indexes)}")
                max_live = max(max_live, len(pods_now))
                elapsed = time.monotonic() - started
                if elapsed - last_sample >= 2 or (elapsed >= churn_s + 2.5 and not final):
                    last_sample = elapsed
                    final = elapsed >= churn_s + 2.5
                    samples.append(
                        Sample(
                            seconds=elapsed,
                            rss_mib=rss_mib(agent.pid),
                            open_fds=len(os.listdir(f"/proc/{agent.pid}/fd")),
                            pod_series=sum(1 for line in text.splitlines() if line.startswith("vgpu_pod_memory_used")),
                            live_pods=len(pods_now),
                            sweeps=sweeps,
                        )
                    )
        finally:
            agent.terminate()
            returncode = agent.wait(timeout=15)
    return Soak(
        samples=samples,
        scrapes=scrapes,
        pods_seen=len(seen),
        max_live_pods=max_live,
        returncode=returncode,
        wrong_scrapes=wrong,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--live", type=int, default=100)
    parser.add_argument("--processes", type=int, default=20)
    args = parser.parse_args()
    soak = run_soak(args.pods, args.live, 1.0, args.processes)
    print(f"{soak.scrapes} scrapes; {soak.pods_seen} pods seen of {args.pods}; at most {soak.max_live_pods} at once")
    print(f"scrapes whose pods were not those alive at one moment: {len(soak.wrong_scrapes)}")
    print(f"{'s':>6} {'RSS MiB':>8} {'fds':>5} {'pod series':>11} {'pods':>5} {'sweeps':>7}")
    for s in soak.samples:
        print(f"{s.seconds:6.1f} {s.rss_mib:8.1f} {s.open_fds:5d} {s.pod_series:11d} {s.live_pods:5d} {s.sweeps:7.0f}")


if __name__ == "__main__":
    main()
