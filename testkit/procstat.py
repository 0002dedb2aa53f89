"""What the benchmarks and the soak read about a running process."""

from __future__ import annotations

import compileall
import os
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
    for folder in dict.fromkeys(
        (sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), str(root / "otel_vgpu"))
    ):
        compileall.compile_dir(folder, quiet=2)
