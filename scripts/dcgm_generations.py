"""dcgm-exporter's generations, as upstream facts: which names, units and labels each writes for
its default counters. scripts/gen-dcgm-rules.py makes one rules set per generation from these
and the families' `dcgm=` declarations (otel_vgpu/gpu/device_figures.py), which say which family
answers which field in the names and units of dcgm-exporter up to 4.8.x; docs/coming-from.md's
tables are made from the same. Every fact carries where it was read and how sure it is:

- confirmed: read in NVIDIA's source at a tag, or in its release notes;
- derived: worked out from confirmed facts (the note says how);
- secondary: read only outside NVIDIA's repositories and release notes (the note names it).
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
# DCGM's NVLink throughput (field 449, dcgm-exporter's DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL) is
# NVML's KiB counters over time divided by 1000 more ("KiB/sec -> MiB/sec"): bytes/s / 1,024,000.
NVLINK_MB = 1024 * 1000
NOTES_49 = "https://newreleases.io/project/github/NVIDIA/dcgm-exporter/release/4.9.0"
NOTES_410 = "https://github.com/NVIDIA/dcgm-exporter/releases/tag/4.10.0"
HEADER_461 = "go-dcgm@b7fa315 pkg/dcgm/dcgm_fields.h (DCGM 4.6.1)"
BLOCK_460 = 'DCGM dcgmlib/dcgm_fields.h@v4.6.0, "Deprecated: renamed per DCGM Field Naming Standard"'


# NamedTuples, not dataclasses: the tests load this file as a module of no package.
class Rename(NamedTuple):
    """A field a generation names anew: its value is the old field's times `factor`."""

    old: str
    new: str
    factor: Fraction
    source: str
    confidence: str


class Generation(NamedTuple):
    """dcgm-exporter from version `first` on, up to the next generation's."""

    first: str
    last: str
    """The newest release of it read, or "" where it is the newest generation."""
    path: Path
    """Its rules set."""
    hostname: str
    """The label naming the node."""
    driver_label: str
    renames: tuple[Rename, ...] = ()
    """On top of the previous generation's."""
    added: tuple[str, ...] = ()
    """Default counters it collects that the previous did not (in its own names)."""
    source: str = ""


def _rename(old: str, new: str, source: str, confidence: str, factor: Fraction = Fraction(1)) -> Rename:
    return Rename(old, new, factor, source, confidence)


# The default counters of dcgm-exporter 4.7.1 to 4.8.2, in the order of its CSV: the same active
# rows at tags 4.4.2-4.7.1, 4.5.1-4.8.0, 4.5.2-4.8.1, 4.5.3-4.8.2 and main d5e5f51
# (etc/default-counters.csv; its etc/dcp-metrics-included.csv enables the same). The label row
# DCGM_FI_DRIVER_VERSION is a generation's driver_label, not a counter.
DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)
# Their units, as the CSV's help strings give them.
DEFAULT_UNITS = {
    "DCGM_FI_DEV_SM_CLOCK": "MHz",
    "DCGM_FI_DEV_MEM_CLOCK": "MHz",
    "DCGM_FI_DEV_MEMORY_TEMP": "°C",
    "DCGM_FI_DEV_GPU_TEMP": "°C",
    "DCGM_FI_DEV_POWER_USAGE": "W",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "mJ",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "count",
    "DCGM_FI_DEV_GPU_UTIL": "%",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "%",
    "DCGM_FI_DEV_ENC_UTIL": "%",
    "DCGM_FI_DEV_DEC_UTIL": "%",
    "DCGM_FI_DEV_XID_ERRORS": "the last XID",
    "DCGM_FI_DEV_FB_FREE": "MiB",
    "DCGM_FI_DEV_FB_USED": "MiB",
    "DCGM_FI_DEV_FB_RESERVED": "MiB",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "MB/s (B/s ÷ 1,024,000)",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "0/1",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "count",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "count",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "0/1",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "0-1",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0-1",
    "DCGM_FI_PROF_DRAM_ACTIVE": "0-1",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "B/s",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "B/s",
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": "B",
}
# The unit a rename's factor takes a field to.
UNIT_OF_FACTOR = {Fraction(10**6): "Hz", Fraction(1, 1000): "J", Fraction(1, 100): "0-1", Fraction(MIB): "B"}
UNIT_OF_FACTOR[Fraction(NVLINK_MB)] = "B/s"
DEFAULT_COUNTERS_SOURCE = "NVIDIA/dcgm-exporter etc/default-counters.csv@4.5.3-4.8.2"

# 4.9.0: "Rename the 23 default and profiling-preset fields that DCGM 4.7 deprecates to their new
# DCGM 4.7 names. Eleven of them also change unit: clocks from MHz to hertz, energy from
# millijoules to joules, utilization from a percentage to a 0 to 1 ratio, GPU memory from MiB to
# bytes, and NVLink throughput from MB/s to bytes per second" (NOTES_49). The eleven are the two
# clocks, energy, four utilizations, three framebuffer fields and NVLink: the count checks the
# mapping. 22 of the 23 are below; the 23rd is not known.
_SECONDARY = "a DCGM 4.7 field guide, not NVIDIA's; 4.9.0's notes confirm the unit change"
RENAMES_49 = (
    _rename(
        "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK_HERTZ", f"{HEADER_461} field 1603", "confirmed", Fraction(10**6)
    ),
    _rename(
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ",
        f"{HEADER_461} field 1604",
        "confirmed",
        Fraction(10**6),
    ),
    _rename("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", BLOCK_460, "confirmed"),
    _rename("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", BLOCK_460, "confirmed"),
    _rename("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS", BLOCK_460, "confirmed"),
    _rename(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
        f"{HEADER_461} field 1611",
        "confirmed",
        Fraction(1, 1000),
    ),
    _rename("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", BLOCK_460, "confirmed"),
    # The name is DCGM 4.6's alias of field 203 (percent); 4.7's own field 1613, a 0-1 ratio,
    # is known from the guide only, and 4.9.0's notes say utilization became a ratio.
    _rename(
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_UTIL_RATIO",
        f"name: {BLOCK_460}; unit: {NOTES_49}",
        "confirmed",
        Fraction(1, 100),
    ),
    _rename("DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_MEMORY_UTIL_RATIO", _SECONDARY, "secondary", Fraction(1, 100)),
    _rename("DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_ENC_UTIL_RATIO", _SECONDARY, "secondary", Fraction(1, 100)),
    _rename("DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_DEC_UTIL_RATIO", _SECONDARY, "secondary", Fraction(1, 100)),
    _rename("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR", BLOCK_460, "confirmed"),
    _rename("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_FREE_BYTES", _SECONDARY, "secondary", Fraction(MIB)),
    _rename("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES", _SECONDARY, "secondary", Fraction(MIB)),
    _rename("DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_RESERVED_BYTES", _SECONDARY, "secondary", Fraction(MIB)),
    _rename(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
        _SECONDARY,
        "secondary",
        Fraction(NVLINK_MB),
    ),
    _rename(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", BLOCK_460, "confirmed"
    ),
    _rename("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", BLOCK_460, "confirmed"),
    _rename("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED", BLOCK_460, "confirmed"),
    _rename("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", BLOCK_460, "confirmed"),
    _rename("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO", BLOCK_460, "confirmed"),
    _rename("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO", BLOCK_460, "confirmed"),
    # Fields outside the default file that the rules give: renamed as DCGM's naming block names
    # them, on the word "default and profiling-preset fields" (NOTES_49). Whether 4.9's shipped
    # files carry these rows under the new names is not known.
    _rename("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO", BLOCK_460, "derived"),
    _rename("DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO", BLOCK_460, "derived"),
    _rename("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_FP64_UTIL_RATIO", BLOCK_460, "derived"),
    _rename("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_FP32_UTIL_RATIO", BLOCK_460, "derived"),
    _rename("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_FP16_UTIL_RATIO", BLOCK_460, "derived"),
    _rename("DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS", BLOCK_460, "derived"),
)
# 4.10.0: "Rename four profiling fields in the shipped collectors. PCIe TX and RX are collected by
# default. NVLink TX and RX are optional. All four still use bytes per second" (NOTES_410).
RENAMES_410 = tuple(
    _rename(f"DCGM_FI_PROF_{bus}_{way}_BYTES", f"DCGM_FI_PROF_{bus}_{way}_BYTES_PER_SECOND", NOTES_410, "confirmed")
    for bus in ("PCIE", "NVLINK")
    for way in ("TX", "RX")
)

PROMETHEUS = ROOT / "deploy" / "prometheus"
GENERATIONS = (
    # The set people have loaded since it shipped: its name and content stay.
    Generation(
        "4.7.1",
        "4.8.2",
        PROMETHEUS / "dcgm-exporter-names.yaml",
        "Hostname",
        "DCGM_FI_DRIVER_VERSION",
        source=f"{DEFAULT_COUNTERS_SOURCE}; internal/pkg/rendermetrics/render_metrics.go@4.5.3-4.8.2",
    ),
    Generation(
        "4.8.3",
        "4.8.x",
        PROMETHEUS / "dcgm-exporter" / "4.8.3.yaml",
        "hostname",
        "DCGM_FI_DRIVER_VERSION",
        source="NVIDIA/dcgm-exporter#655 (d5e5f51), released in 4.6.0-4.8.3; "
        "https://docs.nvidia.com/datacenter/dcgm/latest/release-notes/dcgm-exporter.html",
    ),
    Generation(
        "4.9.0",
        "4.9.x",
        PROMETHEUS / "dcgm-exporter" / "4.9.yaml",
        "hostname",
        "DCGM_FI_SYSTEM_DRIVER_VERSION",
        RENAMES_49,
        ("DCGM_FI_DEV_FB_CAPACITY_BYTES",),
        source=NOTES_49,
    ),
    Generation(
        "4.10.0",
        "",
        PROMETHEUS / "dcgm-exporter" / "4.10.yaml",
        "hostname",
        "DCGM_FI_SYSTEM_DRIVER_VERSION",
        RENAMES_410,
        source=NOTES_410,
    ),
)
VERSION = re.compile(r"^(?P<major>0|[1-9][0-9]*)\.(?P<minor>0|[1-9][0-9]*)(\.(?P<patch>0|[1-9][0-9]*))?$")


def _key(version: str, latest: bool = False) -> tuple[int, int, int]:
    match = VERSION.match(version)
    if match is None:
        raise ValueError(f"{version!r} is no dcgm-exporter version: give MAJOR.MINOR or MAJOR.MINOR.PATCH, as 4.10.0")
    patch = match.group("patch")
    # A major.minor names its newest patch, whatever that is.
    return (int(match.group("major")), int(match.group("minor")), int(patch) if patch else (10**6 if latest else 0))


def generation_of(version: str) -> Generation:
    """The generation a dcgm-exporter version writes: a version before the first generation's is
    the first's (their default counters are older still, and closest to it); one past the newest
    read is the newest's."""
    key = _key(version, latest=True)
    chosen = GENERATIONS[0]
    for generation in GENERATIONS:
        if key >= _key(generation.first):
            chosen = generation
    return chosen


def renamed(field: str, upto: Generation) -> tuple[str, Fraction, Rename | None]:
    """`field` (4.8's name) as generation `upto` names it, what one unit of 4.8's is in its own,
    and the last rename on the way (None: 4.8's name)."""
    name, factor, last = field, Fraction(1), None
    for generation in GENERATIONS[: GENERATIONS.index(upto) + 1]:
        for rename in generation.renames:
            if rename.old == name:
                name, factor, last = rename.new, factor * rename.factor, rename
    return name, factor, last


def default_counters(generation: Generation) -> list[str]:
    """The generation's default counters, in 4.8's names where it renames them; those it added, in its own."""
    out = list(DEFAULT_COUNTERS)
    for earlier in GENERATIONS[: GENERATIONS.index(generation) + 1]:
        out += earlier.added
    return out
