"""HAMi's allocation, read from the pod annotation its scheduler writes.

HAMi's device plugin advertises `GPU-<uuid>-<n>` IDs to the kubelet but
decides each container's GPU, memory and compute from the annotation
`hami.io/vgpu-devices-allocated` (Project-HAMi/HAMi, pkg/device/devices.go,
`EncodePodSingleDevice`): one entry per container, init containers first,
each ended by `;`; in an entry, one `<uuid>,<type>,<memory MiB>,<cores %>`
per device, each ended by `:`. Cores 0 means no compute limit
(`CUDA_DEVICE_SM_LIMIT=0`, pkg/device-plugin/.../plugin/server.go).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from otel_vgpu.pods.directory import StatedGrant

ANNOTATION = "hami.io/vgpu-devices-allocated"
MIB = 1024 * 1024
_FORMAT = (
    "expected '<GPU uuid>,<type>,<memory MiB>,<cores %>' per device, ':' after each device, ';' after each container"
)


# The device IDs HAMi's device plugin advertises to the kubelet: a GPU's UUID, a dash and the
# replica's number (pkg/device-plugin/nvidiadevice: `GPU-<uuid>-<n>`), where NVIDIA's device
# plugin writes `GPU-<uuid>::<n>`.
_HAMI_DEVICE_ID = re.compile(r"^GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}-\d+$")


def hami_device_id(device_id: str) -> bool:
    """Whether the kubelet's device ID is one HAMi's device plugin advertised."""
    return _HAMI_DEVICE_ID.match(device_id.strip()) is not None


class HamiAnnotationError(ValueError):
    """An annotation that cannot be read. The message is one line for the user."""


def parse_hami(
    value: str,
    init_containers: Sequence[str],
    containers: Sequence[str],
    where: str = ANNOTATION,
) -> dict[str, tuple[StatedGrant, ...]]:
    """Container name -> the GPUs the annotation gives it.

    Entries follow init containers then containers, as HAMi's current
    source writes them (`Resourcereqs`); an annotation with exactly one entry
    per regular container is read against the regular containers.
    """
    entries = value.split(";")
    if entries and entries[-1].strip() == "":
        entries.pop()
    names = [*init_containers, *containers]
    if len(entries) == len(containers) and len(entries) != len(names):
        names = list(containers)
    if len(entries) > len(names):
        raise HamiAnnotationError(
            f"{where}: {len(entries)} container entries for {len(names)} containers in {value!r}; {_FORMAT}"
        )
    grants: dict[str, tuple[StatedGrant, ...]] = {}
    for name, entry in zip(names, entries, strict=False):
        devices = [_device(part, where, value) for part in entry.split(":") if part.strip()]
        if devices:
            grants[name] = tuple(devices)
    return grants


def _device(part: str, where: str, value: str) -> StatedGrant:
    fields = part.split(",")
    if len(fields) < 4:
        raise HamiAnnotationError(f"{where}: device {part!r} has {len(fields)} fields in {value!r}; {_FORMAT}")
    uuid, memory, cores = fields[0].strip(), fields[2].strip(), fields[3].strip()
    if not uuid.startswith("GPU-"):
        raise HamiAnnotationError(f"{where}: {uuid!r} in {value!r} is not a GPU UUID (GPU-...); {_FORMAT}")
    try:
        mib, percent = int(memory), int(cores)
    except ValueError:
        raise HamiAnnotationError(
            f"{where}: memory {memory!r} or cores {cores!r} in {value!r} is not a whole number; {_FORMAT}"
        ) from None
    if mib < 0 or not 0 <= percent <= 100:
        raise HamiAnnotationError(
            f"{where}: memory {mib} MiB or cores {percent} % in {value!r} is out of range "
            f"(memory >= 0, cores 0-100); {_FORMAT}"
        )
    return StatedGrant(gpu_uuid=uuid, memory=mib * MIB, compute=percent / 100 if percent else 1.0)
