"""The soak: pods and processes come and go through the simulated node while
the agent is scraped back to back (bench/soak.py prints it; the reliability
test asserts on it)."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from otel_vgpu.collect.estimator import SETTLE_US
from testkit.agent import get, running_agent, swept_per_scrape
from testkit.procstat import rss_mib


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
    """The agent on a churning scenario, scraped back to back until past the churn's end."""
    churn_s = pods * lifetime_s / live + lifetime_s
    after_s = SETTLE_US / 1e6
    samples: list[Sample] = []
    seen: set[str] = set()
    wrong: list[str] = []
    scrapes = 0
    max_live = 0
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "churn.yaml"
        scenario.write_text(
            "gpus: [{memory: 80GiB}, {memory: 80GiB}]\n"
            f"churn: {{pods: {pods}, live: {live}, lifetime_s: {lifetime_s}, processes: {processes}, memory: 256MiB}}\n"
        )
        ratio = Path(tmp) / "gpu_allocation.txt"
        ratio.write_text("2\n")
        args = swept_per_scrape(scenario, ratio)
        with running_agent(*args, "--log-level", "warning") as agent:
            pid = agent.process.pid
            started = time.monotonic()
            last_sample = -10.0
            final = False
            # Past the churn's end, and the ledger's settling after it (an ended pod's last periods
            # are billed, and collected, before its series goes), so the last pods are seen to go.
            while time.monotonic() - started < churn_s + 3 + after_s:
                status, body, _ = get(f"{agent.url}/metrics", timeout=30)
                assert status == 200
                text = body.decode()
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
                if elapsed - last_sample >= 2 or (elapsed >= churn_s + 2.5 + after_s and not final):
                    last_sample = elapsed
                    final = elapsed >= churn_s + 2.5 + after_s
                    samples.append(
                        Sample(
                            seconds=elapsed,
                            rss_mib=rss_mib(pid),
                            open_fds=len(os.listdir(f"/proc/{pid}/fd")),
                            pod_series=sum(1 for line in text.splitlines() if line.startswith("vgpu_pod_memory_used")),
                            live_pods=len(pods_now),
                            sweeps=sweeps,
                        )
                    )
            returncode, _ = agent.stop()
    return Soak(
        samples=samples,
        scrapes=scrapes,
        pods_seen=len(seen),
        max_live_pods=max_live,
        returncode=returncode,
        wrong_scrapes=wrong,
    )
