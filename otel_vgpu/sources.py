"""Choosing the sources a sweep reads: GPU backend, proc root, pod directory, allocation.

Simulation is only ever chosen explicitly (`--simulate`). The Kubernetes API
is used in a cluster (service-account token and KUBERNETES_SERVICE_HOST) or
with `--kubeconfig`; the kubelet's pod-resources API whenever the Kubernetes
API is (its answers name pods, which only the API maps to UIDs).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_vgpu.allocation import AllocationSource, UnknownAllocation
from otel_vgpu.gpu import GpuBackend
from otel_vgpu.pods import PodDirectory, UnresolvedDirectory

log = logging.getLogger("otel_vgpu")
# Long enough for a healthy API server to answer the first list, so the first
# scrape has names; short enough not to matter when it is down.
FIRST_SYNC_WAIT_S = 3.0


# Exit statuses: a bad flag, file or configuration; no GPU to read.
EXIT_USAGE = 2
EXIT_NO_GPU = 1


class SourceError(Exception):
    """A source cannot be set up. `status` is the exit status; the message is one line."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class KubeSettings:
    enabled: bool
    kubeconfig: Path | None
    service_account_dir: Path
    pod_resources: bool
    pod_resources_socket: Path
    pod_resources_interval: float
    resources: tuple[str, ...]
    watch_seconds: int = 300


@dataclass(slots=True)
class Sources:
    backend: GpuBackend
    proc_root: Path
    directory: PodDirectory
    allocation: AllocationSource
    node_name: str | None = None
    """The simulated node's name, when the scenario gives one."""
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for close in reversed(self._closers):
            close()
        self.backend.close()


def build(
    simulate: str | None,
    proc_root: Path,
    node_name: str,
    kube: KubeSettings,
    report: Callable[[str], None],
) -> Sources:
    sources = _gpu_sources(simulate, proc_root)
    try:
        _attach_kubernetes(sources, node_name, kube, report)
    except BaseException:
        sources.close()
        raise
    return sources


def _gpu_sources(simulate: str | None, proc_root: Path) -> Sources:
    if simulate is not None:
        from otel_vgpu.scenario import ScenarioError, load_scenario  # noqa: PLC0415
        from otel_vgpu.simulate import SimulatedNode  # noqa: PLC0415

        try:
            scenario = load_scenario(simulate)
        except ScenarioError as error:
            raise SourceError(str(error), EXIT_USAGE) from None
        node = SimulatedNode(scenario)
        log.warning(
            "simulated GPU node (%s): %d GPUs, %d pods; proc tree in %s",
            simulate,
            len(scenario.gpus),
            len(scenario.pods),
            node.proc_root,
        )
        return Sources(
            backend=node,
            proc_root=node.proc_root,
            directory=node.directory(),
            allocation=node,
            node_name=scenario.node_name,
        )

    from otel_vgpu.nvml import NvmlBackend, NvmlUnavailable  # noqa: PLC0415

    try:
        backend = NvmlBackend()
    except NvmlUnavailable as error:
        raise SourceError(str(error), EXIT_NO_GPU) from None
    return Sources(
        backend=backend, proc_root=proc_root, directory=UnresolvedDirectory(), allocation=UnknownAllocation()
    )


def _attach_kubernetes(sources: Sources, node_name: str, kube: KubeSettings, report: Callable[[str], None]) -> None:
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (kube.service_account_dir / "token").is_file()
    if not kube.enabled or not (kube.kubeconfig or in_cluster):
        why = "--no-kubernetes" if not kube.enabled else "not in a cluster and no --kubeconfig"
        if isinstance(sources.directory, UnresolvedDirectory):
            log.warning("Kubernetes API off (%s): the pod label holds pod UIDs and namespace is empty", why)
        return

    from otel_vgpu.kube import KubePodDirectory, make_client  # noqa: PLC0415
    from otel_vgpu.podresources import KubeletAllocation, PodResourcesClient  # noqa: PLC0415

    def new_client() -> Any:
        return make_client(kube.kubeconfig, kube.service_account_dir)

    try:
        new_client().close()  # a bad configuration fails here, at start
    except Exception as error:  # lightkube raises several kinds for a bad config
        where = kube.kubeconfig or kube.service_account_dir
        raise SourceError(f"cannot use the Kubernetes configuration in {where}: {error}", EXIT_USAGE) from None
    directory = KubePodDirectory(new_client, node_name, kube.resources, report, watch_seconds=kube.watch_seconds)
    directory.start()
    sources._closers.append(directory.stop)
    if not directory.wait_synced(FIRST_SYNC_WAIT_S):
        log.warning("no answer from the Kubernetes API yet; pods show their UIDs until it answers")
    sources.directory = directory

    grpc_client = PodResourcesClient(kube.pod_resources_socket) if kube.pod_resources else None
    if grpc_client is None:
        log.info("pod-resources off (--no-pod-resources): shares come from the pods' GPU limits")
    allocation = KubeletAllocation(
        directory, grpc_client, kube.resources, report, poll_seconds=max(0.1, kube.pod_resources_interval)
    )
    allocation.start()
    sources._closers.append(allocation.stop)
    sources.allocation = allocation
