"""The metric contract, in one table: every family the agent publishes.

Each entry has its OpenTelemetry instrument name and UCUM unit, the kind of
instrument, the labels of its series, and the Prometheus name a scrape shows
(`prometheus_name`, the OpenTelemetry-to-Prometheus rules of
opentelemetry-exporter-prometheus). The telemetry creates its instruments
from this table; the tests and the README's metric tables are checked
against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    POD = "pod"
    """Per (pod, GPU): one series per row of the snapshot's pods."""
    GPU = "gpu"
    """Per GPU."""
    SEED = "seed"
    """The original exporter's families, with --seed-metrics."""
    AGENT = "agent"
    """The agent itself."""


class Instrument(str, Enum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


POD_LABELS = ("namespace", "pod", "pod_uid", "gpu_id", "gpu_uuid")
"""Plus `container` with --by-container, and `mig_uuid`, `mig_profile` on a MIG device."""
GPU_LABELS = ("gpu_id", "gpu_uuid", "gpu_model")
SEED_LABELS = ("pod", "gpu_id")

# UCUM units and the suffix they give a Prometheus name, on a scrape and
# through Prometheus' OTLP ingestion alike (unit "1": "ratio", the
# specification's rule, which sdk_internals.py applies to the exporter); a
# unit in braces is an annotation and adds nothing.
_UNIT_SUFFIXES = {"By": "bytes", "s": "seconds", "J": "joules", "1": "ratio"}


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    """The OpenTelemetry instrument name (dotted), as pushed over OTLP."""
    unit: str
    kind: Kind
    description: str
    instrument: Instrument = Instrument.GAUGE
    labels: tuple[str, ...] = ()

    @property
    def prometheus_name(self) -> str:
        """The family's name in a scrape of /metrics."""
        name = self.name.replace(".", "_")
        suffix = "" if self.unit.startswith("{") else _UNIT_SUFFIXES.get(self.unit, self.unit)
        if suffix and not name.endswith(f"_{suffix}"):
            name = f"{name}_{suffix}"
        return f"{name}_total" if self.instrument is Instrument.COUNTER else name


FAMILIES: tuple[Family, ...] = (
    Family(
        "vgpu.pod.memory.used",
        "By",
        Kind.POD,
        "GPU memory used by the pod's processes on this GPU (sum of NVML usedGpuMemory).",
        labels=POD_LABELS,
    ),
    Family(
        "vgpu.pod.memory.allocated",
        "By",
        Kind.POD,
        "GPU memory the pod was given on this GPU or MIG device: what its allocator states (HAMi, DRA), "
        "else vGPU shares x the device's memory / ratio.",
        labels=POD_LABELS,
    ),
    Family(
        "vgpu.pod.sm.utilization",
        "1",
        Kind.POD,
        "Share of the physical GPU's SMs the pod's processes used since the last collection, 0-1.",
        labels=POD_LABELS,
    ),
    Family(
        "vgpu.pod.vgpu.utilization",
        "1",
        Kind.POD,
        "SM use relative to the compute the pod was given: sm x ratio / shares, or sm / the allocator's "
        "compute limit (1 = exactly its share).",
        labels=POD_LABELS,
    ),
    Family(
        "vgpu.pod.processes", "{process}", Kind.POD, "Number of the pod's processes on this GPU.", labels=POD_LABELS
    ),
    Family(
        "vgpu.pod.sm.busy",
        "s",
        Kind.POD,
        "SM-busy seconds of the pod's processes on this GPU: its SM share integrated over time at the agent's "
        "sweep cadence, so rate() over any window is its mean SM use there. Absent where per-pod SM is unknown "
        "(MIG, MPS); restarts from 0 for a pod seen anew.",
        Instrument.COUNTER,
        labels=POD_LABELS,
    ),
    Family(
        "vgpu.pod.energy",
        "J",
        Kind.POD,
        "The pod's part of its GPU's energy: the GPU's idle power by the vGPU shares it holds, the rest by "
        "its SM share, interval by interval; with the GPU's unattributed joules, the pods' add up to the "
        "GPU's. Absent where per-pod SM is unknown (MIG, MPS) or the GPU has no energy counter.",
        Instrument.COUNTER,
        labels=POD_LABELS,
    ),
    Family(
        "vgpu.pod.memory.peak",
        "By",
        Kind.POD,
        "The most GPU memory the pod's processes held at once on this GPU since the agent first saw them, read "
        "at sweep cadence: what to size a vGPU share against.",
        labels=POD_LABELS,
    ),
    Family("vgpu.gpu.memory.total", "By", Kind.GPU, "Physical memory of the GPU.", labels=GPU_LABELS),
    Family(
        "vgpu.gpu.memory.used",
        "By",
        Kind.GPU,
        "Physical memory in use on the GPU (NVML device figure), including what the driver reserves, "
        "which no process holds.",
        labels=GPU_LABELS,
    ),
    Family(
        "vgpu.gpu.sm.utilization",
        "1",
        Kind.GPU,
        "Device utilization over the last sweep's interval (the mean of NVML's own samples), 0-1 (absent in MIG mode).",
        labels=GPU_LABELS,
    ),
    Family(
        "vgpu.gpu.sm.busy",
        "s",
        Kind.GPU,
        "SM-busy seconds of the GPU: its utilization integrated over time at the agent's sweep cadence "
        "(absent in MIG mode).",
        Instrument.COUNTER,
        labels=GPU_LABELS,
    ),
    Family(
        "vgpu.gpu.energy",
        "J",
        Kind.GPU,
        "Energy the GPU used, from NVML's counter (Volta and newer; a driver reload is counted from 0, "
        "not backwards). Absent where NVML has no energy counter.",
        Instrument.COUNTER,
        labels=GPU_LABELS,
    ),
    Family(
        "vgpu.gpu.energy.unattributed",
        "J",
        Kind.GPU,
        "The part of the GPU's energy given to no pod: idle power of the shares nobody holds, SM time no "
        "pod ran, and all of it where per-pod SM is unknown.",
        Instrument.COUNTER,
        labels=GPU_LABELS,
    ),
    Family(
        "vgpu.gpu.vgpus",
        "{vgpu}",
        Kind.GPU,
        "vGPUs each physical GPU is presented as (the ratio in force).",
        labels=GPU_LABELS,
    ),
    Family(
        "vgpu.gpu.memory.unattributed",
        "By",
        Kind.GPU,
        "GPU memory of processes that belong to no pod.",
        labels=GPU_LABELS,
    ),
    Family(
        "vgpu.gpu.mps.servers",
        "{server}",
        Kind.GPU,
        "MPS server processes on the GPU; above 0, NVML gives its clients' SM to the server, so the pod SM "
        "families are left out for this GPU.",
        labels=GPU_LABELS,
    ),
    Family(
        "pod_gpu_memory_used",
        "",
        Kind.SEED,
        "GPU memory used by the pod in MiB (original exporter's family).",
        labels=SEED_LABELS,
    ),
    Family(
        "pod_gpu_sm_util",
        "",
        Kind.SEED,
        "Pod SM utilization in percent x ratio (original exporter's family).",
        labels=SEED_LABELS,
    ),
    Family(
        "pod_total_gpu_memory",
        "",
        Kind.SEED,
        "GPU memory allocated to the pod in MiB (original exporter's family).",
        labels=SEED_LABELS,
    ),
    Family(
        "vgpu.agent.collection.duration",
        "s",
        Kind.AGENT,
        "Time one sweep of NVML, /proc and the sources took.",
        Instrument.HISTOGRAM,
    ),
    Family(
        "vgpu.agent.collection.errors",
        "{error}",
        Kind.AGENT,
        "Failures during sweeps, by stage.",
        Instrument.COUNTER,
        labels=("stage",),
    ),
    Family(
        "vgpu.agent.export.failures",
        "{export}",
        Kind.AGENT,
        "OTLP exports that failed (with the push on).",
        Instrument.COUNTER,
    ),
    Family(
        "vgpu.agent.blind.gpus",
        "{gpu}",
        Kind.AGENT,
        "GPUs in use whose processes NVML does not list to the agent, which is outside the host's PID namespace "
        "(hostPID missing); 0 when the agent sees every process.",
    ),
    Family(
        "vgpu.agent.driver.paused",
        "",
        Kind.AGENT,
        "1 while NVML is released because the GPU Operator is upgrading this node's driver "
        "(a nvidia.com/gpu.deploy.* node label says paused-for-driver-upgrade); GPU and pod families are "
        "left out meanwhile. 0 otherwise.",
    ),
    Family(
        "vgpu.agent.pod_resources.up",
        "",
        Kind.AGENT,
        "1 when the last call to the kubelet's pod-resources API answered, 0 when it failed (shares then come "
        "from pod limits: no idle allocations, ratio auto reads 1); absent without the Kubernetes API or with "
        "--no-pod-resources.",
    ),
)
BY_NAME = {family.name: family for family in FAMILIES}


def of_kind(kind: Kind) -> tuple[Family, ...]:
    return tuple(family for family in FAMILIES if family.kind is kind)
