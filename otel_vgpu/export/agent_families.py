"""The agent's own families in the metric contract: its sweeps' durations, what it cannot
see or has let go of, its sources' answers, its failures and refusals, its exports."""

from __future__ import annotations

from otel_vgpu.export.family import Family, Feature, Instrument
from otel_vgpu.export.subjects import AGENT, REFUSALS, STAGES, SWEEPS
from otel_vgpu.health import Stage


def _answering(up: bool | None) -> float | None:
    return None if up is None else float(up)


# Left unannotated, so that each entry's `value` is type-checked against its subject's rows.
AGENT_FAMILIES = (
    Family(
        "vgpu.agent.collection.duration",
        "s",
        SWEEPS,
        "Time one sweep of NVML, /proc and the sources took.",
        value=lambda seconds: seconds,
        instrument=Instrument.HISTOGRAM,
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    ),
    Family(
        "vgpu.agent.blind.gpus",
        "{gpu}",
        AGENT,
        "GPUs in use whose processes NVML does not list to the agent, which is outside the host's PID namespace "
        "(hostPID missing); 0 when the agent sees every process.",
        value=lambda seen: len(seen.snapshot.blind),
    ),
    Family(
        "vgpu.agent.driver.paused",
        "",
        AGENT,
        "1 while NVML is released because the GPU Operator is upgrading this node's driver "
        "(a nvidia.com/gpu.deploy.* node label says paused-for-driver-upgrade); GPU and pod families are "
        "left out meanwhile. 0 otherwise.",
        value=lambda seen: 1 if seen.snapshot.paused else 0,
    ),
    Family(
        "vgpu.agent.pod_resources.up",
        "",
        AGENT,
        "1 when the last call to the kubelet's pod-resources API answered, 0 when it failed (shares then come "
        "from pod limits: no idle allocations, ratio auto reads 1); absent without the Kubernetes API or with "
        "--no-pod-resources.",
        value=lambda seen: _answering(seen.health.answering(Stage.POD_RESOURCES)),
    ),
    Family(
        "vgpu.agent.collection.errors",
        "{error}",
        STAGES,
        "Failures during sweeps, by stage.",
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
        "hami_annotation and config_hash (annotations on pods their writer did not make: ignored). "
        "docs/trust.md says why.",
        value=lambda row: row[1],
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.agent.export.failures",
        "{export}",
        AGENT,
        "OTLP exports that failed (with the push on).",
        value=lambda seen: seen.health.counts()[Stage.EXPORT],
        instrument=Instrument.COUNTER,
        needs=Feature.OTLP,
    ),
)
