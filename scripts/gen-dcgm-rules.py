#!/usr/bin/env python3
"""Writes one rules set per dcgm-exporter generation (scripts/dcgm_generations.py): recording
rules that give that generation's names, units and labels from the agent's families, so that
dashboards and alerts written for dcgm-exporter run unchanged once it is uninstalled
(docs/coming-from.md says which fields have no equivalent, and why). The health and GPM fields
come from their declarations (otel_vgpu/gpu/device_figures.py), the rest from the table below,
both in dcgm-exporter 4.8's names and units; each generation's renames and unit changes are
applied on top. Also writes the chart's copies (charts/otel-vgpu/files/dcgm-exporter/) and the
kustomize components, and docs/coming-from.md's tables (each generation's default counters,
and the fields recorded beside them). tests/system/test_dcgm_names.py fails when a file is stale,
and runs every set in promtool on what the agent serves.

    .venv/bin/python scripts/gen-dcgm-rules.py
"""

from __future__ import annotations

import re
import sys
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from dcgm_generations import (  # noqa: E402
    DEFAULT_COUNTERS_SOURCE,
    DEFAULT_UNITS,
    GENERATIONS,
    MIB,
    NVLINK_MB,
    UNIT_OF_FACTOR,
    Generation,
    default_counters,
    renamed,
)
from doc_blocks import write_block  # noqa: E402
from rule_document import rule_document  # noqa: E402

from otel_vgpu.export.families import POD  # noqa: E402
from otel_vgpu.export.figure_families import GPM_FAMILIES_OF  # noqa: E402
from otel_vgpu.gpu.device_figures import GPM_TABLE, HEALTH_TABLE  # noqa: E402

CHART_FILES = ROOT / "charts" / "otel-vgpu" / "files" / "dcgm-exporter"
COMPONENTS = ROOT / "kustomize" / "components"
# dcgm-exporter 4.8's field, the agent's expression of it per GPU in the agent's units, per pod
# where dcgm-exporter's pod-labelled series has a per-pod answer here (its own: a pod's share,
# not the GPU's copied), what one unit of the agent's is in the field's, and whether that is
# written as a division (bytes to MiB).
OTHERS: tuple[tuple[str, str, str | None, Fraction, bool], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "vgpu_gpu_sm_utilization_ratio", "vgpu_pod_sm_utilization_ratio", Fraction(100), False),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "vgpu_gpu_memory_copy_utilization_ratio", None, Fraction(100), False),
    (
        "DCGM_FI_DEV_ENC_UTIL",
        "vgpu_gpu_encoder_utilization_ratio",
        "vgpu_pod_encoder_utilization_ratio",
        Fraction(100),
        False,
    ),
    (
        "DCGM_FI_DEV_DEC_UTIL",
        "vgpu_gpu_decoder_utilization_ratio",
        "vgpu_pod_decoder_utilization_ratio",
        Fraction(100),
        False,
    ),
    # DCGM reads nvmlDeviceGetMemoryInfo_v2 from driver R510 on (DcgmCacheManager.cpp's
    # ReadAndCacheFBMemoryInfo): its FB_USED is v2's `used`, the allocated memory without the
    # reservation that the agent's used (v1's) holds, and FB_RESERVED is v2's `reserved`. Where
    # the driver has no v2, DCGM's FB_USED is v1's, and so is this.
    (
        "DCGM_FI_DEV_FB_USED",
        "((vgpu_gpu_memory_used_bytes - vgpu_gpu_memory_reserved_bytes) or vgpu_gpu_memory_used_bytes)",
        "vgpu_pod_memory_used_bytes",
        Fraction(1, MIB),
        True,
    ),
    ("DCGM_FI_DEV_FB_RESERVED", "vgpu_gpu_memory_reserved_bytes", None, Fraction(1, MIB), True),
    ("DCGM_FI_DEV_FB_FREE", "(vgpu_gpu_memory_total_bytes - vgpu_gpu_memory_used_bytes)", None, Fraction(1, MIB), True),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "vgpu_gpu_energy_joules_total", None, Fraction(1000), False),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "(vgpu_gpu_nvlink_transmit_bytes_per_second + vgpu_gpu_nvlink_receive_bytes_per_second)",
        None,
        Fraction(1, NVLINK_MB),
        True,
    ),
    # A gauge of the last XID's code (DCGM_FI_DEV_XID_ERRORS: "Value of the last XID error
    # encountered"), which PromQL cannot make of the per-code counter's label.
    ("DCGM_FI_DEV_XID_ERRORS", "vgpu_gpu_xid_last", None, Fraction(1), False),
    # From 4.9 on, collected by default (its own name: no 4.8 field).
    ("DCGM_FI_DEV_FB_CAPACITY_BYTES", "vgpu_gpu_memory_total_bytes", None, Fraction(1), False),
)
# The first generation's set keeps what it has always written, since people load it: NVLink in
# MiB/s (bytes/s / 1,048,576), where DCGM's "MB/s" is bytes/s / 1,024,000, 2.4 % more; the later
# sets write DCGM's.
KEPT: dict[str, Fraction] = {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": Fraction(1, MIB)}


# A NamedTuple, not a dataclass: the tests load this script as a module of no package.
class Mapping(NamedTuple):
    """A dcgm-exporter 4.8 field (or one a later generation added) and the agent's answer."""

    field: str
    gpu: str
    pod: str | None
    scale: Fraction
    """One unit of the agent's expression in the field's unit."""
    divide: bool


def written(expression: str, scale: Fraction, divide: bool) -> str:
    if scale == 1:
        return expression
    if divide and scale.numerator == 1:
        return f"{expression} / {scale.denominator}"
    return f"{expression} * {float(scale):g}"


def mappings() -> list[Mapping]:
    """Every field the agent answers, in dcgm-exporter 4.8's names and units."""
    out = []
    for figure in HEALTH_TABLE:
        if figure.dcgm:
            out.append(Mapping(figure.dcgm, figure.prometheus_name, None, Fraction(str(figure.dcgm_scale)), False))
    for gpm in GPM_TABLE:
        if gpm.dcgm:
            families = GPM_FAMILIES_OF[gpm.name]
            pod = next((f.prometheus_name for f in families if f.subject is POD), None)
            gpu = families[0].prometheus_name  # the GPU's figure itself, first of its families
            out.append(Mapping(gpm.dcgm, gpu, pod, Fraction(str(gpm.dcgm_scale)), False))
    return [*out, *(Mapping(*row) for row in OTHERS)]


def added_later(field: str, generation: Generation) -> bool:
    return any(field in later.added for later in GENERATIONS[GENERATIONS.index(generation) + 1 :])


def records(generation: Generation) -> list[tuple[str, str, str | None]]:
    """(the generation's field, the agent's expression per GPU, per pod or None), in its units."""
    out = []
    for mapping in mappings():
        if added_later(mapping.field, generation):
            continue
        name, factor, _ = renamed(mapping.field, generation)
        scale = KEPT.get(mapping.field, mapping.scale) if generation == GENERATIONS[0] else mapping.scale
        scale *= factor
        pod = written(mapping.pod, scale, mapping.divide) if mapping.pod else None
        out.append((name, written(mapping.gpu, scale, mapping.divide), pod))
    return out


# What vgpu_gpu_info gives each GPU's series: one per GPU whichever job scraped it.
INFO = "group by (gpu_uuid, gpu_model, driver_version, pci_bus_id) (vgpu_gpu_info)"


def with_dcgm_labels(expression: str, pod: bool, generation: Generation) -> str:
    """`expression` with dcgm-exporter's labels beside the agent's: gpu, UUID, device,
    modelName, the driver's version (the generation's driver label) and pci_bus_id from the
    agent's vgpu_gpu_info, where it is served, and the node's name (the generation's hostname
    label), from the agent's target_info where Prometheus has it. A pod's series get their
    GPU's model too."""
    series = f"({expression})"
    joined = ("gpu_model", "driver_version", "pci_bus_id") if pod else ("driver_version", "pci_bus_id")
    # Without vgpu_gpu_info (an allowlist without it) the series stay, without its labels.
    series = (
        f"(({series} * on (gpu_uuid) group_left ({', '.join(joined)}) {INFO})\n"
        f"  or ignoring ({', '.join(joined)})\n{series})"
    )
    named = (
        f"({series} * on (job, instance) group_left (k8s_node_name) target_info)\n"
        f"  or ignoring (k8s_node_name)\n{series}"
    )
    for label, source, value in (
        ("gpu", "gpu_id", "$1"),
        ("UUID", "gpu_uuid", "$1"),
        ("device", "gpu_id", "nvidia$1"),
        ("modelName", "gpu_model", "$1"),
        (generation.driver_label, "driver_version", "$1"),
        (generation.hostname, "k8s_node_name", "$1"),
    ):
        named = f'label_replace(\n{named},\n"{label}", "{value}", "{source}", "(.+)")'
    return named + "\n"


class Block(str):
    """A rule's expression, written as a YAML literal block."""


yaml.SafeDumper.add_representer(
    Block, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", str(text), style="|")
)


def versions(generation: Generation) -> str:
    return f"{generation.first} to {generation.last}" if generation.last else f"{generation.first} and later"


def group_name(generation: Generation) -> str:
    if generation == GENERATIONS[0]:
        return "otel-vgpu.dcgm-exporter-names"
    return f"otel-vgpu.dcgm-exporter-{generation.path.stem}"


def groups(generation: Generation) -> list[dict[str, object]]:
    out = []
    for name, gpu, pod in records(generation):
        expression = with_dcgm_labels(gpu, False, generation)
        if pod is not None:  # the pods' series have pod labels the GPU's lack: both kept
            expression = f"(\n{expression})\nor\n(\n{with_dcgm_labels(pod, True, generation)})\n"
        out.append({"record": name, "expr": Block(expression)})
    return [{"name": group_name(generation), "rules": out}]


def rules(generation: Generation = GENERATIONS[0]) -> str:
    if generation == GENERATIONS[0]:
        header = (
            "# dcgm-exporter's names, units and labels from otel-vgpu's families (docs/coming-from.md).\n"
            "# Generated by scripts/gen-dcgm-rules.py from the families' declarations: do not edit. Load it in\n"
            "# place of dcgm-exporter, not beside it (both would name the same series).\n"
        )
    else:
        header = (
            f"# dcgm-exporter {versions(generation)}'s names, units and labels from otel-vgpu's families\n"
            "# (docs/coming-from.md). Generated by scripts/gen-dcgm-rules.py from the families' declarations\n"
            "# and scripts/dcgm_generations.py: do not edit. Load it in place of dcgm-exporter, not beside it\n"
            "# (both would name the same series).\n"
        )
    return header + yaml.safe_dump({"groups": groups(generation)}, sort_keys=False, width=200)


def chart_file(generation: Generation) -> Path:
    """The chart's copy (Helm reads no file outside the chart), named by the generation's first version."""
    return CHART_FILES / f"{generation.path.stem if generation != GENERATIONS[0] else '4.8.2'}.yaml"


def component(generation: Generation) -> Path:
    return COMPONENTS / f"dcgm-exporter-names-{chart_file(generation).stem}"


def component_files(generation: Generation) -> dict[str, str]:
    """The kustomize component: a PrometheusRule of the set, named and labelled as the
    prometheus-operator component's, which kube-prometheus-stack's Prometheus selects."""
    document = rule_document("otel-vgpu-dcgm-exporter-names", groups(generation))
    rule = (
        f"# dcgm-exporter {versions(generation)}'s names from otel-vgpu's families, as a PrometheusRule.\n"
        f"# Generated by scripts/gen-dcgm-rules.py, as {generation.path.relative_to(ROOT)}: do not edit.\n"
    ) + yaml.safe_dump(document, sort_keys=False, width=200)
    kustomization = (
        f"# dcgm-exporter {versions(generation)}'s names, units and labels from the agent's families\n"
        "# (docs/coming-from.md): load it in place of dcgm-exporter, not beside it. Generated by\n"
        "# scripts/gen-dcgm-rules.py.\n"
        "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources:\n  - prometheusrule.yaml\n"
    )
    return {"kustomization.yaml": kustomization, "prometheusrule.yaml": rule}


def outputs() -> dict[Path, str]:
    """Every file the generator writes, and what it holds."""
    out: dict[Path, str] = {}
    for generation in GENERATIONS:
        text = rules(generation)
        out[generation.path] = text
        out[chart_file(generation)] = text
        for name, content in component_files(generation).items():
            out[component(generation) / name] = content
    return out


# Why no family answers a default counter.
NONE = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "none: NVIDIA vGPU licensing of virtual machines is not this agent's subject",
}


def families_of(expression: str) -> str:
    names = dict.fromkeys(re.findall(r"vgpu_\w+", expression))
    return " ".join(f"`{name}`" for name in names)


def generation_markdown(generation: Generation) -> str:
    """A generation's default counters and labels: the field, its unit, what answers it, and
    where the name comes from (confirmed, derived or secondary)."""
    answers = {mapping.field: mapping for mapping in mappings()}
    first = generation == GENERATIONS[0]
    rows = [
        f"**dcgm-exporter {versions(generation)}**: `{generation.path.relative_to(ROOT)}`, "
        f'chart `prometheus.rules.dcgmExporterNames: "{chart_file(generation).stem}"`, kustomize '
        f"`components/{component(generation).name}`.",
        "",
        "| field | unit | otel-vgpu family | source |",
        "|---|---|---|---|",
    ]
    for field in default_counters(generation):
        name, factor, rename = renamed(field, generation)
        unit = UNIT_OF_FACTOR.get(factor, DEFAULT_UNITS[field])
        if field == "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" and first:
            unit = "MiB/s (B/s ÷ 1,048,576, as this file has always written it; DCGM's is ÷ 1,024,000)"
        adder = next((earlier for earlier in GENERATIONS if field in earlier.added), None)
        if rename is not None:
            source = f"{rename.confidence}: {rename.source}"
        elif adder is not None:
            source = f"confirmed: {adder.source}"
        elif first:
            source = f"confirmed: {DEFAULT_COUNTERS_SOURCE}"
        elif generation.first == "4.8.3":
            source = "derived: 4.6.0-4.8.3's CSV, as far as it was read, is 4.8.2's"
        else:
            source = "derived: not among the renames its release notes give"
        mapping = answers.get(field)
        if mapping is None:
            family = NONE[field]
        else:
            family = families_of(mapping.gpu)
            if mapping.pod:
                family += f"; per pod, {families_of(mapping.pod)}"
        rows.append(f"| `{name}` | {unit} | {family} | {source} |")
    rows += [
        f"| `{generation.hostname}` (label) | | `k8s_node_name` of the agent's `target_info`, where Prometheus has it "
        "| "
        f"confirmed: {generation.source} |",
        f"| `{generation.driver_label}` (label) | | `driver_version` of `vgpu_gpu_info` | "
        f"{'derived' if generation.first == '4.10.0' else 'confirmed'}: {generation.source} |",
        "| `pci_bus_id` (label) | | `pci_bus_id` of `vgpu_gpu_info` (nvmlDeviceGetPciInfo's `busId`, "
        "`00000000:3B:00.0`) | "
        "confirmed: internal/pkg/rendermetrics/render_metrics.go@4.5.3-4.8.2 |",
        "| `pod`, `namespace`, `container`, `pod_uid` (labels) | | the agent's own `pod`, `namespace`, `pod_uid` "
        "on the per-pod series (`container` with `--by-container`), as `--kubernetes-virtual-gpus` splits its "
        "GPU and memory use per pod; no `vgpu` | "
        + (
            "confirmed: internal/pkg/transformation/const.go, process_metrics.go@4.5.3-4.8.2 |"
            if first
            else "derived: no change announced since 4.8.2's (whether the per-pod split follows 4.9's names "
            "is not known) |"
        ),
    ]
    return "\n".join(rows) + "\n"


def generations_markdown() -> str:
    return "\n".join(generation_markdown(generation) for generation in GENERATIONS)


def _times(scale: Fraction) -> str:
    """`scale` as a factor a reader takes in at a glance: 1e9, 0.5."""
    return f"{float(scale):.0e}".replace("e+0", "e").replace("e+", "e") if scale >= 1000 else f"{float(scale):g}"


def optional_markdown() -> str:
    """The fields the sets record beside every generation's default counters, from the same
    declarations: each with the names later generations give it, and the family answering."""
    defaults = {field for generation in GENERATIONS for field in default_counters(generation)}
    rows = [
        "| dcgm-exporter field | its name in later generations | otel-vgpu family | the field's value |",
        "|---|---|---|---|",
    ]
    for mapping in mappings():
        if mapping.field in defaults:
            continue
        later, name = [], mapping.field
        for generation in GENERATIONS[1:]:
            new, _, rename = renamed(mapping.field, generation)
            if new != name and rename is not None:
                later.append(f"`{new}` ({generation.first} on, {rename.confidence})")
                name = new
        family = families_of(mapping.gpu) + (f"; per pod, {families_of(mapping.pod)}" if mapping.pod else "")
        times = f" \N{MULTIPLICATION SIGN} {_times(mapping.scale)}" if mapping.scale != 1 else ""
        value = f"the family's{times}"
        rows.append(f"| `{mapping.field}` | {'; '.join(later) or 'the same'} | {family} | {value} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    write_block("dcgm-exporter generations", generations_markdown())
    write_block("dcgm-exporter optional fields", optional_markdown())
    for path, text in outputs().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
