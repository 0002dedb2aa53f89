"""The simulated node's /proc: `<root>/<pid>/cgroup` and `<root>/<pid>/stat` of each process,
and `<root>/uptime`, written as the kernel writes them, so that the agent's real proc reader,
cgroup parser and attribution cache run on them.

Each cgroup file places its process as a kubelet would: cgroup v1 or v2, the systemd or the
cgroupfs driver, and containerd's, CRI-O's or Docker's naming of the container's cgroup.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from otel_vgpu.sim.scenario import CgroupSpec, PodSpec

log = logging.getLogger(__name__)

# The proc tree's directory is named with this, then the PID of the process that made it.
PROC_TREE_PREFIX = "otel-vgpu-proc-"
# A proc tree's whole name: the prefix, the maker's PID, and mkdtemp's eight random characters.
_TREE_NAME = re.compile(re.escape(PROC_TREE_PREFIX) + r"(?P<pid>[1-9][0-9]*)-[a-z0-9_]{8}")
# In each proc tree: the PID namespace and start time of the process that made it, which tell,
# with the PID in the tree's name, whether that process still runs (`remove_left_behind`).
MAKER_FILE = "maker"
# The simulated node had been up this long when the scenario began: /proc/uptime, and the
# start times in /proc/<pid>/stat (clock ticks after boot), count from its boot.
UP_BEFORE_S = 10_000.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# /proc/<pid>/stat fields 5-21 and 23-52, for the simulated processes.
_STAT_ZEROS = " ".join(["0"] * 17)
_STAT_TAIL = " ".join(["0"] * 30)
_V1_CONTROLLERS = ("cpu,cpuacct", "memory", "pids", "blkio", "devices", "freezer", "perf_event")
_RUNTIME_PREFIX = {"containerd": "cri-containerd", "crio": "crio", "docker": "docker"}


def container_id(pod: PodSpec, container: str) -> str:
    return _container_id(pod.namespace, pod.name, container)


# The scenario's own pods' containers, asked for every listing; a churning node's pods pass
# through, so the caches are bounded well below the churn (a churning pod's cgroup file is made
# once, with its processes, uncached: 65,536 cached files of pods long gone held 45 MiB).
_CACHED = 4096


@functools.lru_cache(maxsize=_CACHED)
def _container_id(namespace: str, name: str, container: str) -> str:
    # Asked for every process each time the node works out who runs: a hash once per container.
    return hashlib.sha256(f"{namespace}/{name}/{container}".encode()).hexdigest()


def cgroup_path(spec: CgroupSpec, pod_uid: str, container: str) -> str:
    """The cgroup path a kubelet with this driver and runtime gives a container."""
    if spec.driver == "systemd":
        uid = pod_uid.replace("-", "_")
        if spec.qos == "guaranteed":
            parent = f"/kubepods.slice/kubepods-pod{uid}.slice"
        else:
            parent = f"/kubepods.slice/kubepods-{spec.qos}.slice/kubepods-{spec.qos}-pod{uid}.slice"
        return f"{parent}/{_RUNTIME_PREFIX[spec.runtime]}-{container}.scope"
    qos = "" if spec.qos == "guaranteed" else f"/{spec.qos}"
    leaf = f"crio-{container}" if spec.runtime == "crio" else container
    return f"/kubepods{qos}/pod{pod_uid}/{leaf}"


def cgroup_text(spec: CgroupSpec, pod_uid: str, container: str, nested: str = "") -> str:
    """The whole `/proc/<pid>/cgroup` of a process in that container, or in a cgroup the
    container made below its own (`nested`, relative)."""
    path = cgroup_path(spec, pod_uid, container) + (f"/{nested}" if nested else "")
    if spec.version == 2:
        return f"0::{path}\n"
    lines = [f"{12 - i}:{controller}:{path}" for i, controller in enumerate(_V1_CONTROLLERS)]
    # Hierarchies a container is not placed in stay at the root, as on real nodes.
    lines += ["4:rdma:/", "3:hugetlb:/", "2:net_cls,net_prio:/"]
    lines.append(f"1:name=systemd:{path}")
    return "\n".join(lines) + "\n"


cgroup_file = functools.lru_cache(maxsize=_CACHED)(cgroup_text)


def start_ticks(t: float) -> int:
    """/proc/<pid>/stat's start time of a process started at scenario time `t`."""
    return max(1, round((UP_BEFORE_S + t) * CLOCK_TICKS))


def new_root() -> Path:
    """A fresh directory for a proc tree, named after the process that made it, so that one
    left behind names its owner; the trees of makers that no longer run are removed first."""
    parent = _memory_backed_tmp()
    me = this_process()
    if me is not None:
        removed = remove_left_behind(Path(parent or tempfile.gettempdir()), me)
        if removed:
            log.debug("removed %d proc trees of simulated nodes no longer running: %s", len(removed), removed)
    root = Path(tempfile.mkdtemp(prefix=f"{PROC_TREE_PREFIX}{os.getpid()}-", dir=parent))
    if me is not None:
        # Written after the directory is made: a tree seen without it is kept (`_left_behind`),
        # so a tree being made is never taken for a stale one.
        (root / MAKER_FILE).write_text(me.line())
    return root


@dataclass(frozen=True)
class Maker:
    """The process that made a proc tree: its PID namespace, since the PID in the tree's name
    means a process only there, and its start time, since a PID is reused once its process ends."""

    namespace: str
    """As /proc/self/ns/pid reads: `pid:[4026531836]`."""
    started: int
    """Clock ticks after boot, /proc/<pid>/stat's field 22."""

    def line(self) -> str:
        return f"{self.namespace} {self.started}\n"

    @classmethod
    def parse(cls, text: str) -> Maker | None:
        fields = text.split()
        if len(fields) != 2 or not fields[1].isdigit():
            return None
        return cls(fields[0], int(fields[1]))


def this_process() -> Maker | None:
    """This process as a tree's maker; None where /proc is not of its PID namespace (a PID
    namespace of its own without a /proc of its own): there no tree can be told alive or not."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
        _, started = _stat("self")
        return Maker(os.readlink("/proc/self/ns/pid"), started)
    except (OSError, ValueError, IndexError):
        return None


def _stat(pid: str) -> tuple[str, int]:
    """A process's state and start time, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        text = handle.read()
    # The command name, in parentheses, may hold spaces and parentheses: fields count from the last ')'.
    fields = text.rsplit(b")", 1)[1].split()
    return fields[0].decode(), int(fields[19])


def remove_left_behind(parent: Path, me: Maker) -> list[Path]:
    """Remove the proc trees in `parent` whose makers no longer run (an agent killed with
    SIGKILL cannot remove its own); those removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed  # a start never fails for litter it cannot see
    for entry in entries:
        try:
            if not _left_behind(entry, me):
                continue
        except OSError:
            continue  # gone meanwhile, or unreadable: not this process's to judge
        # Another node starting at once may be removing it too. rmtree follows no link, and
        # refuses a directory swapped for one since it was looked at.
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(Path(entry.path))
    return removed


def _left_behind(entry: os.DirEntry[str], me: Maker) -> bool:
    """Whether `entry` is a proc tree of this user whose maker is known, of this PID namespace,
    and no longer runs. A tree without a maker file (one being made, or one made before trees
    had one) and one of another PID namespace (an agent in a container sharing this tmpfs,
    whose PIDs mean other processes here) are kept: nothing here tells whether their makers run."""
    match = _TREE_NAME.fullmatch(entry.name)
    if match is None or not entry.is_dir(follow_symlinks=False):
        return False
    if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
        return False
    maker = _maker_of(entry.path)
    if maker is None or maker.namespace != me.namespace:
        return False
    return not _runs(match["pid"], maker.started)


def _maker_of(tree: str) -> Maker | None:
    try:
        fd = os.open(f"{tree}/{MAKER_FILE}", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        return Maker.parse(os.read(fd, 256).decode(errors="replace"))
    finally:
        os.close(fd)


def _runs(pid: str, started: int) -> bool:
    """Whether the process that started at `started` with this PID still runs: a PID now of a
    process started at another time is another's (reused), and a zombie runs nothing."""
    try:
        state, now_started = _stat(pid)
    except (FileNotFoundError, ProcessLookupError):
        return False
    except (OSError, ValueError, IndexError):
        return True  # unreadable: not known to be gone
    return now_started == started and state not in ("Z", "X")


def _memory_backed_tmp() -> str | None:
    """A tmpfs for the proc tree where there is one, as /proc is in memory:
    on a disk-backed /tmp a churning scenario spends its time in mkdir."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


class Listed(Protocol):
    """A process, as far as its /proc files say it."""

    @property
    def pid(self) -> int: ...

    @property
    def start_time(self) -> int: ...

    @property
    def cgroup(self) -> str: ...

    @property
    def command(self) -> str: ...


class ProcTree:
    """The files of a proc tree, kept to the processes it is given: a process's directory is
    written once, and removed when the process is gone or its PID is another's."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._written: dict[int, int] = {}  # pid -> start time on disk

    def write(self, processes: Iterable[Listed], scenario_s: float) -> None:
        """The tree for these processes, `scenario_s` seconds into the scenario."""
        # os calls on strings: a churning soak writes thousands of these a second.
        root = str(self._root)
        # /proc/uptime: seconds since boot (and idle time), as the kernel writes it.
        up = UP_BEFORE_S + scenario_s
        with open(f"{root}/uptime.new", "w") as handle:
            handle.write(f"{up:.2f} 0.00\n")
        os.replace(f"{root}/uptime.new", f"{root}/uptime")
        wanted = {p.pid: p for p in processes}
        for pid in list(self._written):
            if pid not in wanted or wanted[pid].start_time != self._written[pid]:
                directory = f"{root}/{pid}"
                for name in ("cgroup", "stat"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{directory}/{name}")
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
                del self._written[pid]
        for pid, process in wanted.items():
            if pid in self._written:
                continue
            directory = f"{root}/{pid}"
            os.makedirs(directory, exist_ok=True)
            with open(f"{directory}/cgroup", "w") as handle:
                handle.write(process.cgroup)
            # Field 22 is the start time; the command name may hold spaces
            # and parentheses, as real ones can.
            with open(f"{directory}/stat", "w") as handle:
                handle.write(f"{pid} ({process.command}) S 1 {_STAT_ZEROS} {process.start_time} {_STAT_TAIL}\n")
            self._written[pid] = process.start_time
