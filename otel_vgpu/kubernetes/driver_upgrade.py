"""This node's labels, to let go of the GPU driver while the GPU Operator upgrades it.

The GPU Operator's driver manager (NVIDIA/k8s-driver-manager,
`cmd/driver-manager/main.go`) upgrades a node's driver thus: it sets every
`nvidia.com/gpu.deploy.<operand>` label of the node from `true` to
`paused-for-driver-upgrade` (a value other than `true` gets
`_paused-for-driver-upgrade` appended), which takes the operands' DaemonSet
pods off the node; waits for those pods to end; evicts the GPU pods; then
unloads the `nvidia` kernel module, which fails ("driver is in use") while any
process holds a driver device file open, as NVML does. When the new driver
is loaded it sets the labels back to `true`.

An agent that is not one of those operands is not waited for (only pods of
a DaemonSet whose nodeSelector names `nvidia.com/gpu.deploy.client`, from
GPU Operator v26.7 with driver manager v0.12.0; the `gpu-operator-client`
component of kustomize/ gives the DaemonSet that selector). So the agent
watches its own node and releases NVML as soon as any deploy label says
paused, and uses NVML again when none does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from otel_vgpu.agent_health import Reader, Stage
from otel_vgpu.kubernetes.list_watch import ListWatch, WatchSettings, report_failure

log = logging.getLogger(__name__)

DEPLOY_LABEL_PREFIX = "nvidia.com/gpu.deploy."
PAUSED = "paused-for-driver-upgrade"


def driver_pause(labels: Mapping[str, str]) -> str | None:
    """The first `key=value` among the node's labels that says the driver
    manager has paused the GPU operands for a driver upgrade; None if none does."""
    for key in sorted(labels):
        if key.startswith(DEPLOY_LABEL_PREFIX) and PAUSED in labels[key]:
            return f"{key}={labels[key]}"
    return None


class NodeWatch:
    """Calls `on_pause(reason)` when a driver upgrade pauses this node's GPU
    operands and `on_resume()` when it ends; each once per change."""

    def __init__(
        self,
        settings: WatchSettings,
        on_pause: Callable[[str], None],
        on_resume: Callable[[], None],
    ) -> None:
        from lightkube.resources.core_v1 import Node  # noqa: PLC0415

        node_name = self._node = settings.node_name
        self._on_pause = on_pause
        self._on_resume = on_resume
        self._health = settings.health
        self._paused: str | None = None
        self._loop = ListWatch(
            settings,
            Node,
            what="node",
            fields={"metadata.name": node_name},
            namespace=None,
            on_list=self._listed,
            on_event=self._changed,
            on_failure=self._failed,
            stage=Stage.NODE,
            reader=Reader.API_NODE,
        )

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def _listed(self, nodes: list[Any]) -> None:
        self._health.recovered(Stage.NODE, f"node {self._node} readable again")
        self._labels(nodes[0].metadata.labels if nodes else None)

    def _changed(self, kind: str, node: Any) -> None:
        self._labels(None if kind == "DELETED" else node.metadata.labels)

    def _labels(self, labels: Mapping[str, str] | None) -> None:
        reason = driver_pause(labels or {})
        if reason == self._paused:
            return
        was, self._paused = self._paused, reason
        if reason is not None and was is None:
            self._on_pause(reason)
        elif reason is None:
            self._on_resume()

    def _failed(self, error: Exception) -> None:
        # The last state stays in force: a driver being upgraded stays let go
        # of until the API says otherwise.
        report_failure(
            self._health,
            Stage.NODE,
            error,
            refused=f"Kubernetes API refused the agent ({{status}}) reading node {self._node}: it needs get, list "
            "and watch on nodes to let go of NVML while the GPU Operator upgrades the driver",
            failed=f"Kubernetes API failed reading node {self._node}",
        )
