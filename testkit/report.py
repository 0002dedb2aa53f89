"""What a real-GPU script reports: its checks as a Markdown table, the scrapes it reads them
from, the agent's CPU while scraped."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testkit.procstat import cpu_seconds

Samples = dict[str, list[tuple[dict[str, str], float]]]
Check = Callable[[bool, str], None]


def scrape(url: str) -> Samples:
    """Every sample of a scrape, by name."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    result: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            result.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return result


def cpu_while_scraped(
    pid: int, url: str, seconds: float, every: float = 15.0, cpu: Callable[[], float] | None = None
) -> float:
    """The CPU process `pid` uses over `seconds`, in percent of a core, while `url` is scraped
    every `every` seconds, as Prometheus would; `cpu` reads its CPU seconds so far, where a
    finer clock than /proc/<pid>/stat's ticks is at hand (a pod's cgroup)."""
    spent = cpu or (lambda: cpu_seconds(pid))
    before = spent()
    wall = scraped_for(url, seconds, every)
    return 100 * (spent() - before) / wall


def scraped_for(url: str, seconds: float, every: float = 15.0) -> float:
    """Scrape `url` every `every` seconds, as Prometheus would, for `seconds`: the seconds it took."""
    started = time.monotonic()
    next_scrape = started
    while (now := time.monotonic()) - started < seconds:
        if now >= next_scrape:
            scrape(url)
            next_scrape += every
        time.sleep(0.2)
    return time.monotonic() - started


def publish(title: str, lines: list[str], out: Path | None) -> None:
    """Print a script's report, and write it to `out` as a Markdown page titled `title`."""
    text = "\n".join(lines)
    print(text)
    if out is not None:
        out.write_text(f"# {title}\n\n{text}\n")


@dataclass
class Report:
    """A validation's table and checks, printed and optionally written out."""

    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> None:
        self.lines.append(f"| {'ok' if ok else 'FAIL'} | {what} |")
        if not ok:
            self.failures.append(what)

    def finish(self, title: str, out: Path | None) -> int:
        """Print, write `out` if given; the exit status: 1 on any failed check."""
        publish(title, self.lines, out)
        print(f"\n{len(self.failures)} failed" if self.failures else "\nall checks passed")
        return 1 if self.failures else 0
