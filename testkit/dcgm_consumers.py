"""What the programs written for dcgm-exporter ask of it, exactly as they ask it: NVIDIA's Grafana
dashboard, OpenCost's GPU queries and Kepler's MIG split (docs/dcgm-consumers.md). Each query is
written out from the cited source file, and each template is filled as that program fills it."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

# NVIDIA/dcgm-exporter grafana/dcgm-exporter-dashboard.json at tag 4.5.3-4.8.2
# (691c92762eb551313c825f6efe4ceeee20982801; unchanged since cffaeb8, and the same at main
# d5e5f510a1b6b393f39a43293ccd9dc985defc79): each panel's title and its one target's expr.
DASHBOARD_COMMIT = "691c92762eb551313c825f6efe4ceeee20982801"
DASHBOARD_PANELS: tuple[tuple[str, str], ...] = (
    ("GPU Temperature", 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}'),
    ("GPU Avg. Temp", 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})'),
    ("GPU Power Usage", 'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}'),
    ("GPU Power Total", 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})'),
    ("GPU SM Clocks", 'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000'),
    ("GPU Utilization", 'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}'),
    ("GPU Framebuffer Mem Used", 'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}'),
    ("Tensor Core Utilization", 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}'),
)
# Its templating: both query variables multi-value with "All" (includeAll true, allValue null).
DASHBOARD_VARIABLES: dict[str, tuple[str, str]] = {
    "instance": ("DCGM_FI_DEV_GPU_TEMP", "instance"),  # label_values(DCGM_FI_DEV_GPU_TEMP, instance)
    "gpu": ("DCGM_FI_DEV_GPU_TEMP", "gpu"),  # label_values(DCGM_FI_DEV_GPU_TEMP, gpu)
}


def grafana_regex_escape(value: str) -> str:
    """Grafana's Prometheus data source, prometheusSpecialRegexEscape: a backslash becomes four,
    each regex metacharacter gets two (one for the PromQL string, one for the regex)."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


def grafana_all(values: Sequence[str]) -> str:
    """A multi-value variable with All selected and no allValue, as interpolateQueryExpr writes
    it: every option escaped, one alone as itself, several as (a|b)."""
    escaped = [grafana_regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def dashboard_query(expr: str, variables: Mapping[str, Sequence[str]]) -> str:
    # Longest name first, so that $gpu never eats the start of a longer name.
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace(f"${name}", grafana_all(variables[name]))
    return expr


# opencost/opencost modules/prometheus-source/pkg/prom/metricsquerier.go at
# 1ea64d02df68edc052e882dfa843ecd50e7bb5c5 (QueryGPUsUsageAvg, QueryGPUsUsageMax, QueryGPUInfo)
# and gpusaturationquerier.go at 0d0dfc6a4106093c7df858481a295f050de40a7f. The template
# parameters as OpenCost fills them (config.go at 0d0dfc6): ClusterLabel PROM_CLUSTER_ID_LABEL,
# default "cluster_id"; ClusterFilter "" unless CURRENT_CLUSTER_ID_FILTER_ENABLED; the window
# timeutil.DurationString(end - start); DataResolutionMinutes at least 1.
OPENCOST_METRICS_COMMIT = "1ea64d02df68edc052e882dfa843ecd50e7bb5c5"
OPENCOST_SATURATION_COMMIT = "0d0dfc6a4106093c7df858481a295f050de40a7f"
SATURATION_BY = "container, pod, namespace, device, modelName, UUID, GPU_I_PROFILE, GPU_I_ID, uid"
# core/pkg/opencost's reason names for the four violation counters (GPUThrottleViolation*).
VIOLATIONS = (
    ("DCGM_FI_DEV_POWER_VIOLATION", "power"),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "thermal"),
    ("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "sync_boost"),
    ("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "board_limit"),
)


def go_g(value: float) -> str:
    """Go's %g for the numbers OpenCost formats (1e+07, 0.9)."""
    text = f"{value:g}"
    return re.sub(r"e([+-])(\d)$", r"e\g<1>0\2", text)


def opencost_queries(
    window: str,
    window_seconds: float,
    cluster_filter: str = "",
    cluster_label: str = "cluster_id",
    resolution_minutes: int = 1,
    memory_threshold: float = 0.9,
) -> dict[str, str]:
    """Every OpenCost query of a dcgm-exporter field, by the name of the Go method that sends it."""
    f, w, by, c = cluster_filter, window, SATURATION_BY, cluster_label
    queries = {
        "QueryGPUsUsageAvg": (
            f'avg(avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{container!=""}}[{w}])) '
            f"by (container, pod, namespace, uid, {c})"
        ),
        "QueryGPUsUsageMax": (
            f'max(max_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{container!=""}}[{w}])) '
            f"by (container, pod, namespace, uid, {c})"
        ),
        "QueryGPUInfo": (
            f'avg(avg_over_time(DCGM_FI_DEV_DEC_UTIL{{container!="",{f}}}[{w}])) '
            f"by (container, pod, namespace, device, modelName, UUID, uid, {c})"
        ),
        "QueryGPUThrottleViolationRatio": " or ".join(
            f'label_replace(avg(increase({metric}{{container!="",{f}}}[{w}])) by ({by}, {c}) / '
            f'{go_g(window_seconds * 1e6)}, "reason", "{reason}", "", "")'
            for metric, reason in VIOLATIONS
        ),
        # The first of opencost.GPUThrottleReasons (sw_power_cap, NVML's bit 4); the other five
        # branches differ only in the bit and the name, and read the same two fields.
        "QueryGPUThrottleReasonRatio": (
            f"label_replace(avg(avg_over_time(((floor((DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
            f'{{container!="",{f}}} or DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{container!="",{f}}}) / 4)) % 2)'
            f'[{w}:{resolution_minutes}m])) by ({by}, {c}), "reason", "sw_power_cap", "", "")'
        ),
        "QueryGPUMemoryUsedRatioAvg": (
            f'avg(avg_over_time(DCGM_FI_DEV_FB_USED{{container!="",{f}}}[{w}])) by ({by}, {c}) / '
            f'(avg(avg_over_time(DCGM_FI_DEV_FB_USED{{container!="",{f}}}[{w}])) by ({by}, {c}) + '
            f'avg(avg_over_time(DCGM_FI_DEV_FB_FREE{{container!="",{f}}}[{w}])) by ({by}, {c}))'
        ),
        "QueryGPUMemoryUsedRatioMax": (
            f'max(max_over_time(DCGM_FI_DEV_FB_USED{{container!="",{f}}}[{w}])) by ({by}, {c}) / '
            f'(avg(avg_over_time(DCGM_FI_DEV_FB_USED{{container!="",{f}}}[{w}])) by ({by}, {c}) + '
            f'avg(avg_over_time(DCGM_FI_DEV_FB_FREE{{container!="",{f}}}[{w}])) by ({by}, {c}))'
        ),
        "QueryGPUMemoryPressureRatio": (
            f'avg(avg_over_time(((DCGM_FI_DEV_FB_USED{{container!="",{f}}} / '
            f'(DCGM_FI_DEV_FB_USED{{container!="",{f}}} + DCGM_FI_DEV_FB_FREE{{container!="",{f}}})) '
            f">= bool {go_g(memory_threshold)})[{w}:{resolution_minutes}m])) by ({by}, {c})"
        ),
        "QueryGPUXIDErrorCount": f'sum(changes(DCGM_FI_DEV_XID_ERRORS{{container!="",{f}}}[{w}])) by ({by}, {c})',
    }
    for name, metric, agg in (
        ("QueryGPUDRAMActiveAvg", "DCGM_FI_PROF_DRAM_ACTIVE", "avg"),
        ("QueryGPUDRAMActiveMax", "DCGM_FI_PROF_DRAM_ACTIVE", "max"),
        ("QueryGPUSMActiveAvg", "DCGM_FI_PROF_SM_ACTIVE", "avg"),
        ("QueryGPUSMOccupancyAvg", "DCGM_FI_PROF_SM_OCCUPANCY", "avg"),
    ):
        queries[name] = f'{agg}({agg}_over_time({metric}{{container!="",{f}}}[{w}])) by ({by}, {c})'
    for name, metric in (
        ("QueryGPUPCIeTxBytesAvg", "DCGM_FI_PROF_PCIE_TX_BYTES"),
        ("QueryGPUPCIeRxBytesAvg", "DCGM_FI_PROF_PCIE_RX_BYTES"),
        ("QueryGPUNVLinkTxBytesAvg", "DCGM_FI_PROF_NVLINK_TX_BYTES"),
        ("QueryGPUNVLinkRxBytesAvg", "DCGM_FI_PROF_NVLINK_RX_BYTES"),
    ):
        queries[name] = f'avg(rate({metric}{{container!="",{f}}}[{w}])) by ({by}, {c})'
    return queries


# sustainable-computing-io/kepler internal/device/gpu/nvidia/dcgm_exporter.go at
# 33328b7b9fee79c539b9ae8945c802925c7d11fa (the newest change to it on main 13944a69):
# parseMetrics reads a dcgm-exporter /metrics page over HTTP, keeps the lines whose labels have
# GPU_I_ID, and takes DCGM_FI_PROF_GR_ENGINE_ACTIVE's value as the MIG instance's activity,
# keyed by (gpu, GPU_I_ID); collector.go attributePartitioned splits the GPU's power by it.
KEPLER_COMMIT = "33328b7b9fee79c539b9ae8945c802925c7d11fa"
_KEPLER_METRIC = re.compile(r"^(DCGM_FI_\w+)\{([^}]+)\}\s+([0-9.eE+-]+)")
_KEPLER_LABEL = re.compile(r'(\w+)="([^"]*)"')


def kepler_mig_activity(text: str) -> dict[tuple[int, int], float]:
    """Kepler's parseMetrics on a metrics page: (gpu index, GPU instance id) -> activity."""
    instances: dict[tuple[int, int], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _KEPLER_METRIC.match(line)
        if match is None:
            continue
        labels = dict(_KEPLER_LABEL.findall(match[2]))
        if "GPU_I_ID" not in labels:
            continue
        # Go's strconv.Atoi / ParseUint errors are ignored there: a bad number reads 0.
        key = (_int_or_zero(labels.get("gpu", "")), _int_or_zero(labels["GPU_I_ID"]))
        instances.setdefault(key, 0.0)
        if match[1] == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
            instances[key] = float(match[3])
    return instances


def _int_or_zero(text: str) -> int:
    return int(text) if text.isdigit() else 0
