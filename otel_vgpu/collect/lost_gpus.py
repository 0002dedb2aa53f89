"""The GPUs the agent has read, and those the last sweep could not: lost.

A GPU that fell off the bus (XID 79) answers GPU_IS_LOST to every call after, so the sweep
has no row of it, and every series made from the sweep's rows goes. Its XID series must not
go with them: they are the driver's word on what happened to it, and what its alert reads.
So each GPU a sweep read is remembered under its last identity (the labels its series had)
until the agent restarts, and a sweep that cannot read it says it is lost. Pure: the sampler
keeps what is known from sweep to sweep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from otel_vgpu.gpu.backend import Device


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """A GPU's labels as the last sweep that read it gave them."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str | None = None
    driver_version: str | None = None
    """Those of vgpu_gpu_info, which a lost GPU keeps, so that the series joined with it
    (dcgm-exporter's names on its XID) keep their labels too."""


def identity_of(device: Device) -> GpuIdentity:
    return GpuIdentity(device.index, device.uuid, device.model, device.pci_bus_id, device.driver_version)


def after_sweep(
    known: Mapping[str, GpuIdentity], read: Sequence[Device]
) -> tuple[dict[str, GpuIdentity], tuple[GpuIdentity, ...]]:
    """The GPUs known after a sweep that read `read` (by UUID, each under its identity now: a
    GPU's index can change across an NVML re-initialisation, its UUID cannot), and those of
    them it did not read, by index. A sweep that failed as a whole read none."""
    now = {**known, **{device.uuid: identity_of(device) for device in read}}
    read_uuids = {device.uuid for device in read}
    lost = sorted((gpu for uuid, gpu in now.items() if uuid not in read_uuids), key=lambda gpu: (gpu.index, gpu.uuid))
    return now, tuple(lost)
