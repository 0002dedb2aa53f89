"""Which GPU or MIG device an allocator's device name means.

Each allocator names devices its own way (docs/kubernetes.md cites each):

| allocator | whole GPU | replica of a GPU | MIG device |
|---|---|---|---|
| NVIDIA device plugin | `GPU-<uuid>` | `GPU-<uuid>::<n>` | `MIG-<uuid>`, `MIG-<uuid>::<n>` |
| HAMi device plugin | | `GPU-<uuid>-<n>` | |
| GKE device plugin | `nvidia<minor>` | `nvidia<minor>/vgpu<n>` | `nvidia<minor>/gi<id>`, `.../gi<id>/vgpu<n>` |
| NVIDIA DRA driver (`gpu.nvidia.com`) | `gpu-<minor>` | | `gpu-<minor>-mig-<profile>-<profile id>-<placement start>` |

`<minor>` is the GPU's device minor number (`/dev/nvidia<minor>`), which
need not be its NVML index.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from otel_vgpu.gpu.backend import Device

# A replica's suffix: the device plugin's `::<n>`, GKE's `/vgpu<n>`.
_REPLICA = re.compile(r"^(?P<base>.+?)(?:::\d+|/vgpu\d+)$")
# The NVIDIA DRA driver's MIG name: the last two fields are profile ID and placement start.
_DRA_MIG_TAIL = re.compile(r"-\d+-\d+$")


@dataclass(frozen=True, slots=True)
class Target:
    """A device that can be given to a container: a whole GPU or a MIG device of it."""

    gpu: str
    """The physical GPU's UUID."""
    mig: str | None = None
    """The MIG device's UUID; None for the whole GPU."""
    memory_total: int = 0

    @property
    def uuid(self) -> str:
        return self.mig or self.gpu


def dra_profile(profile: str) -> str:
    """A MIG profile as the DRA driver puts it in a device name: dots
    dropped, then lower case with anything outside [a-z0-9-.] made `-`."""
    name = re.sub(r"[^a-z0-9.-]", "-", profile.replace(".", "").lower())
    return name.strip("-").removesuffix(".")


class DeviceMap:
    """Device names to devices, for the GPUs of one sweep."""

    def __init__(self, gpus: Sequence[Device]) -> None:
        self._by_name: dict[str, Target] = {}
        self._whole: dict[str, Target] = {}
        self._dra: dict[str, Target] = {}
        self._dra_mig: dict[str, list[Target]] = {}
        self._dra_exact_prefixes: set[str] = set()
        for gpu in gpus:
            whole = Target(gpu.uuid, None, gpu.memory_total)
            self._by_name[gpu.uuid] = self._whole[gpu.uuid] = whole
            minor = gpu.minor_number
            if minor is not None:
                self._by_name[f"nvidia{minor}"] = whole
                self._dra[f"gpu-{minor}"] = whole
            for mig in gpu.migs:
                target = Target(gpu.uuid, mig.uuid, mig.memory_total)
                self._by_name[mig.uuid] = target
                if minor is None:
                    continue
                if mig.gpu_instance_id is not None:
                    self._by_name[f"nvidia{minor}/gi{mig.gpu_instance_id}"] = target
                prefix = f"gpu-{minor}-mig-{dra_profile(mig.profile)}"
                if mig.profile_id is not None and mig.placement_start is not None:
                    self._dra[f"{prefix}-{mig.profile_id}-{mig.placement_start}"] = target
                # Unknown placements are matched by profile alone, if unique.
                self._dra_mig.setdefault(prefix, []).append(target)
                if mig.profile_id is not None and mig.placement_start is not None:
                    self._dra_exact_prefixes.add(prefix)

    def device(self, device_id: str) -> Target | None:
        """The device a device plugin's ID names (replica suffix and all), if it is on this node."""
        base = device_id.strip()
        match = _REPLICA.match(base)
        if match:
            base = match.group("base")
        target = self._by_name.get(base)
        if target is None and base.startswith("GPU-"):
            # HAMi's replicas: the GPU's UUID, a dash, the replica number.
            head, _, tail = base.rpartition("-")
            if tail.isdigit():
                target = self._whole.get(head)
        return target

    def dra(self, device_name: str) -> Target | None:
        """The device the NVIDIA DRA driver's device name means. A MIG name
        whose profile ID and placement NVML would not give is matched by
        parent and profile when only one such MIG device exists."""
        target = self._dra.get(device_name)
        if target is not None or "-mig-" not in device_name:
            return target
        prefix = _DRA_MIG_TAIL.sub("", device_name)
        if prefix in self._dra_exact_prefixes:
            return None  # known placements, and none is this one
        candidates = self._dra_mig.get(prefix, [])
        return candidates[0] if len(candidates) == 1 else None

    def replicas(self, device_ids: Iterable[str]) -> dict[str, int]:
        """Device UUID -> how many of these IDs name it: the replicas a
        device plugin advertises for each device (1 for an unshared one)."""
        counts: dict[str, int] = {}
        for device_id in device_ids:
            target = self.device(device_id)
            if target is not None:
                counts[target.uuid] = counts.get(target.uuid, 0) + 1
        return counts
