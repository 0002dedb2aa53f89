"""Rows as a sweep makes them, for the pure tests of what is computed from them."""

from __future__ import annotations

import dataclasses
from typing import Any

from otel_vgpu.collect.aggregate import PodRow
from otel_vgpu.gpu.backend import ProcessUse

GIB = 1024**3


def pod_row(
    name: str, use: ProcessUse | None = None, *, gpu_uuid: str = "GPU-a", processes: int = 1, **changes: Any
) -> PodRow:
    """Pod `name` (UID `uid-<name>`) on GPU 0, one GiB used and given, `processes` processes using
    `use`; `changes`: any other field of the row, as a test needs it."""
    row = PodRow(
        namespace="ns",
        pod=name,
        pod_uid=f"uid-{name}",
        container=None,
        gpu_index=0,
        gpu_uuid=gpu_uuid,
        shares=1.0,
        memory_used=GIB,
        memory_allocated=GIB,
        use=use,
        vgpu_utilization=None,
        processes=processes,
    )
    return dataclasses.replace(row, **changes)
