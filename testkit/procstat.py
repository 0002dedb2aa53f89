"""What the benchmarks and the soak read about a running process."""

from __future__ import annotations

import compileall
import os
import sys
import sysconfig
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def rss_by_mapping(pid: int, most: int = 10) -> list[tuple[str, float]]:
    """A process's resident memory by what is mapped (a library's file, `[heap]`, `[anon]` for
    the unnamed), in MiB, the `most` largest: how much of it is the process's own and how much
    the libraries it loaded (libnvidia-ml and the CUDA driver's, say), from /proc/<pid>/smaps."""
    by_name: dict[str, int] = {}
    name = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if head and "-" in head[0] and not head[0].endswith(":"):
            name = Path(head[5]).name if len(head) == 6 and head[5].startswith("/") else (head[5:] or ["[anon]"])[0]
        elif head and head[0] == "Rss:":
            by_name[name] = by_name.get(name, 0) + int(head[1])
    ranked = sorted(by_name.items(), key=lambda item: -item[1])
    return [(mapped, kib / 1024) for mapped, kib in ranked[:most]]


def children(pid: int) -> list[int]:
    """The PIDs of a process's children (the first process of a PID namespace
    that `unshare --fork` made, say)."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def compile_bytecode() -> None:
    """Write the bytecode of every installed module and of the agent, as pip does when it
    installs (the image's) and uv does not: with none, each process a benchmark starts compiles
    its imports, and its memory and start-up figures measure the compiler (nvidia-ml-py's
    import alone: 17 MiB of peak memory uncompiled, 4 MiB compiled)."""
    root = Path(__file__).resolve().parents[1]
    compileall.compile_dir(str(root / "otel_vgpu"), quiet=2)
    # The installed packages once per state of the environment: walking their 20,000-odd files
    # to find nothing to do cost each benchmark a second of CPU. Installing or removing a
    # package changes its folder's time, and with it the mark.
    installed = list(dict.fromkeys((sysconfig.get_path("purelib"), sysconfig.get_path("platlib"))))
    mark = Path(sys.prefix) / ".bytecode-compiled"
    state = " ".join(str(os.stat(folder).st_mtime_ns) for folder in installed)
    if mark.exists() and mark.read_text() == state:
        return
    for folder in installed:
        compileall.compile_dir(folder, quiet=2)
    mark.write_text(state)
