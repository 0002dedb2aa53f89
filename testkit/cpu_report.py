"""Where the suite's CPU goes: a pytest plugin that notes each test's CPU (pytest's process and
the children it reaped: agents, Prometheus, helm) and wall time, and a summary by file.

On two cores the suite is bound by CPU, not by its waits (four workers share them), so
`--durations`, which gives wall time, names the tests that waited beside busy ones as often
as the busy ones. Turned on by naming a folder in `TESTKIT_CPU_REPORT`:

    TESTKIT_CPU_REPORT=/tmp/cpu PYTEST_ADDOPTS="-p testkit.cpu_report" ./scripts/test.sh
    .venv/bin/python -m testkit.cpu_report /tmp/cpu

Each worker appends to a file of its own; the summary adds them up by test file, the dearest
first.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _cpu_s() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    folder = os.environ.get("TESTKIT_CPU_REPORT")
    own, reaped = _cpu_s()
    began = time.monotonic()
    yield
    if not folder:
        return
    wall = time.monotonic() - began
    own_after, reaped_after = _cpu_s()
    Path(folder).mkdir(parents=True, exist_ok=True)
    with (Path(folder) / f"{os.getpid()}.tsv").open("a") as out:
        out.write(f"{item.nodeid}\t{own_after - own:.3f}\t{reaped_after - reaped:.3f}\t{wall:.3f}\n")


def by_file(folder: Path) -> list[tuple[str, float, float, int]]:
    """(test file, CPU seconds, wall seconds, tests), the dearest first."""
    files: dict[str, list[float]] = {}
    for path in folder.glob("*.tsv"):
        for line in path.read_text().splitlines():
            nodeid, own, reaped, wall = line.split("\t")
            entry = files.setdefault(nodeid.split("::")[0], [0.0, 0.0, 0])
            entry[0] += float(own) + float(reaped)
            entry[1] += float(wall)
            entry[2] += 1
    rows = [(name, cpu, wall, int(n)) for name, (cpu, wall, n) in files.items()]
    return sorted(rows, key=lambda row: -row[1])


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m testkit.cpu_report FOLDER (a TESTKIT_CPU_REPORT folder)", file=sys.stderr)
        return 2
    rows = by_file(Path(argv[0]))
    total = sum(cpu for _, cpu, _, _ in rows)
    print(f"{'CPU s':>8} {'wall s':>8} {'tests':>6}  file  ({total:.0f} CPU-s in all)")
    for name, cpu, wall, tests in rows:
        print(f"{cpu:8.1f} {wall:8.1f} {tests:6d}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
