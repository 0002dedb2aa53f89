"""wrk (a C client: Python threads on two cores would measure the client) as an attacker's
load against the agent, for as long as a test needs it.

`flood` starts wrk on the CPUs the agent is not pinned to (`AGENT_CPU`), with a duration
well past the test's own bound, and stops it (SIGINT: wrk prints its summary) when the test
is done with it. `sources` makes its connections come from many addresses in turn
(testkit/bind_sources.c, preloaded; wrk cannot bind one itself); `script` is a wrk Lua
script, to vary each request.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The agent runs alone on this CPU where the machine has two or more (the setting:
# the agent pinned alone on a core); wrk on the others.
AGENT_CPU = 0
# What a flood may last at most, whatever the test: it is stopped when the test is done.
LONGEST_S = 120
_REQUESTS = re.compile(r"(\d+) requests in")


def pinned() -> tuple[str, ...]:
    """A prefix for the agent's command line that pins it to AGENT_CPU (none on one CPU)."""
    if (os.cpu_count() or 1) < 2 or shutil.which("taskset") is None:
        return ()
    return ("taskset", "-c", str(AGENT_CPU))


def _elsewhere() -> tuple[str, ...]:
    """A prefix that keeps wrk off AGENT_CPU (none on one CPU)."""
    if not pinned():
        return ()
    others = sorted(set(os.sched_getaffinity(0)) - {AGENT_CPU})
    return ("taskset", "-c", ",".join(map(str, others))) if others else ()


@dataclass
class Flood:
    process: subprocess.Popen[str]
    output: str = ""
    requests: int = 0
    """Requests wrk completed, from its summary (set once stopped)."""
    lines: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.output, _ = self.process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.output, _ = self.process.communicate()
        found = _REQUESTS.search(self.output)
        self.requests = int(found.group(1)) if found else 0
        self.lines = [line.strip() for line in self.output.splitlines() if line.strip()]


def bind_library(directory: Path) -> Path:
    """testkit/bind_sources.c built into `directory` (once)."""
    library = directory / "bind_sources.so"
    if not library.exists():
        compiler = shutil.which("cc") or shutil.which("gcc")
        assert compiler, "a C compiler (Debian's gcc, installed by scripts/test.sh) builds testkit/bind_sources.c"
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(HERE / "bind_sources.c"), "-ldl"],
            check=True,
            capture_output=True,
        )
    return library


@contextmanager
def flood(
    url: str,
    connections: int,
    headers: Sequence[str] = (),
    script: str | None = None,
    sources: tuple[str, int] | None = None,
) -> Iterator[Flood]:
    """wrk against `url` with `connections` connections (its `headers`, its Lua `script`),
    from `sources` (the first address and how many, in turn) if given; stopped on leaving."""
    wrk = shutil.which("wrk")
    assert wrk, "wrk (Debian's package, installed by scripts/test.sh) is the attackers' load"
    with tempfile.TemporaryDirectory(prefix="otel-vgpu-wrk-") as work:
        command = [wrk, "-t2", f"-c{connections}", f"-d{LONGEST_S}s", "--timeout", "5s"]
        for header in headers:
            command += ["-H", header]
        if script is not None:
            path = Path(work) / "flood.lua"
            path.write_text(script)
            command += ["-s", str(path)]
        env = dict(os.environ)
        if sources is not None:
            env.update(LD_PRELOAD=str(bind_library(Path(work))), BIND_FIRST=sources[0], BIND_COUNT=str(sources[1]))
        process = subprocess.Popen(
            [*_elsewhere(), *command, url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        running = Flood(process)
        try:
            yield running
        finally:
            running.stop()
