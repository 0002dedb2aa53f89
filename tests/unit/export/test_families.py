"""The contract's families, subject by subject, as kube-state-metrics tests its own: rows in,
observations out, with no SDK, no process and no simulated node. Every expected value is
worked out by hand from the rows."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from otel_vgpu.agent_health import AgentHealth, Reader, Refusal, Stage
from otel_vgpu.collect.aggregate import GpuRow, PodRow, Snapshot
from otel_vgpu.collect.lost_gpus import GpuIdentity
from otel_vgpu.collect.xids import XidCount
from otel_vgpu.export.exposition import family_of
from otel_vgpu.export.families import (
    AGENT,
    FAMILIES,
    GPU,
    KNOWN,
    POD,
    POD_COUNTED,
    READERS,
    REFUSALS,
    SEED,
    STAGES,
    SUBJECTS,
    SWEEPS,
    XID,
    Instrument,
    Observed,
    Subject,
    of_subject,
)
from otel_vgpu.export.figure_families import ENGINE_FAMILIES, GPM_FAMILIES, HEALTH_FAMILIES
from otel_vgpu.export.sdk_internals import use_ratio_suffix
from otel_vgpu.gpu.backend import ENGINE_TABLE, ENGINES, USE_FIGURES, Device, ProcessUse
from otel_vgpu.gpu.device_figures import HEALTH_TABLE
from otel_vgpu.gpu.pidns import BlindGpu
from testkit.rows import pod_row

pytestmark = pytest.mark.unit

GIB = 1024**3
MIB = 1024**2
UUID = "GPU-0a"
H100 = Device(0, UUID, "H100", 80 * GIB, 30 * GIB, 0.9, utilization_window=0.75, engines=frozenset({"decoder"}))


def pod(name: str = "trainer", **changes: Any) -> PodRow:
    fields: dict[str, Any] = {
        "namespace": "ml",
        "memory_used": 6 * GIB,
        "memory_allocated": 40 * GIB,
        "vgpu_utilization": 1.0,
        "sm_busy_seconds": 12.5,
        "memory_peak": 7 * GIB,
        "energy_joules": 900.0,
        "engine_utilization": {"decoder": 0.2},
        "engine_busy_seconds": {"decoder": 4.0},
    }
    return pod_row(name, gpu_uuid=UUID, **{"use": ProcessUse(sm=0.5, decoder=0.2), "processes": 2, **fields, **changes})


def observations(subject: Subject[Any], family_name: str, seen: Observed) -> dict[tuple[tuple[str, str], ...], float]:
    """What a collection observes of one family: its value per row, keyed by the row's labels."""
    family = next(f for f in FAMILIES if f.name == family_name)
    assert family.subject is subject, family_name
    found = {}
    for row in subject.rows(seen):
        value = family.value(row)
        if value is not None:
            found[tuple(sorted(subject.attributes(row).items()))] = value
    return found


def labels(**pairs: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(pairs.items()))


TRAINER = labels(namespace="ml", pod="trainer", pod_uid="uid-trainer", gpu_id="0", gpu_uuid=UUID)
ENDED = labels(namespace="ml", pod="done", pod_uid="uid-done", gpu_id="0", gpu_uuid=UUID)


def seen(**snapshot: Any) -> Observed:
    return Observed(Snapshot(taken_at=1.0, ok=True, **snapshot), AgentHealth())


def test_a_pods_gauges_and_counters() -> None:
    observed = seen(pods=(pod(),), ended=(pod("done", use=ProcessUse(), memory_used=0),))
    assert observations(POD, "vgpu.pod.memory.used", observed) == {TRAINER: 6 * GIB}
    assert observations(POD, "vgpu.pod.sm.utilization", observed) == {TRAINER: 0.5}
    assert observations(POD, "vgpu.pod.decoder.utilization", observed) == {TRAINER: 0.2}
    # A pod that ended is in its counters' series, at their final values, and in no gauge's.
    assert observations(POD_COUNTED, "vgpu.pod.sm.busy", observed) == {TRAINER: 12.5, ENDED: 12.5}
    assert observations(POD_COUNTED, "vgpu.pod.energy", observed) == {TRAINER: 900.0, ENDED: 900.0}
    assert observations(POD_COUNTED, "vgpu.pod.decoder.busy", observed) == {TRAINER: 4.0, ENDED: 4.0}


def test_what_nvml_cannot_tell_is_left_out_never_zero() -> None:
    observed = seen(pods=(pod(use=None, vgpu_utilization=None, sm_busy_seconds=None, energy_joules=None),))
    assert observations(POD, "vgpu.pod.sm.utilization", observed) == {}
    assert observations(POD, "vgpu.pod.vgpu.utilization", observed) == {}
    assert observations(POD_COUNTED, "vgpu.pod.sm.busy", observed) == {}
    assert observations(POD, "vgpu.pod.memory.used", observed) == {TRAINER: 6 * GIB}  # memory is known


def test_a_container_and_a_mig_device_add_their_labels() -> None:
    row = pod(container="main", mig_uuid="MIG-1", mig_profile="1g.10gb")
    assert POD.attributes(row) == {
        **dict(TRAINER),
        "container": "main",
        "mig_uuid": "MIG-1",
        "mig_profile": "1g.10gb",
    }


def test_a_gpus_figures() -> None:
    gpu = GpuRow(
        device=H100,
        vgpus=2.0,
        unattributed_memory=GIB,
        sm_busy_seconds=30.0,
        energy_joules=5000.0,
        energy_unattributed_joules=100.0,
        engine_utilization={"decoder": 0.25},
    )
    observed = seen(gpus=(gpu,))
    key = labels(gpu_id="0", gpu_uuid=UUID, gpu_model="H100")
    assert observations(GPU, "vgpu.gpu.memory.total", observed) == {key: 80 * GIB}
    assert observations(GPU, "vgpu.gpu.sm.utilization", observed) == {key: 0.75}  # the window's, not the period's
    assert observations(GPU, "vgpu.gpu.vgpus", observed) == {key: 2.0}
    assert observations(GPU, "vgpu.gpu.memory.unattributed", observed) == {key: GIB}
    assert observations(GPU, "vgpu.gpu.decoder.utilization", observed) == {key: 0.25}
    assert observations(GPU, "vgpu.gpu.encoder.utilization", observed) == {}  # it has no encoder figure
    assert observations(GPU, "vgpu.gpu.energy.unattributed", observed) == {key: 100.0}
    # The reservation where the driver gives it (v2), and no series where it does not, never 0.
    assert observations(GPU, "vgpu.gpu.memory.used", observed) == {key: 30 * GIB}
    assert observations(GPU, "vgpu.gpu.memory.reserved", observed) == {}
    reserving = seen(gpus=(dataclasses.replace(gpu, device=dataclasses.replace(H100, memory_reserved=615 * MIB)),))
    assert observations(GPU, "vgpu.gpu.memory.reserved", reserving) == {key: 615 * MIB}
    # What no listing holds, as the aggregation worked it out; no series where it is unknown.
    assert observations(GPU, "vgpu.gpu.memory.unlisted", observed) == {}
    unlisted = seen(gpus=(dataclasses.replace(gpu, unlisted_memory=14 * MIB),))
    assert observations(GPU, "vgpu.gpu.memory.unlisted", unlisted) == {key: 14 * MIB}


def test_a_lost_gpu_keeps_its_xid_series_under_its_last_labels_and_says_it_is_lost() -> None:
    read = GpuRow(device=H100, vgpus=2.0, unattributed_memory=0)
    gone = GpuIdentity(1, "GPU-1b", "H200")
    xids = (XidCount(0, UUID, "13", 2), XidCount(1, "GPU-1b", "79", 1), XidCount(2, "GPU-never-read", "79", 1))
    observed = Observed(Snapshot(taken_at=1.0, ok=True, gpus=(read,), lost=(gone,)), AgentHealth(), xids=xids)
    first = labels(gpu_id="0", gpu_uuid=UUID, gpu_model="H100")
    lost = labels(gpu_id="1", gpu_uuid="GPU-1b", gpu_model="H200")
    assert observations(KNOWN, "vgpu.gpu.lost", observed) == {first: 0, lost: 1}
    # A count of a GPU no sweep read has no labels to go under: left out.
    assert observations(XID, "vgpu.gpu.xid.errors", observed) == {
        (*first, ("xid", "13")): 2,
        (*lost, ("xid", "79")): 1,
    }
    assert observations(GPU, "vgpu.gpu.memory.total", observed) == {first: 80 * GIB}  # no stale figure of GPU 1
    # While the driver is paused the agent reads no GPU on purpose: none is lost, no XID series.
    paused = Observed(Snapshot(taken_at=1.0, ok=False, paused="label"), AgentHealth(), xids=xids)
    assert observations(KNOWN, "vgpu.gpu.lost", paused) == {}
    assert observations(XID, "vgpu.gpu.xid.errors", paused) == {}


def test_the_original_exporters_families_add_up_per_pod_name_and_gpu() -> None:
    # Two pods of one name in two namespaces are one series, as the original exporter had them.
    rows = (pod(), pod(namespace="other", pod_uid="uid-other", memory_used=2 * GIB, memory_allocated=20 * GIB))
    gpu = GpuRow(device=H100, vgpus=2.0, unattributed_memory=0)
    observed = seen(pods=rows, gpus=(gpu,))
    key = labels(pod="trainer", gpu_id="0")
    assert observations(SEED, "pod_gpu_memory_used", observed) == {key: 8 * 1024}
    assert observations(SEED, "pod_total_gpu_memory", observed) == {key: 60 * 1024}
    assert observations(SEED, "pod_gpu_sm_util", observed) == {key: pytest.approx(200.0)}  # 2 x 50 % x ratio 2


def test_the_agents_own() -> None:
    health = AgentHealth()
    health.failed(Stage.DEVICE, "0:GPU_IS_LOST", "GPU 0 lost")
    health.refused(Refusal.PID_REUSED, "10:1", "refused")
    health.swept(0.004)
    blind = (BlindGpu(0, UUID, GIB, 1.0),)
    observed = Observed(Snapshot(taken_at=1.0, ok=True, blind=blind, paused="nvidia.com/gpu.deploy.driver"), health)
    assert observations(AGENT, "vgpu.agent.blind.gpus", observed) == {(): 1}
    assert observations(AGENT, "vgpu.agent.driver.paused", observed) == {(): 1}
    stages = observations(STAGES, "vgpu.agent.collection.errors", observed)
    assert stages[labels(stage="device")] == 1 and stages[labels(stage="sweep")] == 0
    refusals = observations(REFUSALS, "vgpu.agent.refusals", observed)
    assert refusals[labels(reason="pid_reused")] == 1 and refusals[labels(reason="unknown_pod")] == 0
    assert len(refusals) == len(Refusal)
    assert observations(SWEEPS, "vgpu.agent.collection.duration", observed) == {(): 0.004}
    assert observations(SWEEPS, "vgpu.agent.collection.duration", observed) == {}  # taken once


def test_each_reader_that_has_made_a_pass_has_its_last_one() -> None:
    health = AgentHealth()
    health.passed(Reader.DEVICE_HEALTH, 0.3, True)
    health.passed(Reader.SWEEP, 0.01, True)
    health.passed(Reader.DEVICE_HEALTH, 2.0, False)  # a later pass replaces the one before
    observed = Observed(Snapshot(taken_at=1.0, ok=True), health)
    sweep, of_health = labels(reader="sweep"), labels(reader="health")
    assert observations(READERS, "vgpu.agent.reader.duration", observed) == {sweep: 0.01, of_health: 2.0}
    assert observations(READERS, "vgpu.agent.reader.success", observed) == {sweep: 1, of_health: 0}
    # A reader that has made no pass (one that is off) has no series.
    assert observations(READERS, "vgpu.agent.reader.success", Observed(Snapshot(1.0, True), AgentHealth())) == {}


def test_every_family_belongs_to_a_subject_and_every_histogram_has_buckets() -> None:
    assert {family.subject for family in FAMILIES} <= set(SUBJECTS)
    assert sum(len(of_subject(subject)) for subject in SUBJECTS) == len(FAMILIES)
    for family in FAMILIES:
        assert bool(family.buckets) == (family.instrument is Instrument.HISTOGRAM), family.name


def test_every_figure_of_a_process_is_declared_once() -> None:
    # A field added to ProcessUse without its Engine declaration would silently become four
    # families with no help text and no NVML buffer: it is this failure instead.
    assert set(USE_FIGURES) == {"sm", *ENGINES}
    assert len(ENGINES) == len(set(ENGINES))
    for engine in ENGINE_TABLE:
        families = ENGINE_FAMILIES[engine.name]
        assert all(any(f is published for published in FAMILIES) for f in families), engine.name
        assert {f.subject for f in families} == ({POD, POD_COUNTED, GPU} if engine.per_pod else {GPU}), engine.name
        assert all(engine.meaning in f.description for f in families), engine.name


def test_each_family_declares_the_name_the_exposition_gives_it() -> None:
    # Each family spells out its name in a scrape, so that a search for it finds the family:
    # here that name is made from the OpenTelemetry name, unit and instrument by the rules the
    # exposition applies (the exporter's own functions, with unit 1 as ratio), so the two cannot drift.
    use_ratio_suffix()
    for family in FAMILIES:
        counter = family.instrument is Instrument.COUNTER
        made = family_of(family.name, family.unit, "", "counter" if counter else family.instrument.value).name
        expected = f"{made}_total" if counter else made
        assert family.prometheus_name == expected, f"{family.name}: prometheus_name={expected!r}"
    # A health figure's own name is its family's.
    for figure in HEALTH_TABLE:
        assert figure.prometheus_name == HEALTH_FAMILIES[figure.name].prometheus_name, figure.name
    assert len({family.prometheus_name for family in FAMILIES}) == len(FAMILIES)


# The per-pod families that keep their own names on the push with --otlp-names semconv, and why
# (docs/otlp-semconv.md, "The per-pod families"): a ratio to the pod's share exceeds 1, where
# the conventions' utilizations stay within [0, 1]; a GPM figure is its GPU's, given to the pod
# that had the GPU alone, not the pod's part of it.
OWN_NAMES_ON_THE_SEMCONV_PUSH = {
    "vgpu.pod.vgpu.utilization",
    *(family.name for family in GPM_FAMILIES if family.subject is POD),
}


def test_each_per_pod_family_has_its_semconv_form_or_a_reason_to_keep_its_name() -> None:
    # The semantic conventions name no per-pod GPU metric, so a pod's figure takes one of the
    # agent's vgpu.pod.gpu.* forms (conventions.py), unless it is listed above with its reason:
    # a new per-pod family fails here until one or the other is decided.
    for family in of_subject(POD, POD_COUNTED):
        form = family.semconv
        if family.name in OWN_NAMES_ON_THE_SEMCONV_PUSH:
            assert form is None, family.name
        else:
            assert form is not None and form.name.startswith("vgpu.pod.gpu."), (
                f"{family.name}: give it a vgpu.pod.gpu.* form (`semconv=`) or list it in OWN_NAMES_ON_THE_SEMCONV_PUSH"
            )
