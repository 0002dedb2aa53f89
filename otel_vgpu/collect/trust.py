"""What a sweep refuses to let a tenant decide: pure rules over what NVML and /proc gave.

docs/trust.md says who can write each input. Here, at each sweep:

- a pod the Kubernetes API does not know (while the API is on and has listed this node's
  pods) holds no share, and only the first `MAX_UNKNOWN_PODS` of them get rows: the rest's
  processes are unattributed, so no set of made-up pods multiplies the series or the shares;
- MPS is known from NVML's own list of MPS clients, never from a process's name. On a GPU
  with clients, NVML gives each server all of its clients' SM samples and the clients none,
  so those processes' use is unknown, unless one pod holds both a server and every client
  (a pod running its own MPS daemon): then its server's samples are that pod's work. The
  server is every process beside the clients on a GPU in EXCLUSIVE_PROCESS compute mode
  (which the NVIDIA device plugin's MPS daemon sets, and which allows one context: the
  server's); in the default mode, a process named like the server that is outside every pod
  (a host's daemon) or in a pod of a namespace trusted with it (the device plugin's); else,
  where every client is of one pod, a process so named in that pod: a tenant's own daemon
  (`nvidia-cuda-mps-control -d`, which needs no privilege), whose samples are its clients'
  work, all that pod's. A process in a tenant's pod that only calls itself the server is
  that pod's, as any other: what it is given is its own pod's either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from otel_vgpu.collect.aggregate import GpuReading
from otel_vgpu.pods.cgroups import PodRef

# The MPS server's command name: `nvidia-cuda-mps-server` cut to the kernel's 15
# characters (TASK_COMM_LEN), as /proc/<pid>/stat gives it.
MPS_SERVER_COMMAND = "nvidia-cuda-mps-server"[:15]
# Pods the Kubernetes API does not know that get rows of their own, at most: a new pod the
# watch has not brought yet, a static pod before its mirror. Past these, their usage is the
# GPU's unattributed.
MAX_UNKNOWN_PODS = 16


def bound_unknown(
    pods_by_pid: Mapping[int, PodRef | None], known: Callable[[str], bool], limit: int = MAX_UNKNOWN_PODS
) -> tuple[dict[int, PodRef | None], frozenset[str], tuple[int, ...]]:
    """`pods_by_pid` with the processes of pods `known` refuses, past the first `limit` of them
    (in UID order, so that the same pods keep their rows from sweep to sweep), unattributed;
    the UIDs of the unknown pods kept, which hold no share; the PIDs made unattributed."""
    unknown = sorted({ref.pod_uid for ref in pods_by_pid.values() if ref is not None and not known(ref.pod_uid)})
    kept = frozenset(unknown[:limit])
    refused = frozenset(unknown[limit:])
    bounded: dict[int, PodRef | None] = {}
    dropped = []
    for pid, ref in pods_by_pid.items():
        if ref is not None and ref.pod_uid in refused:
            bounded[pid] = None
            dropped.append(pid)
        else:
            bounded[pid] = ref
    return bounded, kept, tuple(dropped)


def judge_mps(
    reading: GpuReading,
    pods_by_pid: Mapping[int, PodRef | None],
    commands: Mapping[int, str],
    trusted: Callable[[PodRef], bool],
) -> tuple[GpuReading, tuple[int, ...]]:
    """The reading with its MPS servers counted and the processes whose use NVML cannot tell
    marked (module docstring); and the processes that call themselves the server in a pod
    not trusted with it, which are not (their pods', billed as any other)."""
    processes = reading.processes or ()
    clients = {p.pid for p in processes if p.mps_client}
    named = {p.pid for p in processes if not p.mps_client and commands.get(p.pid) == MPS_SERVER_COMMAND}

    def in_trusted_place(pid: int) -> bool:
        ref = pods_by_pid.get(pid)
        return ref is None or trusted(ref)

    if not clients:
        return reading, tuple(sorted(pid for pid in named if not in_trusted_place(pid)))
    if reading.device.exclusive_process:
        servers = {p.pid for p in processes if not p.mps_client}
    else:
        servers = {pid for pid in named if in_trusted_place(pid)}
        if not servers:
            servers = _own_server(clients, named, pods_by_pid)
    decoys = tuple(sorted(named - servers))
    owners = {None if (ref := pods_by_pid.get(pid)) is None else ref.pod_uid for pid in clients | servers}
    if servers and len(owners) == 1 and None not in owners:
        # One pod runs its own MPS: its server's samples are its own clients' work.
        return dataclasses.replace(reading, mps_servers=len(servers)), decoys
    return dataclasses.replace(reading, unknown_pids=frozenset(clients | servers), mps_servers=len(servers)), decoys


def _own_server(clients: set[int], named: set[int], pods_by_pid: Mapping[int, PodRef | None]) -> set[int]:
    """The processes named like the server in the one pod every client is of: that pod's own
    MPS daemon (NVML's client list is the driver's, which no pod writes); none otherwise."""
    client_pods = {None if (ref := pods_by_pid.get(pid)) is None else ref.pod_uid for pid in clients}
    if len(client_pods) != 1 or None in client_pods:
        return set()
    (uid,) = client_pods
    return {pid for pid in named if (ref := pods_by_pid.get(pid)) is not None and ref.pod_uid == uid}
