"""GPU processes to pods, through `<proc-root>/<pid>/cgroup`.

NVML gives each process's PID as the agent's PID namespace numbers it, and
leaves out the processes that have no PID there (drivers from 535.113; see
pidns.py). So the agent shares the host's PID namespace (hostPID), and the
proc root is its own `/proc`, which is then the host's. (Older drivers gave
host PIDs to every caller; for them an agent in its own namespace could read
a mounted host `/proc` through `--proc-root`.) A process keeps its cgroup for
life, so each attribution is cached per (PID, start time): a reused PID has a
different start time and is read again. The start time, on NVML's clock, is also
what tells a PID's samples of the process holding it now from those of the one
that held it before (collect/ledger.py `sampled`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from otel_vgpu.pods.cgroups import PodRef, parse_cgroup

# Real cgroup files are a few hundred bytes; a bigger one is not worth reading
# whole (a v1 file lists at most a dozen hierarchies).
MAX_CGROUP_BYTES = 256 * 1024
# /proc/<pid>/stat counts start times in clock ticks after boot.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# How far the boot time read anew may be from the one kept before it is taken: /proc/uptime
# counts hundredths of a second, and is read a few milliseconds after the clock.
BOOT_MOVED_US = 1_000_000


class ProcUnreadable(Exception):
    """A process exists but its files cannot be read (permissions, I/O)."""


def parse_start_time(stat_text: str) -> int:
    """Field 22 of `/proc/<pid>/stat`: start time in clock ticks after boot.

    The command name (field 2) may hold spaces and parentheses, so fields are
    counted from the last `)`.
    """
    # after_name[0] is field 3 (state), so field 22 is at index 19; the thirty fields after it
    # are left in one piece (a sweep reads every GPU process's stat).
    after_name = stat_text.rsplit(")", 1)[1].split(None, 20)
    return int(after_name[19])


def parse_command(stat_text: str) -> str:
    """Field 2 of `/proc/<pid>/stat`: the command name (the kernel's `comm`,
    at most 15 characters), between the first `(` and the last `)`."""
    return stat_text[stat_text.find("(") + 1 : stat_text.rfind(")")]


class ProcReader:
    """Reads the two files attribution needs from a proc root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # Plain strings: a sweep reads a file per GPU process, and pathlib's
        # joins cost more than the reads.
        self._prefix = str(root).rstrip("/") + "/"

    def start_time(self, pid: int) -> int | None:
        """None if the process is gone."""
        found = self.stat(pid)
        return None if found is None else found[0]

    def stat(self, pid: int) -> tuple[int, str] | None:
        """(start time, command name), or None if the process is gone. Both
        come from `stat`, which every process's PID namespace peer may read:
        no capability is needed, unlike `exe` or `environ`."""
        text = self._read(pid, "stat", 4096)
        if text is None:
            return None
        try:
            return parse_start_time(text), parse_command(text)
        except (IndexError, ValueError):
            raise ProcUnreadable(f"{self.root}/{pid}/stat: unexpected format") from None

    def cgroup(self, pid: int) -> str | None:
        """None if the process is gone."""
        return self._read(pid, "cgroup", MAX_CGROUP_BYTES)

    def boot_us(self, now_us: int) -> int | None:
        """When the node booted, on the clock of `now_us` (microseconds), from `uptime`
        (hundredths of a second, as the start times' clock ticks); None where unreadable."""
        try:
            with open(f"{self._prefix}uptime", "rb") as handle:
                uptime = float(handle.read(64).split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return now_us - round(uptime * 1_000_000)

    def _read(self, pid: int, name: str, limit: int) -> str | None:
        path = f"{self._prefix}{pid}/{name}"
        # os.open and os.read, not open(): a sweep reads every GPU process's stat, and a file
        # object's buffers cost more than the read. Read to the end or the limit, as a file
        # object's read(limit) does.
        try:
            handle = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = os.read(handle, limit)
                while data and len(data) < limit and (more := os.read(handle, limit - len(data))):
                    data += more
            finally:
                os.close(handle)
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
    commands: dict[int, str] = field(default_factory=dict)
    """PID to command name (`comm`), for the processes that could be read."""
    starts: dict[int, int] = field(default_factory=dict)
    """PID to start time (clock ticks after boot), for the processes that could be read."""


@dataclass(frozen=True, slots=True)
class _Cached:
    start: int
    ref: PodRef | None
    command: str


class Attributor:
    """Attributes PIDs to pods, with a cache keyed on (PID, start time). Each process's `stat`
    is read once a sweep (`begin`), for its start time and for its attribution alike, so that
    both are of one process."""

    def __init__(self, reader: ProcReader) -> None:
        self._reader = reader
        self._cache: dict[int, _Cached] = {}
        self._stats: dict[int, tuple[int, str] | ProcUnreadable | None] = {}
        self._boot_us: int | None = None

    def begin(self, now_us: int) -> None:
        """A new sweep, at `now_us` on the samples' clock: each `stat` is read anew. The boot
        time is kept from sweep to sweep, so that a process's start reads the same each time,
        unless the clock has been set over a second away since (NTP's step)."""
        self._stats = {}
        boot = self._reader.boot_us(now_us)
        if boot is None or self._boot_us is None or abs(boot - self._boot_us) > BOOT_MOVED_US:
            self._boot_us = boot

    def started_us(self, pids: Sequence[int]) -> dict[int, int]:
        """When each process started, by PID, on the samples' clock (microseconds); a process
        gone, unreadable, or on a node whose uptime cannot be read is left out."""
        if self._boot_us is None:
            return {}
        started = {}
        for pid in pids:
            stat = self._stat(pid)
            if isinstance(stat, tuple) and (born := self._on_samples_clock(stat[0])) is not None:
                started[pid] = born
        return started

    def look(self, pid: int) -> tuple[int, int | None, PodRef | None] | None:
        """One process seen between sweeps (collect/process_watch.py): its start time (clock ticks),
        the same on the samples' clock (None before the first sweep read the boot time), and
        its pod, read now, while its /proc entry exists; None where it is gone or unreadable.
        The sweep's own pass is left as it is."""
        try:
            stat = self._reader.stat(pid)
            found = None if stat is None else self._of(pid, *stat)
        except ProcUnreadable:
            return None
        return None if found is None else (found.start, self._on_samples_clock(found.start), found.ref)

    def _on_samples_clock(self, start: int) -> int | None:
        """A start time (clock ticks after boot) in microseconds on the samples' clock."""
        return None if self._boot_us is None else self._boot_us + start * 1_000_000 // CLOCK_TICKS

    def _stat(self, pid: int) -> tuple[int, str] | ProcUnreadable | None:
        if pid not in self._stats:
            try:
                self._stats[pid] = self._reader.stat(pid)
            except ProcUnreadable as error:
                self._stats[pid] = error
        return self._stats[pid]

    def attribute(self, pids: Iterable[int]) -> Attribution:
        result = Attribution()
        cache: dict[int, _Cached] = {}
        for pid in pids:
            if pid in result.pods:
                continue
            try:
                found = self._attribute_one(pid, cache)
            except ProcUnreadable as error:
                result.errors.append(str(error))
                found = None
            result.pods[pid] = None if found is None else found.ref
            if found is not None:
                result.commands[pid] = found.command
                result.starts[pid] = found.start
        # Only PIDs seen in this pass survive: the cache can never outgrow the
        # node's current GPU processes. The stat files are read anew in the next pass.
        self._cache = cache
        self._stats = {}
        return result

    def _attribute_one(self, pid: int, cache: dict[int, _Cached]) -> _Cached | None:
        stat = self._stat(pid)
        if isinstance(stat, ProcUnreadable):
            raise stat
        found = None if stat is None else self._of(pid, *stat)
        if found is not None:
            cache[pid] = found
        return found

    def _of(self, pid: int, start: int, command: str) -> _Cached | None:
        """The process that holds `pid` and started at `start`: from the cache, or its cgroup
        read now; None where it has gone."""
        cached = self._cache.get(pid)
        if cached is not None and cached.start == start:
            return cached
        text = self._reader.cgroup(pid)
        # The PID may have been reused between the two reads; only a cgroup
        # read between two equal start times belongs to that process.
        if text is None or self._reader.start_time(pid) != start:
            return None
        return _Cached(start, parse_cgroup(text), command)

    @property
    def cached(self) -> int:
        return len(self._cache)
