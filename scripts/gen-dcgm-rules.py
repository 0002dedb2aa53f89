#!/usr/bin/env python3
"""Writes deploy/prometheus/dcgm-exporter-names.yaml: recording rules that give dcgm-exporter's
names, units and labels from the agent's families, so that dashboards and alerts written for
dcgm-exporter run unchanged once it is uninstalled (docs/coming-from.md says which fields have
no equivalent, and why). The health and GPM fields come from their declarations
(otel_vgpu/gpu/device_figures.py), the rest from the table below. tests/test_dcgm_names.py
fails when the file is stale, and runs the rules in promtool on what the agent serves.

    .venv/bin/python scripts/gen-dcgm-rules.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from otel_vgpu.export.families import FAMILIES  # noqa: E402
from otel_vgpu.gpu.device_figures import GPM_TABLE, HEALTH_TABLE  # noqa: E402

TARGET = ROOT / "deploy" / "prometheus" / "dcgm-exporter-names.yaml"
MIB = 1048576
# dcgm-exporter's field, the agent's expression of it per GPU, and per pod where dcgm-exporter's
# pod-labelled series has a per-pod answer here (its own: a pod's share, not the GPU's copied).
OTHERS: tuple[tuple[str, str, str | None], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "vgpu_gpu_sm_utilization_ratio * 100", "vgpu_pod_sm_utilization_ratio * 100"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "vgpu_gpu_memory_copy_utilization_ratio * 100", None),
    ("DCGM_FI_DEV_ENC_UTIL", "vgpu_gpu_encoder_utilization_ratio * 100", "vgpu_pod_encoder_utilization_ratio * 100"),
    ("DCGM_FI_DEV_DEC_UTIL", "vgpu_gpu_decoder_utilization_ratio * 100", "vgpu_pod_decoder_utilization_ratio * 100"),
    # DCGM reads nvmlDeviceGetMemoryInfo_v2 from driver R510 on (DcgmCacheManager.cpp's
    # ReadAndCacheFBMemoryInfo): its FB_USED is v2's `used`, the allocated memory without the
    # reservation that the agent's used (v1's) holds, and FB_RESERVED is v2's `reserved`. Where
    # the driver has no v2, DCGM's FB_USED is v1's, and so is this.
    (
        "DCGM_FI_DEV_FB_USED",
        f"((vgpu_gpu_memory_used_bytes - vgpu_gpu_memory_reserved_bytes) or vgpu_gpu_memory_used_bytes) / {MIB}",
        f"vgpu_pod_memory_used_bytes / {MIB}",
    ),
    ("DCGM_FI_DEV_FB_RESERVED", f"vgpu_gpu_memory_reserved_bytes / {MIB}", None),
    ("DCGM_FI_DEV_FB_FREE", f"(vgpu_gpu_memory_total_bytes - vgpu_gpu_memory_used_bytes) / {MIB}", None),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "vgpu_gpu_energy_joules_total * 1000", None),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        f"(vgpu_gpu_nvlink_transmit_bytes_per_second + vgpu_gpu_nvlink_receive_bytes_per_second) / {MIB}",
        None,
    ),
)
PROMETHEUS_NAME = {family.name: family.prometheus_name for family in FAMILIES}


def scaled(name: str, scale: float) -> str:
    return name if scale == 1.0 else f"{name} * {scale:g}"


def mappings() -> list[tuple[str, str, str | None]]:
    """(dcgm-exporter field, the agent's expression per GPU, per pod or None), in dcgm's units."""
    out = []
    for figure in HEALTH_TABLE:
        if figure.dcgm:
            out.append((figure.dcgm, scaled(PROMETHEUS_NAME[f"vgpu.gpu.{figure.name}"], figure.dcgm_scale), None))
    for gpm in GPM_TABLE:
        if gpm.dcgm:
            pod = scaled(PROMETHEUS_NAME[f"vgpu.pod.{gpm.name}"], gpm.dcgm_scale) if gpm.per_pod else None
            out.append((gpm.dcgm, scaled(PROMETHEUS_NAME[f"vgpu.gpu.{gpm.name}"], gpm.dcgm_scale), pod))
    return [*out, *OTHERS]


def with_dcgm_labels(expression: str, pod: bool) -> str:
    """`expression` with dcgm-exporter's labels beside the agent's: gpu, UUID, device,
    modelName, and Hostname, the node's name from the agent's target_info where Prometheus has
    it. A pod's series get their GPU's model too."""
    series = f"({expression})"
    if pod:
        model = "group by (gpu_uuid, gpu_model) (vgpu_gpu_memory_total_bytes)"
        series = f"{series} * on (gpu_uuid) group_left (gpu_model) {model}"
    named = (
        f"({series} * on (job, instance) group_left (k8s_node_name) target_info)\n"
        f"  or ignoring (k8s_node_name)\n{series}"
    )
    for label, source, value in (
        ("gpu", "gpu_id", "$1"),
        ("UUID", "gpu_uuid", "$1"),
        ("device", "gpu_id", "nvidia$1"),
        ("modelName", "gpu_model", "$1"),
        ("Hostname", "k8s_node_name", "$1"),
    ):
        named = f'label_replace(\n{named},\n"{label}", "{value}", "{source}", "(.+)")'
    return named + "\n"


class Block(str):
    """A rule's expression, written as a YAML literal block."""


yaml.SafeDumper.add_representer(
    Block, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", str(text), style="|")
)


def rules() -> str:
    records = []
    for name, gpu, pod in mappings():
        expression = with_dcgm_labels(gpu, pod=False)
        if pod is not None:  # the pods' series have pod labels the GPU's lack: both kept
            expression = f"(\n{expression})\nor\n(\n{with_dcgm_labels(pod, pod=True)})\n"
        records.append({"record": name, "expr": Block(expression)})
    header = (
        "# dcgm-exporter's names, units and labels from otel-vgpu's families (docs/coming-from.md).\n"
        "# Generated by scripts/gen-dcgm-rules.py from the families' declarations: do not edit. Load it in\n"
        "# place of dcgm-exporter, not beside it (both would name the same series).\n"
    )
    document = {"groups": [{"name": "otel-vgpu.dcgm-exporter-names", "rules": records}]}
    return header + yaml.safe_dump(document, sort_keys=False, width=200)


if __name__ == "__main__":
    TARGET.write_text(rules())
    print(f"wrote {TARGET.relative_to(ROOT)}")
