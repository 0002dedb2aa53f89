"""What was written for dcgm-exporter, run unchanged on the agent's dcgm-exporter names in real
Prometheus (docs/dcgm-consumers.md): NVIDIA's Grafana dashboard, OpenCost's GPU queries, and
Kepler's MIG split, each query as its source writes it (testkit/dcgm_consumers.py)."""

from __future__ import annotations

import math
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from testkit.agent import ROOT, running_agent
from testkit.dcgm_consumers import (
    DASHBOARD_PANELS,
    DASHBOARD_VARIABLES,
    dashboard_query,
    kepler_mig_activity,
    opencost_queries,
)
from testkit.prometheus import Prometheus, running_prometheus

# The ≤ 4.8.2 generation (Hostname), the one NVIDIA's dashboard and OpenCost were written for.
RULES = ROOT / "deploy" / "prometheus" / "dcgm-exporter-names.yaml"
# Per-generation sets, where they exist: those of 4.8.x speak the same names as RULES; from 4.9
# dcgm-exporter renamed the fields, and these consumers ask for the old names.
GENERATIONS = sorted((ROOT / "deploy" / "prometheus" / "dcgm-exporter").glob("4.8*.yaml"))
# A Hopper node: GPU 0 time-sliced by two pods, GPU 1 one pod of two containers, GPU 2 in MIG
# mode with a pod on each MIG device. Constant loads, so that a window's average is the figure.
NODE = """
node: gpu-node-3
gpus:
  - {model: NVIDIA H100 80GB HBM3, memory: 80GiB, lacks: [encoder]}
  - {model: NVIDIA H100 80GB HBM3, memory: 80GiB, lacks: [encoder]}
  - model: NVIDIA H100 80GB HBM3
    memory: 80GiB
    lacks: [encoder]
    mig:
      - {profile: 3g.40gb, memory: 40GiB}
      - {profile: 3g.40gb, memory: 40GiB}
pods:
  - namespace: ml
    name: trainer-0
    shares: {0: 1}
    processes: [{gpu: 0, memory: 20GiB, sm: 0.5, tensor: 0.4, dram: 0.2, decoder: 0.1, container: trainer}]
  - namespace: ml
    name: notebook-1
    shares: {0: 1}
    processes: [{gpu: 0, memory: 6GiB, sm: 0.2, tensor: 0.05, dram: 0.1, decoder: 0.3, container: lab}]
  - namespace: inference
    name: server-0
    shares: {1: 2}
    processes:
      - {gpu: 1, memory: 12GiB, sm: 0.3, tensor: 0.2, dram: 0.3, decoder: 0.2, container: server}
      - {gpu: 1, memory: 2GiB, sm: 0.1, dram: 0.05, container: sidecar}
  - namespace: batch
    name: mig-job-0
    shares: {2/0: 1}
    processes: [{gpu: 2, mig: 0, memory: 10GiB, sm: 0.6, tensor: 0.3, container: job}]
  - namespace: batch
    name: mig-job-1
    shares: {2/1: 1}
    processes: [{gpu: 2, mig: 1, memory: 5GiB, sm: 0.2, container: job}]
"""
GPUS = 3
# OpenCost's window is its allocation window (end - start, e.g. 24h); a short one here, so that
# the window holds only settled samples soon after the start. The queries' shape is unchanged.
WINDOW, WINDOW_S = "20s", 20.0
TIMEOUT = 120.0  # a loaded 2-core machine: the first GPM window, scrapes and rule evaluations


@dataclass
class Setup:
    prometheus: Prometheus
    by_container: bool


# (rules file, --by-container): the dashboard needs no container label; OpenCost's queries all
# select container!="", which the agent writes only with --by-container.
SETUPS = [(RULES, False), (RULES, True)] + [(path, True) for path in GENERATIONS]


@pytest.fixture(scope="module", params=SETUPS, ids=lambda p: f"{p[0].name}{'-by-container' if p[1] else ''}")
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    rules, by_container = request.param
    tmp = tmp_path_factory.mktemp("consumers")
    scenario = tmp / "node.yaml"
    scenario.write_text(NODE)
    ratio = tmp / "gpu_allocation.txt"
    ratio.write_text("2\n")
    flags = ["--simulate", str(scenario), "--allocation-file", str(ratio)]
    with running_agent(*flags, *(["--by-container"] if by_container else [])) as agent:
        target = agent.url.removeprefix("http://")
        # honor_labels, as the chart's PodMonitor: the agent's pod, namespace and container
        # labels are the workloads', not the scraped pod's.
        scrape = [{"job_name": "otel-vgpu", "honor_labels": True, "static_configs": [{"targets": [target]}]}]
        with running_prometheus(tmp, scrape, [rules]) as prometheus:
            yield Setup(prometheus, by_container)


# OpenCost's queries select container!="", which only --by-container writes (the usage test
# asserts that they select nothing without it): these run on the --by-container setups alone.
BY_CONTAINER_ONLY = pytest.mark.parametrize(
    "node", [setup for setup in SETUPS if setup[1]], indirect=True, ids=lambda p: f"{p[0].name}-by-container"
)


def query_at(prometheus: Prometheus, expr: str, at: float) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = prometheus.api("query", query=expr, time=f"{at:.3f}")["result"]
    return result


def settle(what: str, check: Callable[[], str | None]) -> None:
    """Poll `check` (None when satisfied, else why not) until it holds: the first GPM window,
    scrapes and rule evaluations come when the machine lets them."""
    deadline = time.monotonic() + TIMEOUT
    while (why := check()) is not None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {why}")
        time.sleep(0.5)


def by_pod(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(name, "") for name in labels): float(r["value"][1]) for r in result}


def same(got: dict[tuple[str, ...], float], want: dict[tuple[str, ...], float]) -> str | None:
    if not want:
        return "the agent's own query has no series yet"
    if set(got) != set(want):
        return f"series {sorted(got)} against the agent's {sorted(want)}"
    off = {key: (got[key], want[key]) for key in want if not math.isclose(got[key], want[key], rel_tol=1e-9)}
    return f"values (query, agent) {off}" if off else None


# Series per panel on the node above, without and with --by-container: per GPU, and for the
# fields with pod series (GPU_UTIL, FB_USED, tensor) one per pod, or per container. GPU 2 is in
# MIG mode: no device utilization, and no SM figures for its pods; GPU 0's two pods shared its
# GPM window, so neither has a tensor figure of its own.
DASHBOARD_SERIES: dict[bool, dict[str, int]] = {
    False: {
        "GPU Temperature": 3,
        "GPU Avg. Temp": 1,
        "GPU Power Usage": 3,
        "GPU Power Total": 1,
        "GPU SM Clocks": 3,
        "GPU Utilization": 2 + 3,
        "GPU Framebuffer Mem Used": 3 + 5,
        "Tensor Core Utilization": 3 + 3,
    },
    True: {
        "GPU Temperature": 3,
        "GPU Avg. Temp": 1,
        "GPU Power Usage": 3,
        "GPU Power Total": 1,
        "GPU SM Clocks": 3,
        "GPU Utilization": 2 + 4,
        "GPU Framebuffer Mem Used": 3 + 6,
        "Tensor Core Utilization": 3 + 4,
    },
}


def label_values(prometheus: Prometheus, metric: str, label: str) -> list[str]:
    # What Grafana asks for label_values(metric, label): the label's values on the metric's series.
    values: list[str] = prometheus.api(f"label/{label}/values", **{"match[]": metric})
    return values


def test_every_query_of_nvidias_dashboard_returns_series(node: Setup) -> None:
    prometheus = node.prometheus
    prometheus.wait_for("DCGM_FI_DEV_GPU_TEMP", timeout=TIMEOUT)
    variables = {name: label_values(prometheus, *source) for name, source in DASHBOARD_VARIABLES.items()}
    assert len(variables["instance"]) == 1 and sorted(variables["gpu"]) == [str(i) for i in range(GPUS)]
    want = DASHBOARD_SERIES[node.by_container]
    counts: dict[str, int] = {}

    def check() -> str | None:
        for title, expr in DASHBOARD_PANELS:
            result = prometheus.query(dashboard_query(expr, variables))
            counts[title] = len(result)
            # Each legend is GPU {{gpu}}: every series says its GPU.
            assert all("gpu" in r["metric"] or not r["metric"] for r in result), (title, result)
        return None if counts == want else f"series per panel {counts}, expected {want}"

    settle("NVIDIA's dashboard", check)


def test_opencost_gpu_usage_is_each_containers_own_figure(node: Setup) -> None:
    prometheus = node.prometheus
    prometheus.wait_for("DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod!=''}", timeout=TIMEOUT)
    queries = opencost_queries(WINDOW, WINDOW_S)
    keys = ("namespace", "pod", "container")
    got: dict[str, dict[tuple[str, ...], float]] = {}

    def check() -> str | None:
        at = time.time() - 1
        for name, family, agg in (
            ("QueryGPUsUsageAvg", "vgpu_pod_graphics_active_ratio", "avg"),
            ("QueryGPUsUsageMax", "vgpu_pod_graphics_active_ratio", "max"),
        ):
            result = query_at(prometheus, queries[name], at)
            # dcgm-exporter writes neither uid (it writes pod_uid) nor cluster_id: OpenCost's
            # grouping keeps them empty, and it keys the result by cluster, namespace and pod.
            assert not any({"uid", "cluster_id"} & set(r["metric"]) for r in result), result
            got[name] = by_pod(result, *keys)
            own = f'{agg}({agg}_over_time({family}{{container!=""}}[{WINDOW}])) by (container, pod, namespace)'
            if why := same(got[name], by_pod(query_at(prometheus, own, at), *keys)):
                return f"{name}: {why}"
        return None

    if not node.by_container:
        # Without the container label every query's container!="" selects nothing (the pod
        # series were waited for above, so the outcome is settled).
        assert prometheus.query(queries["QueryGPUsUsageAvg"]) == []
        assert prometheus.query(queries["QueryGPUInfo"]) == []
        return
    settle("OpenCost's GPU usage", check)
    # Each container of a pod with a GPU or MIG device to itself; GPU 0's two pods shared its
    # GPM window, so the agent has no exact figure for either and OpenCost gets none.
    assert set(got["QueryGPUsUsageAvg"]) == {
        ("inference", "server-0", "server"),
        ("inference", "server-0", "sidecar"),
        ("batch", "mig-job-0", "job"),
        ("batch", "mig-job-1", "job"),
    }
    # The MIG devices' pods: each its own instance's figure, not GPU 2's copied.
    gpu = float(prometheus.query('vgpu_gpu_graphics_active_ratio{gpu_id="2"}')[0]["value"][1])
    mig = [got["QueryGPUsUsageAvg"][("batch", f"mig-job-{i}", "job")] for i in (0, 1)]
    assert mig[0] != mig[1] and gpu not in mig, (gpu, mig)


@BY_CONTAINER_ONLY
def test_opencost_gpu_info_names_each_containers_device(node: Setup) -> None:
    prometheus = node.prometheus
    prometheus.wait_for("DCGM_FI_DEV_DEC_UTIL{pod!=''}", timeout=TIMEOUT)
    query = opencost_queries(WINDOW, WINDOW_S)["QueryGPUInfo"]
    keys = ("namespace", "pod", "container", "device", "modelName", "UUID")
    got: dict[tuple[str, ...], float] = {}

    def check() -> str | None:
        nonlocal got
        at = time.time() - 1
        got = by_pod(query_at(prometheus, query, at), *keys)
        own = query_at(
            prometheus,
            f'100 * avg(avg_over_time(vgpu_pod_decoder_utilization_ratio{{container!=""}}[{WINDOW}])) '
            "by (container, pod, namespace, gpu_id, gpu_uuid)",
            at,
        )
        # The pod families name the GPU by id and UUID; its model is on the GPU's own families.
        model = {
            r["metric"]["gpu_uuid"]: r["metric"]["gpu_model"] for r in prometheus.query("vgpu_gpu_memory_total_bytes")
        }
        want: dict[tuple[str, ...], float] = {}
        for r in own:
            labels = r["metric"]
            key = (labels["namespace"], labels["pod"], labels["container"], "nvidia" + labels["gpu_id"])
            want[(*key, model[labels["gpu_uuid"]], labels["gpu_uuid"])] = float(r["value"][1])
        return same(got, want)

    settle("OpenCost's GPU info", check)
    # The decoder's users: GPU 0's two pods and GPU 1's two containers (the MIG devices have none).
    assert {key[:3] for key in got} == {
        ("ml", "trainer-0", "trainer"),
        ("ml", "notebook-1", "lab"),
        ("inference", "server-0", "server"),
        ("inference", "server-0", "sidecar"),
    }
    # The two pods of GPU 0 each read their own decoder figure, not the GPU's.
    assert got[next(k for k in got if k[1] == "trainer-0")] != got[next(k for k in got if k[1] == "notebook-1")]


# OpenCost's saturation queries on the node above with --by-container: the series each returns.
# Those over fields the agent gives per pod (DRAM, SM active, SM occupancy, PCIe) have one per
# container of a pod with its GPU or MIG device to itself; those over a field with no pod series
# (FB_FREE, the violation counters, the clock event reasons, XID_ERRORS) and
# NVLink (these GPUs have none) return nothing. PCIe: OpenCost takes rate() of what
# dcgm-exporter serves as a gauge in B/s, so those series exist and their value means nothing.
SATURATION_SERIES = {
    "QueryGPUThrottleViolationRatio": 0,
    "QueryGPUThrottleReasonRatio": 0,
    "QueryGPUMemoryUsedRatioAvg": 0,
    "QueryGPUMemoryUsedRatioMax": 0,
    "QueryGPUMemoryPressureRatio": 0,
    "QueryGPUXIDErrorCount": 0,
    "QueryGPUDRAMActiveAvg": 4,
    "QueryGPUDRAMActiveMax": 4,
    "QueryGPUSMActiveAvg": 4,
    "QueryGPUSMOccupancyAvg": 4,
    "QueryGPUPCIeTxBytesAvg": 4,
    "QueryGPUPCIeRxBytesAvg": 4,
    "QueryGPUNVLinkTxBytesAvg": 0,
    "QueryGPUNVLinkRxBytesAvg": 0,
}


@BY_CONTAINER_ONLY
def test_opencost_saturation_queries_answer_where_the_agent_has_a_pods_figure(node: Setup) -> None:
    prometheus = node.prometheus
    prometheus.wait_for("DCGM_FI_PROF_DRAM_ACTIVE{pod!=''}", timeout=TIMEOUT)
    queries = opencost_queries(WINDOW, WINDOW_S)
    assert set(SATURATION_SERIES) <= set(queries)
    counts: dict[str, int] = {}

    def check() -> str | None:
        for name in SATURATION_SERIES:
            counts[name] = len(prometheus.query(queries[name]))
        return None if counts == SATURATION_SERIES else f"series per query {counts}"

    settle("OpenCost's saturation queries", check)
    dram = by_pod(prometheus.query(queries["QueryGPUDRAMActiveAvg"]), "namespace", "pod", "container")
    own = by_pod(
        prometheus.query(
            f'avg(avg_over_time(vgpu_pod_dram_active_ratio{{container!=""}}[{WINDOW}])) by (container, pod, namespace)'
        ),
        "namespace",
        "pod",
        "container",
    )
    assert set(dram) == set(own)


def test_kepler_finds_no_mig_instance_in_the_rules_series(node: Setup) -> None:
    """Kepler reads a dcgm-exporter /metrics page, not Prometheus; the nearest page the rules
    make is Prometheus' /federate of the recorded field. Its MIG split keys on GPU_I_ID, which
    the rules never write (the agent names a MIG device by mig_uuid and mig_profile)."""
    prometheus = node.prometheus
    prometheus.wait_for('DCGM_FI_PROF_GR_ENGINE_ACTIVE{mig_uuid!=""}', timeout=TIMEOUT)
    query = urllib.parse.urlencode({"match[]": "DCGM_FI_PROF_GR_ENGINE_ACTIVE"})
    with urllib.request.urlopen(f"{prometheus.url}/federate?{query}", timeout=10) as response:
        page = response.read().decode()
    lines = [line for line in page.splitlines() if line.startswith("DCGM_FI_PROF_GR_ENGINE_ACTIVE{")]
    # The MIG devices' series are there, one per pod on each, with the GPU's gpu label...
    assert sum('mig_uuid="MIG-' in line and 'gpu="2"' in line for line in lines) == 2, page
    # ...and none has GPU_I_ID, so Kepler's parser finds no instance and its split gets no activity.
    assert kepler_mig_activity(page) == {}


@pytest.mark.unit
def test_keplers_parser_reads_dcgm_exporters_own_line() -> None:
    # Kepler's own test line (collector_test.go): the parser above is no parser of nothing.
    page = (
        "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE\n"
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",GPU_I_ID="1",GPU_I_PROFILE="1g.5gb"} 0.5\n'
    )
    assert kepler_mig_activity(page) == {(0, 1): 0.5}
