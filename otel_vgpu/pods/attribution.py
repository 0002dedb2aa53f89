"""GPU processes to pods, through `<proc-root>/<pid>/cgroup`.

NVML gives each process's PID as the agent's PID namespace numbers it, and
leaves out the processes that have no PID there (drivers from 535.113; see
pidns.py). So the agent shares the host's PID namespace (hostPID), and the
proc root is its own `/proc`, which is then the host's. (Older drivers gave
host PIDs to every caller; for them an agent in its own namespace could read
a mounted host `/proc` through `--proc-root`.) A process keeps its cgroup for
life, so each attribution is cached per (PID, start time): a reused PID has a
different start time and is read again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from otel_vgpu.pods.cgroups import PodRef, parse_cgroup

# Real cgroup files are a few hundred bytes; a bigger one is not worth reading
# whole (a v1 file lists at most a dozen hierarchies).
MAX_CGROUP_BYTES = 256 * 1024


class ProcUnreadable(Exception):
    """A process exists but its files cannot be read (permissions, I/O)."""


def parse_start_time(stat_text: str) -> int:
    """Field 22 of `/proc/<pid>/stat`: start time in clock ticks after boot.

    The command name (field 2) may hold spaces and parentheses, so fields are
    counted from the last `)`.
    """
    after_name = stat_text.rsplit(")", 1)[1].split()
    # after_name[0] is field 3 (state), so field 22 is at index 19.
    return int(after_name[19])


class ProcReader:
    """Reads the two files attribution needs from a proc root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # Plain strings: a sweep reads a file per GPU process, and pathlib's
        # joins cost more than the reads.
        self._prefix = str(root).rstrip("/") + "/"

    def start_time(self, pid: int) -> int | None:
        """None if the process is gone."""
        text = self._read(pid, "stat", 4096)
        if text is None:
            return None
        try:
            return parse_start_time(text)
        except (IndexError, ValueError):
            raise ProcUnreadable(f"{self.root}/{pid}/stat: unexpected format") from None

    def cgroup(self, pid: int) -> str | None:
        """None if the process is gone."""
        return self._read(pid, "cgroup", MAX_CGROUP_BYTES)

    def _read(self, pid: int, name: str, limit: int) -> str | None:
        path = f"{self._prefix}{pid}/{name}"
        try:
            with open(path, "rb") as handle:
                data = handle.read(limit)
        except (FileNotFoundError, ProcessLookupError):
            return None
        except OSError as error:
            raise ProcUnreadable(f"{path}: {error.strerror}") from None
        # Garbage bytes are kept visible, never fatal: the parser skips
        # lines it cannot use.
        return data.decode("utf-8", errors="replace")


@dataclass(slots=True)
class Attribution:
    """Result of one attribution pass."""

    pods: dict[int, PodRef | None] = field(default_factory=dict)
    """PID to pod; None for a process in no pod or gone since NVML listed it."""
    errors: list[str] = field(default_factory=list)
    """Processes whose files exist but could not be read."""


class Attributor:
    """Attributes PIDs to pods, with a cache keyed on (PID, start time)."""

    def __init__(self, reader: ProcReader) -> None:
        self._reader = reader
        self._cache: dict[int, tuple[int, PodRef | None]] = {}

    def attribute(self, pids: Iterable[int]) -> Attribution:
        result = Attribution()
        cache: dict[int, tuple[int, PodRef | None]] = {}
        for pid in pids:
            if pid in result.pods:
                continue
            try:
                ref = self._attribute_one(pid, cache)
            except ProcUnreadable as error:
                result.errors.append(str(error))
                ref = None
            result.pods[pid] = ref
        # Only PIDs seen in this pass survive: the cache can never outgrow the
        # node's current GPU processes.
        self._cache = cache
        return result

    def _attribute_one(self, pid: int, cache: dict[int, tuple[int, PodRef | None]]) -> PodRef | None:
        start = self._reader.start_time(pid)
        if start is None:
            return None
        cached = self._cache.get(pid)
        if cached is not None and cached[0] == start:
            cache[pid] = cached
            return cached[1]
        text = self._reader.cgroup(pid)
        # The PID may have been reused between the two reads; only a cgroup
        # read between two equal start times belongs to that process.
        if text is None or self._reader.start_time(pid) != start:
            return None
        ref = parse_cgroup(text)
        cache[pid] = (start, ref)
        return ref

    @property
    def cached(self) -> int:
        return len(self._cache)
