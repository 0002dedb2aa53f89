"""What the hostile-client tests share (tests/system/test_hostile_clients.py, tests/system/test_wrk_floods.py):
the agent under attack with the endpoint's bounds cut to a fraction (`LIMITS`), a legitimate
scraper that times and counts its scrapes, and the bounds the agent's memory, threads and
descriptors are held to under an attack and after it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from otel_vgpu.limits import Limits
from testkit.agent import ROOT, clean_env, free_port, launched, wait_until
from testkit.launch import overrides_json
from testkit.procstat import cpu_seconds, rss_mib

# The endpoint's bounds in these tests: the defaults, each time in them a fraction of itself.
LIMITS = Limits(head_deadline_s=2.0, handshake_s=2.0, idle_s=5.0, shed_after_s=0.5, stall_s=0.5)


# How often the legitimate scraper scrapes, and how many of its scrapes an attack that holds
# its position must last through.
SCRAPE_EVERY_S = 0.25


SCRAPES_UNDER_ATTACK = 5


# Within this a legitimate scrape must be answered: under every wait an attack could impose
# on it. A shed (stall_s, shed_after_s: 0.5 s here) it may wait for; a timer it may not.
SCRAPE_BOUND_S = 0.75 * min(LIMITS.head_deadline_s, LIMITS.handshake_s, LIMITS.admit_wait_s)


# Growth of resident memory an attack may cause, and how near its baseline it must come back.
RSS_BOUND_MIB = 60


RSS_SETTLED_MIB = 25


# Threads the agent may add under attack: none per connection; the fixed pools fill lazily.
THREAD_SLACK = LIMITS.workers + 4


# Open connections; then, each up to Limits.backlog, those accepted in one turn of the
# loop, those shed or refused and not yet closed (a transport closes on the loop's next turn),
# and those still queued in the kernel; and a few of the agent's own. What is asserted is that
# the bound follows the limits, not the attack (1,000 connections): one run peaked at 210
# above the baseline against an earlier slack of 208.
FD_SLACK = LIMITS.connections + LIMITS.admit_queue + 3 * LIMITS.backlog + 16


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Scraper:
    """A legitimate client: one scrape every SCRAPE_EVERY_S, each timed."""

    url: str
    context: ssl.SSLContext | None = None
    auth: str | None = None
    source: str | None = None
    """The address it connects from (127/8 has many), else the kernel's choice."""
    durations: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    outcomes: list[bool] = field(default_factory=list)
    """Each scrape's: answered (200) or not."""
    _stop: threading.Event = field(default_factory=threading.Event)

    def scrape_once(self, accept: str | None = None) -> None:
        """One scrape, timed; in the format `accept` names, if any (then only its status is checked)."""
        import http.client  # noqa: PLC0415

        host, port = self.url.split("//", 1)[1].split(":")
        started = time.monotonic()
        failed = len(self.failures)
        connection: http.client.HTTPConnection
        source = (self.source, 0) if self.source else None
        if self.context is not None:
            connection = http.client.HTTPSConnection(
                host, int(port), context=self.context, timeout=5, source_address=source
            )
        else:
            connection = http.client.HTTPConnection(host, int(port), timeout=5, source_address=source)
        try:
            headers = {"Authorization": self.auth} if self.auth else {}
            if accept is not None:
                headers["Accept"] = accept
            connection.request("GET", "/metrics", headers=headers)
            response = connection.getresponse()
            body = response.read()
            if response.status != 200 or (accept is None and b"vgpu_pod_memory_used_bytes" not in body):
                self.failures.append(f"status {response.status}: {body[:60]!r}")
        except OSError as error:
            self.failures.append(repr(error))
        finally:
            connection.close()
        self.durations.append(time.monotonic() - started)
        self.outcomes.append(len(self.failures) == failed)

    def forget(self) -> None:
        """Start counting afresh."""
        self.durations.clear()
        self.failures.clear()
        self.outcomes.clear()

    def scraped_through(self, timeout: float = 30) -> None:
        """Back once SCRAPES_UNDER_ATTACK scrapes have been made since it started (or `timeout`)."""
        wait_until(lambda: len(self.durations) >= SCRAPES_UNDER_ATTACK, what="scrapes under attack", timeout=timeout)

    def run(self) -> None:
        while not self._stop.is_set():
            self.scrape_once()
            self._stop.wait(SCRAPE_EVERY_S)

    @contextmanager
    def running(self) -> Iterator[Scraper]:
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(timeout=10)


@dataclass
class Agent:
    process: subprocess.Popen[str]
    url: str
    port: int

    @property
    def pid(self) -> int:
        return self.process.pid


@contextmanager
def agent(tmp_path: Path, *extra: str, prefix: tuple[str, ...] = ()) -> Iterator[Agent]:
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("2\n")
    ratio.chmod(0o644)
    port = free_port()
    process = subprocess.Popen(
        [
            *prefix,
            *launched(
                "--simulate", "--allocation-file", str(ratio), "--address", "127.0.0.1", "--port", str(port), *extra
            ),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(TESTKIT_CONFIG=overrides_json(LIMITS)),
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        yield Agent(process, url, port)
    finally:
        process.terminate()
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


@dataclass
class Baseline:
    rss: float
    threads: int
    fds: int
    variants_s: float = 0.0
    """Unattacked, one scrape in each body format (OpenMetrics or not, four escapings), each
    the first in its format, so an encoding of its own: what a scraper may wait for behind
    clients asking every variant of a new snapshot, on this machine as loaded now."""
    encoding_cpu_s: float = 0.0
    """The agent's CPU time over those scrapes, per scrape: what one encoding of a body costs
    it, in CPU time, which a loaded machine stretches far less than it stretches wall time."""


def gpu_threads_up(pid: int) -> bool:
    """Whether every GPU has its reading threads (collect/gpm_reads.py, collect/device_health.py,
    collect/xids.py): its GPM thread from the first sweep, where the GPU has GPM; its health
    and XID threads from the health reader's and the XID reader's first rounds, which come
    last, a second or so after the start. The GPUs are those any such thread names."""
    kinds: dict[str, set[str]] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()
        except OSError:  # a thread that ended meanwhile
            continue
        if match := re.fullmatch(r"gpu(\d+)-([a-z]+)", name):
            kinds.setdefault(match[1], set()).add(match[2])
    return bool(kinds) and all({"health", "xid"} <= each for each in kinds.values())


def settle(pid: int) -> Baseline:
    """The agent's figures once it has served a few scrapes (its pools made, its caches warm),
    and once its threads are all up: each GPU's threads start with the first sweep and the first
    rounds that read it (`gpu_threads_up`). Polled for by name rather than waiting for the count
    to hold still a while: that wait was a second of every test of the hostile-client lane, and
    the count, descriptors and memory read at this point are those read a second or two later."""
    wait_until(lambda: gpu_threads_up(pid), what="the agent's threads all up", timeout=30)
    return Baseline(rss_mib(pid), threads(pid), fds(pid))


def attack_while_scraped(
    target: Agent,
    scraper: Scraper,
    attack: Callable[[], None],
    baseline: Baseline,
    established: threading.Event | None = None,
) -> tuple[float, int, int]:
    """Run `attack` with the scraper going (from when the attack says it is
    `established`, for attacks that hold a position); the peak RSS, threads and fds seen."""
    peak = [baseline.rss, baseline.threads, baseline.fds]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                peak[0] = max(peak[0], rss_mib(target.pid))
                peak[1] = max(peak[1], threads(target.pid))
                peak[2] = max(peak[2], fds(target.pid))
            except OSError:
                return
            done.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    if established is None:
        with scraper.running():
            attack()
    else:
        attacker = threading.Thread(target=attack, daemon=True)
        attacker.start()
        assert established.wait(60), "the attack did not get going"
        with scraper.running():
            attacker.join(timeout=120)
    done.set()
    watcher.join(timeout=5)
    return peak[0], int(peak[1]), int(peak[2])


def assert_bounded(target: Agent, baseline: Baseline, peak: tuple[float, int, int]) -> None:
    """The agent's memory, threads and descriptors under their bounds, and back near the baseline."""
    rss, peak_threads, peak_fds = peak
    assert rss < baseline.rss + RSS_BOUND_MIB, (rss, baseline)
    assert peak_threads <= baseline.threads + THREAD_SLACK, (peak_threads, baseline)
    assert peak_fds <= baseline.fds + FD_SLACK, (peak_fds, baseline)
    # Afterwards: back near the baseline (connections closed, buffers freed).
    wait_until(lambda: fds(target.pid) <= baseline.fds + 2, what="file descriptors back to baseline", timeout=15)
    wait_until(lambda: threads(target.pid) <= baseline.threads + THREAD_SLACK, what="threads back", timeout=15)
    wait_until(
        lambda: rss_mib(target.pid) < baseline.rss + RSS_SETTLED_MIB,
        what=f"memory back near {baseline.rss:.0f} MiB (peak {rss:.0f} MiB)",
        timeout=15,
    )


def warm(scraper: Scraper, target: Agent) -> Baseline:
    """Scrapes until five in a row succeed (HTTP or HTTPS), times one in each body format
    (Baseline.variants_s), then the baseline."""
    deadline = time.monotonic() + 30
    while True:
        scraper.forget()
        for _ in range(5):
            scraper.scrape_once()
        if not scraper.failures:
            break
        assert target.process.poll() is None and time.monotonic() < deadline, scraper.failures
        time.sleep(0.2)
    scraper.forget()
    formats = list(dict.fromkeys(accept for accept, _ in VARIANTS))
    cpu = cpu_seconds(target.pid)
    for accept in formats:
        scraper.scrape_once(accept)
    encoding_cpu_s = (cpu_seconds(target.pid) - cpu) / len(formats)
    assert not scraper.failures, scraper.failures
    variants_s = sum(scraper.durations)
    scraper.forget()
    return dataclasses.replace(settle(target.pid), variants_s=variants_s, encoding_cpu_s=encoding_cpu_s)


# Every body variant a client can ask for: OpenMetrics or the text format, four escapings, gzip or not.
VARIANTS = [
    (accept, encoding)
    for escaping in ("underscores", "dots", "values", "allow-utf-8")
    for accept in (
        f"application/openmetrics-text;version=1.0.0;escaping={escaping}",
        f"text/plain;version=1.0.0;escaping={escaping}",
    )
    for encoding in ("gzip", "identity")
]


FAIR_SCRAPES = 10


def scraped_nine_in_ten(scraper: Scraper) -> None:
    """At least 9 of the scraper's 10 scrapes under attack answered (200)."""
    answered = [d for d, ok in zip(scraper.durations, scraper.outcomes, strict=True) if ok]
    print(
        f"\n  {len(answered)} of {len(scraper.durations)} scrapes answered, slowest "
        f"{max(answered, default=0) * 1000:.0f} ms"
    )
    assert len(scraper.durations) >= FAIR_SCRAPES, scraper.durations
    assert len(scraper.failures) <= len(scraper.durations) // FAIR_SCRAPES, scraper.failures
