"""The agent's own families in the metric contract: its sweeps' durations, each reader's last
pass, what it cannot see or has let go of, its sources' answers, its failures and refusals,
its exports."""

from __future__ import annotations

from otel_vgpu.agent_health import Pass, Reader, Stage
from otel_vgpu.collect.device_health import HEALTH_DEADLINE_S
from otel_vgpu.collect.gpm_reads import GPM_DEADLINE_S
from otel_vgpu.collect.sampler import SWEEP_DEADLINE_S
from otel_vgpu.collect.xids import XID_DEADLINE_S
from otel_vgpu.export.family import Family, Feature, Instrument
from otel_vgpu.export.subjects import AGENT, READERS, REFUSALS, STAGES, SWEEPS


def _answered(last: Pass | None) -> float | None:
    return None if last is None else float(last.ok)


# Left unannotated, so that each entry's `value` is type-checked against its subject's rows.
AGENT_FAMILIES = (
    Family(
        "vgpu.agent.collection.duration",
        "s",
        SWEEPS,
        "Time one sweep of NVML, /proc and the sources took.",
        prometheus_name="vgpu_agent_collection_duration_seconds",
        value=lambda seconds: seconds,
        instrument=Instrument.HISTOGRAM,
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    ),
    # node_exporter's shape (collector/collector.go: node_scrape_collector_duration_seconds and
    # node_scrape_collector_success, gauges labelled by collector), one reader a series.
    Family(
        "vgpu.agent.reader.duration",
        "s",
        READERS,
        "How long each of the agent's readers took over its last pass, by reader, as node_exporter's "
        "node_scrape_collector_duration_seconds does for its collectors: sweep (NVML, /proc and the sources, one "
        "sweep; vgpu_agent_collection_duration_seconds has every sweep), process_watch (one look at every GPU's "
        "processes between sweeps), gpm (the GPM reads of the last sweep that closed a GPU's GPM window, within "
        f"that sweep, read at once on every GPU: its slowest GPU's read, at most the {GPM_DEADLINE_S:g} s "
        "deadline), health (one round of every GPU's health figures, read in parallel: its slowest GPU's read, "
        f"at most the {HEALTH_DEADLINE_S:g} s deadline), xid (one round over every GPU's XID events, each GPU's "
        f"take within a {XID_DEADLINE_S:g} s deadline), "
        "pod_resources (one call of the kubelet's pod-resources API), api_pods and api_node (the last list of "
        "this node's pods, and of this node, from the Kubernetes API: the watch that follows a list is no pass), "
        "api_bind_requests (the last list of the BindRequests KAI Scheduler wrote for this node, with --kai). Each "
        "reader reads on a cadence of its own, off the scrape's path, and a collection serves its last pass, or "
        "how long its pass in flight has run once that is past its deadline. A reader that is off has no series "
        "(vgpu_agent_reader_success says when).",
        prometheus_name="vgpu_agent_reader_duration_seconds",
        value=lambda row: row[1].seconds,
    ),
    Family(
        "vgpu.agent.reader.success",
        "",
        READERS,
        "1 when the reader's last pass succeeded and 0 when it failed, by reader, as node_exporter's "
        "node_scrape_collector_success: sweep, 0 where it counted a failure in vgpu_agent_collection_errors_total "
        "(a GPM read's is gpm's); health, gpm and xid, 0 where any GPU's read failed or missed its deadline; "
        "pod_resources, 0 where the kubelet did not answer (vgpu_agent_pod_resources_up); api_pods, api_node and "
        "api_bind_requests, 0 from a list that failed or a watch that broke until a list answers again; "
        "process_watch, 0 where a look "
        "failed unexpectedly. A pass still in flight past its deadline (sweep and process_watch "
        f"{SWEEP_DEADLINE_S:g} s, xid {XID_DEADLINE_S:g} s a GPU; health's and gpm's end at theirs) reads 0 from "
        "that moment until it ends: it is stuck in a driver call. A reader that is off has no series: health, gpm "
        "and xid with their families turned off (gpm also on a node without GPM, whose GPUs it never reads), "
        "process_watch with --watch-interval 0, pod_resources without the Kubernetes API or with "
        "--no-pod-resources, api_pods and api_node without the Kubernetes API, api_bind_requests with --kai off "
        "or, with auto, until a reservation pod of KAI's runs on the node.",
        prometheus_name="vgpu_agent_reader_success",
        value=lambda row: float(row[1].ok),
    ),
    Family(
        "vgpu.agent.blind.gpus",
        "{gpu}",
        AGENT,
        "GPUs in use whose processes NVML does not list to the agent, which is outside the host's PID namespace "
        "(hostPID missing); 0 when the agent sees every process.",
        prometheus_name="vgpu_agent_blind_gpus",
        value=lambda seen: len(seen.snapshot.blind),
    ),
    Family(
        "vgpu.agent.driver.paused",
        "",
        AGENT,
        "1 while NVML is released because the GPU Operator is upgrading this node's driver "
        "(a nvidia.com/gpu.deploy.* node label says paused-for-driver-upgrade); GPU and pod families are "
        "left out meanwhile. 0 otherwise.",
        prometheus_name="vgpu_agent_driver_paused",
        value=lambda seen: 1 if seen.snapshot.paused else 0,
    ),
    Family(
        "vgpu.agent.pod_resources.up",
        "",
        AGENT,
        "1 when the last call to the kubelet's pod-resources API answered, 0 when it failed (shares then come "
        "from pod limits: no idle allocations, ratio auto reads 1); absent without the Kubernetes API or with "
        "--no-pod-resources.",
        prometheus_name="vgpu_agent_pod_resources_up",
        value=lambda seen: _answered(seen.health.last_pass(Reader.POD_RESOURCES)),
    ),
    Family(
        "vgpu.agent.collection.errors",
        "{error}",
        STAGES,
        "Failures during sweeps, by stage.",
        prometheus_name="vgpu_agent_collection_errors_total",
        value=lambda stage_count: stage_count[1],
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.agent.refusals",
        "{input}",
        REFUSALS,
        "Inputs a tenant can write that the agent refused to let decide attribution or allocation, each "
        "counted once, by reason: nested_pod_cgroup (a cgroup below a container named like a pod: billed to "
        "the container's pod), unknown_pod (a pod the Kubernetes API does not know, past the bound: its usage "
        "unattributed), pid_reused (NVML samples older than the process holding their PID: given to no pod), "
        "mps_server_name (a process calling itself the MPS server where it cannot be one: billed to its pod), "
        "hami_annotation and config_hash (annotations on pods their writer did not make: ignored), kai_fraction "
        "(KAI Scheduler's fraction marks on a pod no Succeeded BindRequest binds to a reserved GPU of this node: no "
        "share from them), kai_reservation (a pod that would be one of KAI's reservation pods and is not: it holds "
        "no fraction) and kai_overcommit (KAI fractions on one GPU adding up to more than 1: scaled down). "
        "docs/trust.md says why.",
        prometheus_name="vgpu_agent_refusals_total",
        value=lambda row: row[1],
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.agent.export.failures",
        "{export}",
        AGENT,
        "OTLP exports that failed (with the push on).",
        prometheus_name="vgpu_agent_export_failures_total",
        value=lambda seen: seen.health.counts()[Stage.EXPORT],
        instrument=Instrument.COUNTER,
        needs=Feature.OTLP,
    ),
)
