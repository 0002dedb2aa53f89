"""The per-pod families of the metric contract: per (pod, GPU or MIG device), and with
--seed-metrics the original exporter's, per (pod, gpu_id)."""

from __future__ import annotations

from otel_vgpu.conventions import Form, Kind, pod_gpu_time, pod_gpu_utilization
from otel_vgpu.export.family import SPLIT, USE, Family, Feature, Instrument
from otel_vgpu.export.figure_families import ENGINE_FAMILIES, GPM_FAMILIES
from otel_vgpu.export.subjects import ENDED, POD, POD_COUNTED, SEED

# The descriptions of the per-pod names on the semantic-conventions push (otel_vgpu/conventions.py):
# the agent's own, no convention names a pod's use of a GPU.
_USED = "GPU memory used by the pod's processes on this GPU, as vgpu.pod.memory.used."
_LIMIT = "GPU memory the pod was given on this GPU or MIG device, as vgpu.pod.memory.allocated."
_PROCESSES = "Number of the pod's processes on this GPU, as vgpu.pod.processes."
_ENERGY = "The pod's part of its GPU's energy, as vgpu.pod.energy."
_PEAK = "The most GPU memory the pod's processes held at once on this GPU, as vgpu.pod.memory.peak."

# Left unannotated, so that each entry's `value` is type-checked against its subject's rows.
POD_FAMILIES = (
    Family(
        "vgpu.pod.memory.used",
        "By",
        POD,
        "GPU memory used by the pod's processes on this GPU (sum of NVML usedGpuMemory).",
        prometheus_name="vgpu_pod_memory_used_bytes",
        value=lambda r: r.memory_used,
        semconv=Form("vgpu.pod.gpu.memory.usage", "By", Kind.UPDOWNCOUNTER, _USED, integer=True),
    ),
    Family(
        "vgpu.pod.memory.allocated",
        "By",
        POD,
        "GPU memory the pod was given on this GPU or MIG device: what its allocator states (HAMi, DRA, KAI), "
        "else vGPU shares x the device's memory / ratio.",
        prometheus_name="vgpu_pod_memory_allocated_bytes",
        value=lambda r: r.memory_allocated,
        semconv=Form("vgpu.pod.gpu.memory.limit", "By", Kind.UPDOWNCOUNTER, _LIMIT, integer=True),
    ),
    Family(
        "vgpu.pod.sm.utilization",
        "1",
        POD,
        "Share of the physical GPU's SMs the pod's processes used since the last collection, 0-1. Absent where "
        "per-pod SM is unknown (MIG, MPS), and after the agent starts or a read of the GPU's processes fails, "
        "until the GPU's periods settle (up to 17 s: they wait for the samples NVML shows late).",
        prometheus_name="vgpu_pod_sm_utilization_ratio",
        value=lambda r: r.sm_shown,
        reads=USE,
        semconv=pod_gpu_utilization("general"),
    ),
    Family(
        "vgpu.pod.vgpu.utilization",
        "1",
        POD,
        "SM use relative to the compute the pod was given: sm x ratio / shares, or sm / the allocator's "
        "compute limit (1 = exactly its share). Absent where vgpu_pod_sm_utilization_ratio is, and where the "
        "pod was given no compute.",
        prometheus_name="vgpu_pod_vgpu_utilization_ratio",
        value=lambda r: r.vgpu_utilization,
        reads=USE,
    ),
    Family(
        "vgpu.pod.processes",
        "{process}",
        POD,
        "Number of the pod's processes on this GPU.",
        prometheus_name="vgpu_pod_processes",
        value=lambda r: r.processes,
        semconv=Form("vgpu.pod.gpu.process.count", "{process}", Kind.UPDOWNCOUNTER, _PROCESSES, integer=True),
    ),
    Family(
        "vgpu.pod.sm.busy",
        "s",
        POD_COUNTED,
        "SM-busy seconds of the pod's processes on this GPU: its SM share integrated over time at the agent's "
        "sweep cadence, so rate() over any window is its mean SM use there. Absent where per-pod SM is unknown "
        f"(MIG, MPS). {ENDED}",
        prometheus_name="vgpu_pod_sm_busy_seconds_total",
        value=lambda r: r.sm_busy_seconds,
        reads=USE,
        instrument=Instrument.COUNTER,
        semconv=pod_gpu_time("general"),
    ),
    Family(
        "vgpu.pod.energy",
        "J",
        POD_COUNTED,
        "The pod's part of its GPU's energy: the GPU's idle power by the vGPU shares it holds, the rest by "
        "its SM share, interval by interval; with the GPU's unattributed joules, the pods' (those that ended "
        "included) add up to the GPU's. Absent where per-pod SM is unknown (MIG, MPS) or the GPU has no "
        f"energy counter. {ENDED}",
        prometheus_name="vgpu_pod_energy_joules_total",
        value=lambda r: r.energy_joules,
        reads=SPLIT,
        instrument=Instrument.COUNTER,
        semconv=Form("vgpu.pod.gpu.energy", "J", Kind.COUNTER, _ENERGY),
    ),
    Family(
        "vgpu.pod.memory.peak",
        "By",
        POD,
        "The most GPU memory the pod's processes held at once on this GPU since the agent first saw them, read "
        "at sweep cadence: what to size a vGPU share against.",
        prometheus_name="vgpu_pod_memory_peak_bytes",
        value=lambda r: r.memory_peak,
        semconv=Form("vgpu.pod.gpu.memory.peak", "By", Kind.GAUGE, _PEAK, integer=True),
    ),
    *(family for families in ENGINE_FAMILIES.values() for family in families if family.subject in (POD, POD_COUNTED)),
    *(family for family in GPM_FAMILIES if family.subject is POD),
)
SEED_FAMILIES = (
    Family(
        "pod_gpu_memory_used",
        "",
        SEED,
        "GPU memory used by the pod in MiB (original exporter's family).",
        prometheus_name="pod_gpu_memory_used",
        value=lambda s: s.memory_used_mib,
        needs=Feature.SEED_METRICS,
    ),
    Family(
        "pod_gpu_sm_util",
        "",
        SEED,
        "Pod SM utilization in percent x ratio (original exporter's family).",
        prometheus_name="pod_gpu_sm_util",
        value=lambda s: s.sm_percent,
        reads=USE,
        needs=Feature.SEED_METRICS,
    ),
    Family(
        "pod_total_gpu_memory",
        "",
        SEED,
        "GPU memory allocated to the pod in MiB (original exporter's family).",
        prometheus_name="pod_total_gpu_memory",
        value=lambda s: s.memory_allocated_mib,
        needs=Feature.SEED_METRICS,
    ),
)
