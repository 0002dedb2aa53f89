"""dcgm-exporter's names from the agent's families (deploy/prometheus/dcgm-exporter-names.yaml),
run in promtool on the series the agent serves: each field in dcgm-exporter's unit (as its CSV
and DCGM's dcgm_fields.h give them, written out here, not taken from the generator), with
dcgm-exporter's labels."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_vgpu.collect.device_health import DeviceHealth
from otel_vgpu.collect.reading import GpuReader
from otel_vgpu.collect.xids import XidCounts
from otel_vgpu.export.exposition import TEXT
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.health import Health
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.agent import ROOT
from testkit.clock import Clock
from testkit.promtext import parse
from testkit.scripts import load as load_script

from .conftest import make_sampler

RULES = ROOT / "deploy" / "prometheus" / "dcgm-exporter-names.yaml"
MIB = 1048576
# Each dcgm-exporter field: the agent's family it comes from, and what one unit of the family
# is in the field's unit (MHz, W, °C, ns, MiB, mJ, percent 0-100, ratio 0-1, bytes/s); a
# negative number divides (bytes to MiB), as the rule does.
GPU_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("vgpu_gpu_sm_clock_hertz", 1e-6),
    "DCGM_FI_DEV_MEM_CLOCK": ("vgpu_gpu_memory_clock_hertz", 1e-6),
    "DCGM_FI_DEV_GPU_TEMP": ("vgpu_gpu_temperature_celsius", 1.0),
    "DCGM_FI_DEV_MEMORY_TEMP": ("vgpu_gpu_memory_temperature_celsius", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("vgpu_gpu_power_watts", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("vgpu_gpu_power_limit_watts", 1.0),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("vgpu_gpu_pcie_replays_total", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("vgpu_gpu_clock_event_reasons", 1.0),
    "DCGM_FI_DEV_POWER_VIOLATION": ("vgpu_gpu_power_violation_seconds_total", 1e9),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("vgpu_gpu_thermal_violation_seconds_total", 1e9),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("vgpu_gpu_ecc_corrected_total", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("vgpu_gpu_ecc_uncorrected_total", 1.0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("vgpu_gpu_remapped_rows_correctable_total", 1.0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("vgpu_gpu_remapped_rows_uncorrectable_total", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("vgpu_gpu_remapped_rows_failure", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("vgpu_gpu_graphics_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("vgpu_gpu_sm_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("vgpu_gpu_sm_occupancy_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("vgpu_gpu_tensor_active_ratio", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("vgpu_gpu_dram_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("vgpu_gpu_fp64_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("vgpu_gpu_fp32_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("vgpu_gpu_fp16_active_ratio", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("vgpu_gpu_pcie_transmit_bytes_per_second", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("vgpu_gpu_pcie_receive_bytes_per_second", 1.0),
    "DCGM_FI_DEV_GPU_UTIL": ("vgpu_gpu_sm_utilization_ratio", 100.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("vgpu_gpu_memory_copy_utilization_ratio", 100.0),
    "DCGM_FI_DEV_DEC_UTIL": ("vgpu_gpu_decoder_utilization_ratio", 100.0),
    "DCGM_FI_DEV_FB_USED": ("vgpu_gpu_memory_used_bytes", -MIB),
    "DCGM_FI_DEV_FB_RESERVED": ("vgpu_gpu_memory_reserved_bytes", -MIB),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("vgpu_gpu_energy_joules_total", 1000.0),
}
# The fields with a pod-labelled series: the pod's own figure.
POD_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("vgpu_pod_graphics_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("vgpu_pod_sm_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("vgpu_pod_sm_occupancy_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("vgpu_pod_tensor_active_ratio", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("vgpu_pod_dram_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("vgpu_pod_fp64_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("vgpu_pod_fp32_active_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("vgpu_pod_fp16_active_ratio", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("vgpu_pod_pcie_transmit_bytes_per_second", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("vgpu_pod_pcie_receive_bytes_per_second", 1.0),
    "DCGM_FI_DEV_GPU_UTIL": ("vgpu_pod_sm_utilization_ratio", 100.0),
    "DCGM_FI_DEV_DEC_UTIL": ("vgpu_pod_decoder_utilization_ratio", 100.0),
    "DCGM_FI_DEV_FB_USED": ("vgpu_pod_memory_used_bytes", -MIB),
}
# Generated, and not checked on this node: an encoder and NVLink, which its GPU has not.
UNCHECKED = {
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
}
NODE = """
node: gpu-node-7
gpus:
  - {model: NVIDIA H100 80GB HBM3, memory: 80GiB, lacks: [encoder]}
pods:
  - namespace: ml
    name: trainer
    shares: {0: 1}
    processes: [{gpu: 0, memory: 8GiB, sm: 0.75, tensor: 0.5, dram: 0.25, decoder: 0.25}]
health_events:
  - {gpu: 0, at_s: 1, ecc: corrected, count: 3}
  - {gpu: 0, from_s: 0, to_s: 4, throttle: [power_cap]}
"""
TARGET = {"job": "otel-vgpu", "instance": "10.0.0.7:8080"}


def test_the_rules_file_is_what_the_declarations_make() -> None:
    assert RULES.read_text() == load_script("gen-dcgm-rules.py").rules(), (
        "regenerate it: .venv/bin/python scripts/gen-dcgm-rules.py"
    )


def served(tmp_path: Path, scenario: str = NODE) -> str:
    """What the agent serves on the node above, its GPM window closed, the throttle over."""
    clock = Clock(0.0)
    node = SimulatedNode(parse_scenario(scenario, "node.yaml"), tmp_path / "proc", clock.monotonic, clock.wall_us)
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("2\n")
    health = Health()
    sampler = make_sampler(node, ratio, health=health, clock=clock.monotonic, reader=GpuReader(node, clock.monotonic))
    telemetry = Telemetry(
        sampler,
        health,
        1.0,
        "gpu-node-7",
        False,
        devices=DeviceHealth(sampler, health, clock.monotonic),
        xids=XidCounts(),
    )
    try:
        for _ in range(8):  # sweeps 2 s apart: past a GPM window and an engine window
            clock.t += 2.0
            sampler.snapshot(0.0)
        return telemetry.render(TEXT).decode()
    finally:
        telemetry.shutdown()
        node.close()


def promtool_test(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    exposition = parse(text)
    inputs, tests = [], []
    for name, series in exposition.values.items():
        for labels, value in series.items():
            selector = ",".join(f'{k}="{v}"' for k, v in sorted({**dict(labels), **TARGET}.items()))
            inputs.append({"series": f"{name}{{{selector}}}", "values": f"{value!r}x5"})

    def expected(field: str, family: str, factor: float) -> list[dict[str, Any]]:
        out = []
        for labels, value in exposition.values.get(family, {}).items():
            own = dict(labels)
            dcgm = {
                "gpu": own["gpu_id"],
                "UUID": own["gpu_uuid"],
                "device": f"nvidia{own['gpu_id']}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": "gpu-node-7",
                "k8s_node_name": "gpu-node-7",
                "gpu_model": "NVIDIA H100 80GB HBM3",
            }
            selector = ",".join(f'{k}="{v}"' for k, v in sorted({**own, **TARGET, **dcgm}.items()))
            out.append({"labels": f"{field}{{{selector}}}", "value": value / -factor if factor < 0 else value * factor})
        return out

    reserved = next(iter(exposition.series("vgpu_gpu_memory_reserved_bytes").values()), None)
    for field, (family, factor) in GPU_FIELDS.items():
        samples = expected(field, family, factor)
        if field == "DCGM_FI_DEV_FB_USED" and reserved is not None:
            # DCGM's is nvmlMemory_v2_t's used from driver R510 on: allocated, the reservation apart,
            # where the agent's (v1's) holds it.
            samples[0]["value"] -= reserved / MIB
        if field in POD_FIELDS:
            samples += expected(field, *POD_FIELDS[field])
        tests.append({"expr": field, "eval_time": "2m", "exp_samples": samples})
    # Free memory: the GPU's total less what is in use.
    (total,) = exposition.values["vgpu_gpu_memory_total_bytes"].values()
    free = expected("DCGM_FI_DEV_FB_FREE", "vgpu_gpu_memory_used_bytes", 1.0)
    free[0]["value"] = (total - free[0]["value"]) / MIB
    tests.append({"expr": "DCGM_FI_DEV_FB_FREE", "eval_time": "2m", "exp_samples": free})
    document = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": tests}],
    }
    path = tmp_path / "dcgm.test.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=300))
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by scripts/test.sh (Debian package prometheus)"
    return subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False)


def test_every_field_in_dcgm_exporters_unit_and_labels_from_what_the_agent_serves(tmp_path: Path) -> None:
    text = served(tmp_path)
    records = {rule["record"] for rule in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]}
    assert records == GPU_FIELDS.keys() | UNCHECKED | {"DCGM_FI_DEV_FB_FREE"}, "each field needs its expectation here"
    ran = promtool_test(tmp_path, text)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]


def test_the_check_fails_on_a_wrong_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same run, expecting MHz as Hz: promtool must say so.
    monkeypatch.setitem(GPU_FIELDS, "DCGM_FI_DEV_SM_CLOCK", ("vgpu_gpu_sm_clock_hertz", 1.0))
    ran = promtool_test(tmp_path, served(tmp_path))
    assert ran.returncode != 0 and "DCGM_FI_DEV_SM_CLOCK" in ran.stdout + ran.stderr


def test_without_v2_fb_used_is_the_agents_used_and_fb_reserved_has_no_series(tmp_path: Path) -> None:
    # A driver before R510: DCGM's FB_USED is v1's used, the agent's own, and FB_RESERVED has none.
    text = served(tmp_path, NODE + "driver: {memory_info_v2: false}\n")
    assert "vgpu_gpu_memory_reserved_bytes{" not in text
    ran = promtool_test(tmp_path, text)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
