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
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from otel_vgpu.sim.scenario import CgroupSpec, PodSpec

# The proc tree's directory is named with this, then the PID of the process that made it.
PROC_TREE_PREFIX = "otel-vgpu-proc-"
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
    left behind names its owner."""
    return Path(tempfile.mkdtemp(prefix=f"{PROC_TREE_PREFIX}{os.getpid()}-", dir=_memory_backed_tmp()))


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
