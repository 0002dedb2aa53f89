"""The per-GPU families of the metric contract: each GPU's figures read by the sweeps, the
GPUs the agent knows (lost or not) and what NVML says of each, its health figures read off
the scrape's path, and its XID errors."""

from __future__ import annotations

from otel_vgpu.collect.reading import Read
from otel_vgpu.conventions import Form, Kind, gpu_utilization
from otel_vgpu.export.family import SPLIT, USE, Family, Instrument
from otel_vgpu.export.figure_families import ENGINE_FAMILIES, GPM_FAMILIES, GPM_READS, HEALTH_FAMILIES, HEALTH_READS
from otel_vgpu.export.subjects import GPU, GPU_HEALTH, GPU_INFO, KNOWN, UNATTRIBUTED, XID, XID_LAST
from otel_vgpu.gpu.device_figures import MAX_XID_CODES

# Left unannotated, so that each entry's `value` is type-checked against its subject's rows.
GPU_FAMILIES = (
    Family(
        "vgpu.gpu.info",
        "",
        GPU_INFO,
        "1 for each GPU the agent knows, with what NVML says of it as labels: driver_version "
        "(nvmlSystemGetDriverVersion) and pci_bus_id (nvmlDeviceGetPciInfo's busId, 00000000:3B:00.0), "
        "each absent where NVML would not tell. Join on gpu_uuid to put them on another family's series. "
        "A GPU that cannot be read keeps the series it last had (vgpu_gpu_lost 1).",
        prometheus_name="vgpu_gpu_info",
        value=lambda row: 1,
    ),
    Family(
        "vgpu.gpu.memory.total",
        "By",
        GPU,
        "Physical memory of the GPU.",
        prometheus_name="vgpu_gpu_memory_total_bytes",
        value=lambda g: g.device.memory_total,
        semconv=Form("hw.gpu.memory.limit", "By", Kind.UPDOWNCOUNTER, "Size of the GPU memory.", integer=True),
    ),
    # NVML's v1 figure (nvmlDeviceGetMemoryInfo, nvmlMemory_t): nvml.h defines its `used` as the
    # "Sum of Reserved and Allocated device memory", and v2's `used` as "Allocated device memory"
    # alone, which is what nvidia-smi's memory.used and dcgm-exporter's DCGM_FI_DEV_FB_USED show
    # (DCGM reads v2 from driver R510 on). v1's is kept, as ever, so that the reservation, no
    # process's, is in the GPU's used beside what the processes hold (docs/metrics.md).
    Family(
        "vgpu.gpu.memory.used",
        "By",
        GPU,
        "Memory in use on the GPU: NVML's v1 used (nvmlDeviceGetMemoryInfo), what its processes allocated "
        "and what the driver reserves (vgpu_gpu_memory_reserved_bytes), which no process holds. nvidia-smi's "
        "memory.used and dcgm-exporter's DCGM_FI_DEV_FB_USED are this less the reserved.",
        prometheus_name="vgpu_gpu_memory_used_bytes",
        value=lambda g: g.device.memory_used,
        semconv=Form(
            "hw.gpu.memory.usage",
            "By",
            Kind.UPDOWNCOUNTER,
            "GPU memory used: NVML's v1 used, the driver's reservation included "
            "(vgpu.gpu.memory.reserved), as vgpu.gpu.memory.used.",
            integer=True,
        ),
    ),
    Family(
        "vgpu.gpu.memory.reserved",
        "By",
        GPU,
        "Memory the driver and firmware reserve on the GPU (NVML's nvmlDeviceGetMemoryInfo_v2 reserved, "
        "nvidia-smi's memory.reserved), part of vgpu_gpu_memory_used_bytes. Absent where the driver or "
        "nvidia-ml-py has no v2 (drivers before R510), never 0 in its place.",
        prometheus_name="vgpu_gpu_memory_reserved_bytes",
        value=lambda g: g.device.memory_reserved,
    ),
    # With it, the GPU's used adds up: the pods', the unattributed, the reserved and this
    # (docs/metrics.md). Apart from the unattributed, which is processes' memory by definition.
    Family(
        "vgpu.gpu.memory.unlisted",
        "By",
        GPU,
        "GPU memory in use that no process listing holds: vgpu_gpu_memory_used_bytes less "
        "vgpu_gpu_memory_reserved_bytes less the memory NVML lists for every process on the GPU (the pods' "
        "and those of no pod), never below 0. On an H200 with driver 580, a few MiB per CUDA context that its "
        "process's listed memory leaves out. Absent where the reserved is, in MIG mode, and where the "
        "processes or any process's memory could not be read.",
        prometheus_name="vgpu_gpu_memory_unlisted_bytes",
        value=lambda g: g.unlisted_memory,
    ),
    Family(
        "vgpu.gpu.sm.utilization",
        "1",
        GPU,
        "Device utilization over the last sweep's interval (the mean of NVML's own samples), 0-1 (absent in MIG mode).",
        prometheus_name="vgpu_gpu_sm_utilization_ratio",
        value=lambda g: g.interval_utilization,
        reads=frozenset({Read.GPU_SAMPLES}),
        semconv=gpu_utilization("general"),
    ),
    Family(
        "vgpu.gpu.sm.busy",
        "s",
        GPU,
        "SM-busy seconds of the GPU: its utilization integrated over time at the agent's sweep cadence "
        "(absent in MIG mode).",
        prometheus_name="vgpu_gpu_sm_busy_seconds_total",
        value=lambda g: g.sm_busy_seconds,
        reads=frozenset({Read.GPU_SAMPLES}),
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.gpu.sm.unattributed",
        "s",
        UNATTRIBUTED,
        "SM-busy seconds of the GPU that no pod was given, by reason: no_pod (a process of no pod: the host's, "
        "or one gone before it could be read), unseen (a process that lived between two looks, known from "
        "NVML's accounting alone), mps (beside a process whose use NVML cannot tell: an MPS client or a server "
        "of several pods), unexplained (what the GPU ran beyond what its processes' figures say). Its rate over "
        "the GPU's vgpu.gpu.sm.busy is the share of the GPU's use no bill holds.",
        prometheus_name="vgpu_gpu_sm_unattributed_seconds_total",
        value=lambda row: row[2],
        reads=USE,
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.gpu.accounting.mode",
        "",
        GPU,
        "1 while NVML's accounting mode is on for the GPU (an administrator's nvidia-smi -am 1; the agent never "
        "sets it): a process that lived between two looks is then known from its record, and no period it ran in "
        "is billed whole to the pod beside it. 0 while "
        "it is off; absent where it is not asked (MIG mode, or no per-process figures).",
        prometheus_name="vgpu_gpu_accounting_mode",
        value=lambda g: None if g.device.accounting_mode is None else int(g.device.accounting_mode),
        reads=USE,
    ),
    *(family for families in ENGINE_FAMILIES.values() for family in families if family.subject is GPU),
    Family(
        "vgpu.gpu.energy",
        "J",
        GPU,
        "Energy the GPU used, from NVML's counter (Volta and newer; a driver reload is counted from 0, "
        "not backwards). Absent where NVML has no energy counter.",
        prometheus_name="vgpu_gpu_energy_joules_total",
        value=lambda g: g.energy_joules,
        reads=frozenset({Read.ENERGY}),
        instrument=Instrument.COUNTER,
        semconv=Form("hw.energy", "J", Kind.COUNTER, "Energy consumed by the component."),
    ),
    Family(
        "vgpu.gpu.energy.unattributed",
        "J",
        GPU,
        "The part of the GPU's energy given to no pod: idle power of the shares nobody holds, SM time no "
        "pod ran, and all of it where per-pod SM is unknown.",
        prometheus_name="vgpu_gpu_energy_unattributed_joules_total",
        value=lambda g: g.energy_unattributed_joules,
        reads=SPLIT,
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.gpu.vgpus",
        "{vgpu}",
        GPU,
        "How many vGPUs each physical GPU is presented as: the ratio in force.",
        prometheus_name="vgpu_gpu_vgpus",
        value=lambda g: g.vgpus,
    ),
    Family(
        "vgpu.gpu.memory.unattributed",
        "By",
        GPU,
        "GPU memory of processes that belong to no pod.",
        prometheus_name="vgpu_gpu_memory_unattributed_bytes",
        value=lambda g: g.unattributed_memory,
    ),
    Family(
        "vgpu.gpu.mps.servers",
        "{server}",
        GPU,
        "MPS server processes on the GPU; above 0, NVML gives its clients' SM to the server, so the pod SM "
        "families are left out for this GPU.",
        prometheus_name="vgpu_gpu_mps_servers",
        value=lambda g: g.mps_servers,
    ),
    *(family for family in GPM_FAMILIES if family.subject is GPU),
    Family(
        "vgpu.gpu.gpm.shared.windows",
        "{window}",
        GPU,
        "GPM windows in which several pods (or a process of no pod) used one of the GPU's devices, so that no pod "
        "got that device's GPM figures for the window. Absent without GPM.",
        prometheus_name="vgpu_gpu_gpm_shared_windows_total",
        value=lambda g: g.gpm_shared_windows,
        reads=GPM_READS,
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.gpu.lost",
        "",
        KNOWN,
        "1 while the GPU cannot be read: a sweep read it since the agent started and the last one could not (NVML "
        "answers GPU_IS_LOST, fallen off the bus, or another error for it, lists it no more, or lists no GPU). Its "
        "other series are gone meanwhile; its XID series stay, under the labels it last had, until it is read "
        "again (its counts go on from where they were) or the agent restarts. 0 while it is read; absent while "
        "the driver is paused for an upgrade.",
        prometheus_name="vgpu_gpu_lost",
        value=lambda row: int(row[1]),
    ),
    *HEALTH_FAMILIES.values(),
    Family(
        "vgpu.gpu.health.age",
        "s",
        GPU_HEALTH,
        "How long ago the GPU's health figures were read. They are read every 10 s, each GPU on a thread of "
        "its own, off the scrape's path; a GPU whose driver has not answered for three reads has no health "
        'series until it does (collection_errors_total{stage="device_health"} counts it), and its pods\' '
        "families are served as ever.",
        prometheus_name="vgpu_gpu_health_age_seconds",
        value=lambda row: row.age_s,
        reads=HEALTH_READS,
    ),
    Family(
        "vgpu.gpu.xid.errors",
        "{error}",
        XID,
        "XID errors NVML reported for the GPU since the agent started, by code (xid; 999: a code the driver does "
        f"not know; past {MAX_XID_CODES} codes on one GPU, other): the driver's word that something failed, from "
        "an application fault (13, 31, 43) to a GPU that must be reset (48, 63, 64, 74, 79, 94, 95). A series "
        "appears at its first error, and stays while the GPU cannot be read (vgpu_gpu_lost 1).",
        prometheus_name="vgpu_gpu_xid_errors_total",
        value=lambda row: row[1].count,
        reads=frozenset({Read.XID_EVENTS}),
        instrument=Instrument.COUNTER,
    ),
    Family(
        "vgpu.gpu.xid.last",
        "",
        XID_LAST,
        "The code of the latest XID error NVML reported for the GPU since the agent started, 0 before any "
        "(dcgm-exporter's DCGM_FI_DEV_XID_ERRORS): the code itself, where vgpu_gpu_xid_errors_total counts "
        "each code apart. Stays while the GPU cannot be read (vgpu_gpu_lost 1), as the XID series do.",
        prometheus_name="vgpu_gpu_xid_last",
        value=lambda row: row[1],
        reads=frozenset({Read.XID_EVENTS}),
    ),
)
