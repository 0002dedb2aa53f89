"""Whether the agent shares the host's PID namespace, and what it means when it does not.

Since driver 535.113, NVML translates every GPU process's PID into the
caller's PID namespace and leaves out the processes that have no PID there
(`os_find_ns_pid` in NVIDIA's open kernel modules). An agent in a PID
namespace of its own (a pod without `hostPID: true`) is therefore told of no
process at all, while the device itself reports memory in use and busy SMs.
Mounting the host's /proc does not help: the filtering happens in the driver.

The test for "the host's PID namespace" is the kernel's: the initial PID
namespace always has inode `PROC_PID_INIT_INO` (0xEFFFFFFC,
include/linux/proc_ns.h), and every namespace made later gets another. A node
that itself runs in a container (kind) is not in the initial namespace even
with hostPID; that is why the agent reports blindness only when the symptom
is there too: a GPU in use whose processes NVML does not list.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from otel_vgpu.gpu.backend import Device, GpuProcess

PROC_PID_INIT_INO = 0xEFFFFFFC
# An idle GPU with no process holds only the driver's reservations (measured
# on an H200, driver 580: see bench/results/); a GPU holding more than this
# with no process listed has processes NVML is not telling about.
IDLE_MEMORY_BYTES = 1024**3
HOST_PID_FIX = (
    "run the agent in the host's PID namespace (hostPID: true in the pod spec, "
    "docker/podman run --pid=host): since driver 535.113 NVML lists only the processes "
    "visible in the caller's PID namespace"
)


def in_host_pid_namespace(ns_link: str = "/proc/self/ns/pid") -> bool | None:
    """True in the initial PID namespace, False in another, None if it cannot be told."""
    try:
        return os.stat(ns_link).st_ino == PROC_PID_INIT_INO
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class BlindGpu:
    """A GPU in use whose processes NVML does not list to this agent."""

    index: int
    uuid: str
    memory_used: int
    utilization: float

    def describe(self) -> str:
        return (
            f"GPU {self.index} ({self.uuid}) is {self.utilization:.0%} busy with "
            f"{self.memory_used / 1024**3:.1f} GiB in use, yet NVML lists no process on it"
        )


def blind_gpus(
    readings: Sequence[tuple[Device, Sequence[GpuProcess] | None]], in_host_namespace: bool | None
) -> tuple[BlindGpu, ...]:
    """The GPUs whose processes the driver hides from an agent outside the host's PID namespace.

    A GPU counts when its process listing succeeded and was empty while the
    device is busy or holds more than an idle GPU does. GPUs in MIG mode are
    left out: NVML gives them no device utilization, and each MIG device
    holds its own reservation, so an idle one can hold more than 1 GiB.
    """
    if in_host_namespace is not False:
        return ()
    return tuple(
        BlindGpu(device.index, device.uuid, device.memory_used, device.utilization or 0.0)
        for device, processes in readings
        if processes is not None
        and not processes
        and not device.mig_mode
        and ((device.utilization or 0.0) > 0 or device.memory_used > IDLE_MEMORY_BYTES)
    )


def blind_message(gpus: Sequence[BlindGpu]) -> str:
    """One line: what is wrong and the fix."""
    return f"the agent cannot see the GPU processes: {'; '.join(g.describe() for g in gpus)}; {HOST_PID_FIX}"
