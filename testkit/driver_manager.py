"""The GPU Operator's driver manager, as far as its node-label protocol goes.

What NVIDIA/k8s-driver-manager (`cmd/driver-manager/main.go`, v0.12.0) does
to a node when the driver is upgraded, played against the Kubernetes API
double: `evictAllGPUOperatorComponents` sets each `nvidia.com/gpu.deploy.*`
label the node has with `maybeSetPaused`, waits for the operands' pods to
end, then `unloadDriver` removes the kernel modules (refused while a process
holds a driver file open); `rescheduleGPUOperatorComponents` sets the labels
back with `maybeSetTrue`. The GPU Operator labels a container-workload GPU
node with the deploy labels of `gpuStateLabels` (controllers/state_manager.go).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from testkit.kube_api_double import KubeApiDouble

PAUSED = "paused-for-driver-upgrade"
# gpuStateLabels[gpuWorkloadConfigContainer], GPU Operator v26.7.0.
OPERATOR_LABELS = {
    "nvidia.com/gpu.deploy.driver": "true",
    "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
    "nvidia.com/gpu.deploy.container-toolkit": "true",
    "nvidia.com/gpu.deploy.device-plugin": "true",
    "nvidia.com/gpu.deploy.dcgm": "true",
    "nvidia.com/gpu.deploy.dcgm-exporter": "true",
    "nvidia.com/gpu.deploy.node-status-exporter": "true",
    "nvidia.com/gpu.deploy.operator-validator": "true",
    "nvidia.com/gpu.deploy.client": "true",
    "nvidia.com/gpu.present": "true",
}
# The labels evictAllGPUOperatorComponents sets (the driver's own is not among them).
PAUSED_BY_THE_MANAGER = (
    "nvidia.com/gpu.deploy.operator-validator",
    "nvidia.com/gpu.deploy.container-toolkit",
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.nvsm",
    "nvidia.com/gpu.deploy.sandbox-validator",
    "nvidia.com/gpu.deploy.sandbox-device-plugin",
    "nvidia.com/gpu.deploy.vgpu-device-manager",
    "nvidia.com/gpu.deploy.dra-validator",
    "nvidia.com/gpu.deploy.dcgm-dra",
    "nvidia.com/gpu.deploy.dcgm-exporter-dra",
    "nvidia.com/gpu.deploy.mig-manager",
    "nvidia.com/gpu.deploy.client",
)


def maybe_set_paused(value: str) -> str:
    if value in ("", "false") or PAUSED in value:
        return value
    return PAUSED if value == "true" else f"{value}_{PAUSED}"


def maybe_set_true(value: str) -> str:
    if value == "false":
        return value
    if value == PAUSED:
        return "true"
    return re.sub(PAUSED + "_?", "", value).strip("_")


def holders(driver_file: Path) -> list[int]:
    """PIDs of the processes with `driver_file` open: what makes the kernel
    refuse to unload the module ("driver is in use")."""
    found = []
    target = os.path.realpath(driver_file)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and target in _links(f"/proc/{entry}/fd"):
            found.append(int(entry))
    return found


def _links(fd_dir: str) -> set[str]:
    """What a process's descriptors point at. Each is read on its own: a busy
    process (the agent answering a scrape) closes sockets between the listing
    and the readlink, and one vanished descriptor must not hide the others."""
    try:
        fds = os.listdir(fd_dir)
    except OSError:  # gone, or not ours to look at
        return set()
    links = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            links.add(os.readlink(f"{fd_dir}/{fd}"))
    return links


class DriverManager:
    def __init__(self, api: KubeApiDouble, node: str) -> None:
        self.api = api
        self.node = node

    def label_as_the_operator_does(self) -> None:
        self.api.label_node(self.node, OPERATOR_LABELS)

    def pause(self) -> None:
        labels = self.api.node_labels(self.node)
        self.api.label_node(
            self.node, {key: maybe_set_paused(labels[key]) for key in PAUSED_BY_THE_MANAGER if labels.get(key)}
        )

    def unload(self, driver_file: Path) -> list[int]:
        """The module's unload: the PIDs that keep it in use (empty: it would succeed)."""
        return holders(driver_file)

    def reschedule(self) -> None:
        labels = self.api.node_labels(self.node)
        self.api.label_node(
            self.node, {key: maybe_set_true(labels[key]) for key in PAUSED_BY_THE_MANAGER if labels.get(key)}
        )
