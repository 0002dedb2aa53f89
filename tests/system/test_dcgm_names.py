"""dcgm-exporter's names from the agent's families (deploy/prometheus/dcgm-exporter-names.yaml),
run in promtool on the series the agent serves: each field in dcgm-exporter's unit, as its CSV
and DCGM's dcgm_fields.h state it (copies in tests/data/dcgm-exporter/, not the generator's
scales), with dcgm-exporter's labels."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.collect.device_health import DeviceHealth
from otel_vgpu.collect.reading import GpuReader
from otel_vgpu.collect.xids import XidCounts
from otel_vgpu.export.exposition import TEXT
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.agent import ROOT
from testkit.clock import Clock
from testkit.promtext import parse
from testkit.scripts import load as load_script

from ..conftest import make_sampler

RULES = ROOT / "deploy" / "prometheus" / "dcgm-exporter-names.yaml"
MIB = 1048576
DATA = ROOT / "tests" / "data" / "dcgm-exporter"
GENERATOR = load_script("gen-dcgm-rules.py")
# Checked apart: what two families make.
COMPOSED = {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}


@dataclass(frozen=True)
class Upstream:
    """A field as dcgm-exporter's CSV lists it."""

    kind: str
    """counter, gauge or label."""
    help: str
    """Which states its unit."""
    enabled: bool
    """Collected by default: a row of default-counters.csv not commented out."""


def upstream_rows() -> list[tuple[str, Upstream]]:
    """Every row of dcgm-exporter's default-counters.csv, enabled or commented out, in order,
    then those of tests/data/dcgm-exporter/outside-default-counters.csv."""
    out = []
    for name in ("default-counters.csv", "outside-default-counters.csv"):
        for line in (DATA / name).read_text().splitlines():
            row = re.match(r"^(#\s*)?(DCGM_\w+)\s*,\s*(\w+)\s*,\s*(.*)$", line.strip())
            if row:
                enabled = row.group(1) is None and name == "default-counters.csv"
                out.append((row.group(2), Upstream(row.group(3), row.group(4), enabled)))
    return out


# A field the CSV lists twice (PCIe's, commented out under "PCIE", enabled under DCP) is its
# enabled row.
UPSTREAM = dict(sorted(upstream_rows(), key=lambda row: row[1].enabled))
# A unit as upstream's help messages state it: the agent's unit of that dimension (UCUM's, as
# the families': Hz, Cel, W, J, s, By, 1), and what one of the agent's is in it; negative where
# the rule divides (a binary unit), so that the expectation is computed as the rule computes it,
# to the bit.
UNITS: dict[str, tuple[str, float]] = {
    "MHz": ("Hz", 1e-6),
    "C": ("Cel", 1.0),
    "W": ("W", 1.0),
    "mJ": ("J", 1000.0),
    "ns": ("s", 1e9),
    "MiB": ("By", -MIB),
    "%": ("1", 100.0),
    "bytes per second": ("By/s", 1.0),
}
# A family's unit, by its name's suffix (the OpenMetrics convention the agent names by).
SUFFIXES = (
    ("_hertz", "Hz"),
    ("_celsius", "Cel"),
    ("_watts", "W"),
    ("_joules_total", "J"),
    ("_seconds_total", "s"),
    ("_bytes_per_second", "By/s"),
    ("_bytes", "By"),
    ("_ratio", "1"),
)


def field_unit(field: str) -> tuple[str, float]:
    """`field`'s unit as upstream states it: "(in MHz)", "in bytes per second", a ratio, or none
    (a count, a code, a flag, a bitmask: "")."""
    if field not in UPSTREAM:
        raise ValueError(f"{field}: no such field in tests/data/dcgm-exporter/")
    help_text = UPSTREAM[field].help
    stated = re.search(r"\(in ([^)]+)\)|in (bytes per second)", help_text)
    if stated:
        unit = stated.group(1) or stated.group(2)
        if unit not in UNITS:
            raise ValueError(f"{field}: its unit {unit!r} is not in UNITS")
        return UNITS[unit]
    return ("1", 1.0) if re.match(r"(The )?[Rr]atio of", help_text) else ("", 1.0)


def family_unit(family: str) -> str:
    return next((unit for suffix, unit in SUFFIXES if family.endswith(suffix)), "")


def factor(field: str, family: str) -> float:
    """What one unit of `family` is in `field`'s unit (negative: divided by)."""
    dimension, one = field_unit(field)
    if dimension != family_unit(family):
        raise ValueError(
            f"{field} is in {dimension or 'no unit'} upstream, {family} in {family_unit(family) or 'none'}"
        )
    return one


Expected = dict[str, tuple[str, float]]


def expectations() -> tuple[Expected, Expected, list[str]]:
    """Each field the sets record, in dcgm-exporter 4.8's names: the family it comes from per GPU
    and per pod, as the declarations pair them, and what one unit of that family is in the
    field's unit as upstream states it (never the declarations' scale); and what could not be
    expected, said by a test rather than at import."""
    gpu, pod, problems = {}, {}, []
    for mapping in GENERATOR.mappings():
        if mapping.field in COMPOSED or GENERATOR.added_later(mapping.field, GENERATOR.GENERATIONS[0]):
            continue
        # DCGM_FI_DEV_FB_USED is the used less the reserved, checked as such below.
        family = re.findall(r"vgpu_\w+", mapping.gpu)[0]
        if mapping.gpu != family and mapping.field != "DCGM_FI_DEV_FB_USED":
            problems.append(f"{mapping.field} is made of several families: check it apart (COMPOSED)")
            continue
        try:
            gpu[mapping.field] = (family, factor(mapping.field, family))
            if mapping.pod:
                pod[mapping.field] = (mapping.pod, factor(mapping.field, mapping.pod))
        except ValueError as error:
            problems.append(str(error))
    return gpu, pod, problems


GPU_FIELDS, POD_FIELDS, UNEXPECTED = expectations()
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
# A Hopper GPU with GPM and NVLink, and an Ampere one without GPM, with an encoder: each pod on its own.
TWO_GPUS = """
node: gpu-node-7
gpus:
  - {model: NVIDIA H100 80GB HBM3, memory: 80GiB, lacks: [encoder], nvlink: true}
  - {model: NVIDIA A100-SXM4-40GB, memory: 40GiB}
pods:
  - namespace: ml
    name: trainer
    shares: {0: 1}
    processes: [{gpu: 0, memory: 8GiB, sm: 0.75, tensor: 0.5, dram: 0.25, decoder: 0.25}]
  - namespace: media
    name: transcoder
    shares: {1: 1}
    processes: [{gpu: 1, memory: 2GiB, sm: 0.25, encoder: 0.5, decoder: 0.5}]
health_events:
  - {gpu: 0, at_s: 1, ecc: corrected, count: 3}
  - {gpu: 0, from_s: 0, to_s: 4, throttle: [power_cap]}
"""
# dcgm-exporter 4.9's name of each 4.8 field the rules give, and what one unit of the agent's
# family is in 4.9's unit where that changed (Hz, J, 0-1, bytes, as 4.9.0's release notes say;
# the names as docs/coming-from.md cites them); None: 4.8's unit.
RENAMED_49: dict[str, tuple[str, float | None]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", None),
    "DCGM_FI_DEV_MEMORY_TEMP": ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", None),
    "DCGM_FI_DEV_POWER_USAGE": ("DCGM_FI_DEV_BOARD_POWER_WATTS", None),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS", None),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", None),
    "DCGM_FI_DEV_XID_ERRORS": ("DCGM_FI_DEV_XID_ERROR", None),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", None),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", None),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("DCGM_FI_DEV_ROW_REMAP_FAILED", None),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", None),
    "DCGM_FI_PROF_SM_ACTIVE": ("DCGM_FI_PROF_SM_UTIL_RATIO", None),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", None),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", None),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("DCGM_FI_PROF_DRAM_UTIL_RATIO", None),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("DCGM_FI_PROF_FP64_UTIL_RATIO", None),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("DCGM_FI_PROF_FP32_UTIL_RATIO", None),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("DCGM_FI_PROF_FP16_UTIL_RATIO", None),
    "DCGM_FI_DEV_GPU_UTIL": ("DCGM_FI_DEV_GPU_UTIL_RATIO", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("DCGM_FI_DEV_MEMORY_UTIL_RATIO", 1.0),
    "DCGM_FI_DEV_ENC_UTIL": ("DCGM_FI_DEV_ENC_UTIL_RATIO", 1.0),
    "DCGM_FI_DEV_DEC_UTIL": ("DCGM_FI_DEV_DEC_UTIL_RATIO", 1.0),
    "DCGM_FI_DEV_FB_USED": ("DCGM_FI_DEV_FB_USED_BYTES", 1.0),
    "DCGM_FI_DEV_FB_RESERVED": ("DCGM_FI_DEV_FB_RESERVED_BYTES", 1.0),
    "DCGM_FI_DEV_FB_FREE": ("DCGM_FI_DEV_FB_FREE_BYTES", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1.0),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND", 1.0),
}
# 4.10's on top: the same unit, bytes per second (4.10.0's release notes).
RENAMED_410 = {
    f"DCGM_FI_PROF_{bus}_{way}_BYTES": (f"DCGM_FI_PROF_{bus}_{way}_BYTES_PER_SECOND", None)
    for bus in ("PCIE", "NVLINK")
    for way in ("TX", "RX")
}
SETS = ROOT / "deploy" / "prometheus" / "dcgm-exporter"
# The driver label: DCGM_FI_DRIVER_VERSION up to 4.8 (render_metrics.go), 4.9.0's rename after.
OLD_DRIVER, NEW_DRIVER = "DCGM_FI_DRIVER_VERSION", "DCGM_FI_SYSTEM_DRIVER_VERSION"
# What the simulated node's NVML gives (its driver's default; bus 0x18 apart per GPU).
DRIVER_VERSION = "580.159.04"


def info(generation: Generation, gpu_id: str) -> dict[str, str]:
    """The labels vgpu_gpu_info puts on a GPU's series, the agent's and the generation's."""
    return {
        "driver_version": DRIVER_VERSION,
        generation.driver: DRIVER_VERSION,
        "pci_bus_id": f"00000000:{0x18 * (int(gpu_id) + 1):02X}:00.0",
    }


@dataclass(frozen=True)
class Generation:
    rules: Path
    hostname: str
    driver: str
    """The label dcgm-exporter writes the driver's version in."""
    renamed: dict[str, tuple[str, float | None]]
    capacity: bool
    """DCGM_FI_DEV_FB_CAPACITY_BYTES is a default counter."""
    nvlink_mb: float = 1024 * 1000
    """DCGM's NVLink "MB/s" in bytes/s (DcgmCacheManager.cpp@v4.6.0 ReadAndCacheNvLinkBandwidth)."""

    def name(self, field: str) -> str:
        return self.renamed.get(field, (field, None))[0]

    def unit(self, field: str, factor: float) -> float:
        """One unit of the agent's family in the generation's unit of `field` (4.8's: `factor`)."""
        own = self.renamed.get(field, (field, None))[1]
        return factor if own is None else own


GENERATIONS = {
    # The first set keeps MiB/s, as it has always written NVLink.
    "4.8.2": Generation(RULES, "Hostname", OLD_DRIVER, {}, False, MIB),
    "4.8.3": Generation(SETS / "4.8.3.yaml", "hostname", OLD_DRIVER, {}, False),
    "4.9": Generation(SETS / "4.9.yaml", "hostname", NEW_DRIVER, RENAMED_49, True),
    "4.10": Generation(SETS / "4.10.yaml", "hostname", NEW_DRIVER, {**RENAMED_49, **RENAMED_410}, True),
}


def test_every_field_the_sets_record_is_one_dcgm_exporter_lists() -> None:
    # In its CSV (enabled or commented out) or, for the few it lacks, DCGM's header; the field
    # a later generation added is checked with that generation (DCGM_FI_DEV_FB_CAPACITY_BYTES).
    recorded = {m.field for m in GENERATOR.mappings() if not GENERATOR.added_later(m.field, GENERATOR.GENERATIONS[0])}
    assert UNEXPECTED == []
    assert recorded - UPSTREAM.keys() == set()
    assert recorded - COMPOSED == GPU_FIELDS.keys()


def test_the_default_counters_are_dcgm_exporters_in_its_units() -> None:
    # scripts/dcgm_generations.py's list, against the CSV it names: its enabled rows, in order.
    generations = load_script("dcgm_generations.py")
    enabled = [field for field, row in upstream_rows() if row.enabled and row.kind != "label"]
    assert list(generations.DEFAULT_COUNTERS) == enabled
    for field in enabled:
        stated = re.search(r"\(in ([^)]+)\)", UPSTREAM[field].help)
        if stated:
            assert generations.DEFAULT_UNITS[field].lstrip("°").startswith(stated.group(1)), field


def test_a_fields_unit_is_upstreams_words() -> None:
    assert field_unit("DCGM_FI_DEV_SM_CLOCK") == ("Hz", 1e-6)  # "SM clock frequency (in MHz)."
    assert field_unit("DCGM_FI_DEV_FB_USED") == ("By", -MIB)  # "(in MiB)": divided by
    assert field_unit("DCGM_FI_PROF_DRAM_ACTIVE") == ("1", 1.0)  # "Ratio of cycles ..."
    assert field_unit("DCGM_FI_PROF_PCIE_TX_BYTES") == ("By/s", 1.0)  # "... in bytes per second."
    assert field_unit("DCGM_FI_DEV_XID_ERRORS") == ("", 1.0)  # "Value of the last XID error encountered."
    assert factor("DCGM_FI_DEV_GPU_UTIL", "vgpu_gpu_sm_utilization_ratio") == 100.0
    with pytest.raises(ValueError, match="DCGM_FI_DEV_SM_CLOCK is in Hz upstream, vgpu_gpu_power_watts in W"):
        factor("DCGM_FI_DEV_SM_CLOCK", "vgpu_gpu_power_watts")
    with pytest.raises(ValueError, match="in no unit upstream"):
        factor("DCGM_FI_DEV_XID_ERRORS", "vgpu_gpu_temperature_celsius")
    # A name no DCGM has, not a real field the agent lacks today: answering that one must not change this test.
    with pytest.raises(ValueError, match="DCGM_FI_DEV_NOT_A_FIELD: no such field"):
        factor("DCGM_FI_DEV_NOT_A_FIELD", "vgpu_gpu_temperature_celsius")


def test_the_fields_said_to_have_no_family_are_dcgm_exporters_and_in_no_set() -> None:
    text = (ROOT / "docs" / "coming-from.md").read_text()
    paragraph = text[text.index("The other fields its files list have no family yet") :].split("\n\n")[0]
    named = set(re.findall(r"DCGM_FI_\w+", paragraph))
    assert named and named <= UPSTREAM.keys()
    assert not named & {m.field for m in GENERATOR.mappings()}, "a field a set now records: say so in the doc"


def test_every_file_is_what_the_declarations_make() -> None:
    # Each generation's set, the chart's copy and the kustomize component, and today's file as it shipped.
    generator = load_script("gen-dcgm-rules.py")
    made = generator.outputs()
    assert {path for path in made if path.parent == SETS} | {RULES} == {g.rules for g in GENERATIONS.values()}
    for path, text in made.items():
        assert path.read_text() == text, f"{path}: regenerate it: .venv/bin/python scripts/gen-dcgm-rules.py"
    assert RULES.read_text() == generator.rules()


def served(tmp_path: Path, scenario: str = NODE) -> str:
    """What the agent serves on the node above, its GPM window closed, the throttle over."""
    clock = Clock(0.0)
    node = SimulatedNode(parse_scenario(scenario, "node.yaml"), tmp_path / "proc", clock.monotonic, clock.wall_us)
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("2\n")
    health = AgentHealth()
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


def promtool_test(
    tmp_path: Path, text: str, generation: Generation = GENERATIONS["4.8.2"]
) -> subprocess.CompletedProcess[str]:
    exposition = parse(text)
    inputs, tests = [], []
    for name, series in exposition.values.items():
        for labels, value in series.items():
            selector = ",".join(f'{k}="{v}"' for k, v in sorted({**dict(labels), **TARGET}.items()))
            inputs.append({"series": f"{name}{{{selector}}}", "values": f"{value!r}x5"})
    models = {
        dict(labels)["gpu_uuid"]: dict(labels)["gpu_model"]
        for labels in exposition.values["vgpu_gpu_memory_total_bytes"]
    }

    def value_of(family: str, labels: dict[str, str]) -> float:
        wanted = {k: v for k, v in labels.items() if k in ("gpu_uuid", "gpu_id")}
        return next(v for key, v in exposition.values.get(family, {}).items() if wanted.items() <= dict(key).items())

    def expected(field: str, family: str, factor: float) -> list[dict[str, Any]]:
        out = []
        for labels, value in exposition.values.get(family, {}).items():
            own = dict(labels)
            dcgm = {
                "gpu": own["gpu_id"],
                "UUID": own["gpu_uuid"],
                "device": f"nvidia{own['gpu_id']}",
                "modelName": models[own["gpu_uuid"]],
                generation.hostname: "gpu-node-7",
                "k8s_node_name": "gpu-node-7",
                "gpu_model": models[own["gpu_uuid"]],
                **info(generation, own["gpu_id"]),
            }
            selector = ",".join(f'{k}="{v}"' for k, v in sorted({**own, **TARGET, **dcgm}.items()))
            scaled = value / -factor if factor < 0 else value * factor
            out.append({"labels": f"{generation.name(field)}{{{selector}}}", "value": scaled, "own": own})
        return out

    def test(field: str, samples: list[dict[str, Any]]) -> None:
        for sample in samples:
            del sample["own"]
        tests.append({"expr": generation.name(field), "eval_time": "2m", "exp_samples": samples})

    for field, (family, factor) in GPU_FIELDS.items():
        unit = generation.unit(field, factor)
        samples = expected(field, family, unit)
        if field == "DCGM_FI_DEV_FB_USED":
            # DCGM's is nvmlMemory_v2_t's used from driver R510 on: allocated, the reservation apart,
            # where the agent's (v1's) holds it.
            for sample in samples:
                if "vgpu_gpu_memory_reserved_bytes" in exposition.values:
                    reserved = value_of("vgpu_gpu_memory_reserved_bytes", sample["own"])
                    sample["value"] -= reserved / -unit if unit < 0 else reserved * unit
        if field in POD_FIELDS:
            pod_family, pod_factor = POD_FIELDS[field]
            samples += expected(field, pod_family, generation.unit(field, pod_factor))
        test(field, samples)
    # Free memory: the GPU's total less what is in use.
    unit = generation.unit("DCGM_FI_DEV_FB_FREE", -MIB)
    free = expected("DCGM_FI_DEV_FB_FREE", "vgpu_gpu_memory_used_bytes", 1.0)
    for sample in free:
        left = value_of("vgpu_gpu_memory_total_bytes", sample["own"]) - sample["value"]
        sample["value"] = left / -unit if unit < 0 else left * unit
    test("DCGM_FI_DEV_FB_FREE", free)
    # NVLink, both ways, in DCGM's "MB/s" (bytes/s / 1,024,000; the first set keeps MiB/s) or bytes/s.
    unit = generation.unit("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", -generation.nvlink_mb)
    nvlink = expected("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "vgpu_gpu_nvlink_transmit_bytes_per_second", 1.0)
    for sample in nvlink:
        both = sample["value"] + value_of("vgpu_gpu_nvlink_receive_bytes_per_second", sample["own"])
        sample["value"] = both / -unit if unit < 0 else both * unit
    test("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", nvlink)
    if generation.capacity:
        test(
            "DCGM_FI_DEV_FB_CAPACITY_BYTES",
            expected("DCGM_FI_DEV_FB_CAPACITY_BYTES", "vgpu_gpu_memory_total_bytes", 1.0),
        )
    document = {
        "rule_files": [str(generation.rules)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": tests}],
    }
    path = tmp_path / "dcgm.test.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=300))
    return promtool(path)


def promtool(path: Path) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    assert found, "promtool is installed by scripts/test.sh (Debian package prometheus)"
    return subprocess.run([found, "test", "rules", str(path)], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("version", GENERATIONS)
@pytest.mark.parametrize("scenario", ["one GPU", "Hopper and Ampere"])
def test_every_field_in_dcgm_exporters_unit_and_labels_from_what_the_agent_serves(
    tmp_path: Path, version: str, scenario: str
) -> None:
    generation = GENERATIONS[version]
    text = served(tmp_path, NODE if scenario == "one GPU" else TWO_GPUS)
    records = {rule["record"] for rule in yaml.safe_load(generation.rules.read_text())["groups"][0]["rules"]}
    fields = GPU_FIELDS.keys() | COMPOSED | ({"DCGM_FI_DEV_FB_CAPACITY_BYTES"} if generation.capacity else set())
    assert records == {generation.name(field) for field in fields}, "each field needs its expectation here"
    ran = promtool_test(tmp_path, text, generation)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]


def test_the_hopper_and_ampere_node_has_what_the_check_needs(tmp_path: Path) -> None:
    # GPM on the Hopper alone, NVLink, an encoder and a pod on each GPU: no check passes on absent series.
    exposition = parse(served(tmp_path, TWO_GPUS))
    models = {dict(labels)["gpu_model"] for labels in exposition.series("vgpu_gpu_tensor_active_ratio")}
    assert models == {"NVIDIA H100 80GB HBM3"}
    for family in (
        "vgpu_gpu_nvlink_transmit_bytes_per_second",
        "vgpu_gpu_encoder_utilization_ratio",
        "vgpu_pod_encoder_utilization_ratio",
    ):
        assert exposition.series(family), family
    assert len(exposition.series("vgpu_pod_memory_used_bytes")) == 2
    assert len(exposition.series("vgpu_gpu_sm_clock_hertz")) == 2


def test_the_check_fails_on_a_wrong_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same run, expecting MHz as Hz: promtool must say so.
    monkeypatch.setitem(GPU_FIELDS, "DCGM_FI_DEV_SM_CLOCK", ("vgpu_gpu_sm_clock_hertz", 1.0))
    ran = promtool_test(tmp_path, served(tmp_path))
    assert ran.returncode != 0 and "DCGM_FI_DEV_SM_CLOCK" in ran.stdout + ran.stderr


@pytest.mark.parametrize(
    ("version", "field", "wrong"),
    [
        ("4.9", "DCGM_FI_DEV_GPU_UTIL", 100.0),  # percent where 4.9 writes a ratio
        ("4.9", "DCGM_FI_DEV_FB_USED", -MIB),  # MiB where 4.9 writes bytes
        ("4.10", "DCGM_FI_DEV_SM_CLOCK", 1e-6),  # MHz where 4.10 writes Hz
    ],
)
def test_the_check_fails_on_a_set_in_the_older_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, field: str, wrong: float
) -> None:
    generation = GENERATIONS[version]
    monkeypatch.setitem(generation.renamed, field, (generation.name(field), wrong))
    ran = promtool_test(tmp_path, served(tmp_path, TWO_GPUS), generation)
    assert ran.returncode != 0 and generation.name(field) in ran.stdout + ran.stderr


def test_the_check_fails_on_the_other_generations_host_label(tmp_path: Path) -> None:
    # 4.8.3's set checked as writing 4.8.2's Hostname: every record differs.
    wrong = Generation(GENERATIONS["4.8.3"].rules, "Hostname", OLD_DRIVER, {}, False)
    ran = promtool_test(tmp_path, served(tmp_path), wrong)
    assert ran.returncode != 0 and 'Hostname="gpu-node-7"' in ran.stdout + ran.stderr


@pytest.mark.parametrize(("version", "driver"), [("4.8.3", NEW_DRIVER), ("4.9", OLD_DRIVER)])
def test_the_check_fails_on_the_other_generations_driver_label(tmp_path: Path, version: str, driver: str) -> None:
    generation = GENERATIONS[version]
    wrong = Generation(generation.rules, generation.hostname, driver, generation.renamed, generation.capacity)
    ran = promtool_test(tmp_path, served(tmp_path), wrong)
    assert ran.returncode != 0 and f'{driver}="{DRIVER_VERSION}"' in ran.stdout + ran.stderr


def test_without_v2_fb_used_is_the_agents_used_and_fb_reserved_has_no_series(tmp_path: Path) -> None:
    # A driver before R510: DCGM's FB_USED is v1's used, the agent's own, and FB_RESERVED has none.
    text = served(tmp_path, NODE + "driver: {memory_info_v2: false}\n")
    assert "vgpu_gpu_memory_reserved_bytes{" not in text
    ran = promtool_test(tmp_path, text)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]


# The alerts most written on dcgm-exporter, each on a generation's names: temperature, double-bit
# ECC, row remapping's (an uncorrectable remap, a failed one), and any XID on the last-code gauge.
ALERTS: dict[str, tuple[str, str, int]] = {
    # alert: (4.8 field, the expression on it, the GPU it fires for on the node below)
    "GPUHighTemperature": ("DCGM_FI_DEV_GPU_TEMP", "{} > 85", 0),
    "GPUDoubleBitEccError": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "increase({}[5m]) > 0", 1),
    "GPURowRemapUncorrectable": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "{} > 0", 1),
    "GPURowRemapFailed": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "{} == 1", 1),
    "GPUXidError": ("DCGM_FI_DEV_XID_ERRORS", "{} > 0", 1),
}
# What the agent's families read while it happens (the rest stays as served).
EVENTS = {
    ("vgpu_gpu_temperature_celsius", "0"): "90x6",
    ("vgpu_gpu_ecc_uncorrected_total", "1"): "0 0 2x4",
    ("vgpu_gpu_remapped_rows_uncorrectable_total", "1"): "0 0 1x4",
    ("vgpu_gpu_remapped_rows_failure", "1"): "0 0 1x4",
    ("vgpu_gpu_xid_last", "1"): "0 0 79x4",
}


def alert_test(tmp_path: Path, generation: Generation) -> subprocess.CompletedProcess[str]:
    exposition = parse(served(tmp_path, TWO_GPUS))
    models = {dict(key)["gpu_uuid"]: dict(key)["gpu_model"] for key in exposition.values["vgpu_gpu_memory_total_bytes"]}
    inputs, own_labels = [], {}
    for name, series in exposition.values.items():
        for key, value in series.items():
            labels = {**dict(key), **TARGET}
            selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            values = EVENTS.get((name, labels.get("gpu_id", "")), f"{value!r}x6")
            inputs.append({"series": f"{name}{{{selector}}}", "values": values})
            own_labels[(name, labels.get("gpu_id", ""))] = labels
    family = {"DCGM_FI_DEV_GPU_TEMP": "vgpu_gpu_temperature_celsius", **{k: v[0] for k, v in GPU_FIELDS.items()}}
    rules, expected = [], []
    for alert, (field, expression, gpu) in ALERTS.items():
        rules.append(
            {"alert": alert, "expr": expression.format(generation.name(field)), "labels": {"severity": "critical"}}
        )
        own = own_labels[(family[field], str(gpu))]
        model = models[own["gpu_uuid"]]
        labels = {
            **own,
            "gpu": own["gpu_id"],
            "UUID": own["gpu_uuid"],
            "device": f"nvidia{own['gpu_id']}",
            "modelName": model,
            "gpu_model": model,
            generation.hostname: "gpu-node-7",
            "k8s_node_name": "gpu-node-7",
            **info(generation, own["gpu_id"]),
            "severity": "critical",
        }
        expected.append({"eval_time": "4m", "alertname": alert, "exp_alerts": [{"exp_labels": labels}]})
    alerts = tmp_path / "alerts.yaml"
    alerts.write_text(yaml.safe_dump({"groups": [{"name": "dcgm-exporter-alerts", "rules": rules}]}))
    document = {
        "rule_files": [str(generation.rules), str(alerts)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": expected}],
    }
    path = tmp_path / "alerts.test.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=300))
    return promtool(path)


@pytest.mark.parametrize("version", GENERATIONS)
def test_the_alerts_written_on_dcgm_exporter_fire_on_the_gpu_that_has_the_fault(tmp_path: Path, version: str) -> None:
    ran = alert_test(tmp_path, GENERATIONS[version])
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]


def test_an_alert_on_another_generations_names_does_not_fire(tmp_path: Path) -> None:
    # 4.8's row-remap name against 4.9's set: no series, so promtool finds the alert missing.
    wrong = Generation(GENERATIONS["4.9"].rules, "hostname", NEW_DRIVER, {}, True)
    ran = alert_test(tmp_path, wrong)
    assert ran.returncode != 0 and "GPURowRemapUncorrectable" in ran.stdout + ran.stderr


def test_the_coming_from_tables_are_the_declarations() -> None:
    # Every generation's default counters, the family that answers each or why none does, and the source.
    blocks = load_script("doc_blocks.py")
    generator = load_script("gen-dcgm-rules.py")
    for doc in blocks.BLOCKS["dcgm-exporter generations"]:
        held = blocks.block(doc.read_text(), "dcgm-exporter generations", str(doc))
        assert held == generator.generations_markdown(), (
            f"{doc}: regenerate: .venv/bin/python scripts/gen-dcgm-rules.py"
        )
    for version, generation in GENERATIONS.items():
        assert f"| `{generation.name('DCGM_FI_DEV_GPU_UTIL')}` |" in held, version
    # and the fields recorded beside the default counters
    for doc in blocks.BLOCKS["dcgm-exporter optional fields"]:
        held = blocks.block(doc.read_text(), "dcgm-exporter optional fields", str(doc))
        assert held == generator.optional_markdown(), f"{doc}: regenerate: .venv/bin/python scripts/gen-dcgm-rules.py"
    assert "| `DCGM_FI_DEV_POWER_VIOLATION` | the same | `vgpu_gpu_power_violation_seconds_total` | " in held


def test_the_tables_check_sees_a_changed_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = load_script("gen-dcgm-rules.py")
    before = generator.generations_markdown()
    monkeypatch.setitem(generator.NONE, "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "none: changed")
    assert generator.generations_markdown() != before
