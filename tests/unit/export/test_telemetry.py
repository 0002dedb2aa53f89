"""The instruments as Prometheus sees them, in process."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import HistogramDataPoint

from otel_vgpu.agent_health import AgentHealth, Reader, Refusal, Stage
from otel_vgpu.collect.device_health import DeviceHealth
from otel_vgpu.collect.estimator import SLACK
from otel_vgpu.collect.reading import Read
from otel_vgpu.collect.xids import XidCounts
from otel_vgpu.export import telemetry as telemetry_module
from otel_vgpu.export.direct import Observations
from otel_vgpu.export.exposition import TEXT
from otel_vgpu.export.families import (
    AGENT,
    FAMILIES,
    GPU,
    GPU_HEALTH,
    POD,
    POD_COUNTED,
    READERS,
    REFUSALS,
    SEED,
    STAGES,
    SUBJECTS,
    SWEEPS,
    XID,
    XID_LAST,
    Feature,
    Instrument,
    Observed,
    Subject,
    of_subject,
)
from otel_vgpu.export.figure_families import ENGINE_FAMILIES, GPM_FAMILIES_OF, HEALTH_FAMILIES
from otel_vgpu.export.otlp import OtlpSettings
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.gpu.backend import XidEvent
from otel_vgpu.gpu.device_figures import GPM_MIN_INTERVAL_S, GPM_TABLE, HEALTH_TABLE
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario import Scenario
from testkit.agent import wait_until
from testkit.clock import Clock
from testkit.kept_exporter import KeptExporter
from testkit.promtext import Exposition, parse

from ...conftest import make_sampler, wide_scenario

pytestmark = pytest.mark.unit

POD_FAMILIES = [family.prometheus_name for family in of_subject(POD, POD_COUNTED)]
GPU_FAMILIES = [family.prometheus_name for family in of_subject(GPU)]
# What the Python client adds beside the contract's families.
CLIENT_FAMILIES = re.compile(r"^(process_|python_|target_info$)")


def scrape(telemetry: Telemetry) -> Exposition:
    return parse(telemetry.render(TEXT).decode())


@pytest.fixture
def telemetry(node: SimulatedNode, ratio_file: Path) -> Iterator[Telemetry]:
    health = AgentHealth()
    sampler = make_sampler(node, ratio_file, health=health)
    telemetry = Telemetry(
        sampler,
        health,
        min_interval=0.0,
        node_name="node-a",
        seed_metrics=True,
        devices=DeviceHealth(sampler, health),
        xids=XidCounts(),
    )
    yield telemetry
    telemetry.shutdown()


def test_contract_families_labels_and_descriptions(telemetry: Telemetry) -> None:
    scrape(telemetry)  # the first sweep opens the engine and GPM windows, the second closes them
    time.sleep(GPM_MIN_INTERVAL_S)  # GPM's two samples are at least this far apart (nvml.h)
    exposition = scrape(telemetry)
    # Every family of the table, and nothing else, under the names the table gives.
    published = {name for name in exposition.help if not CLIENT_FAMILIES.match(name)}
    # Absent without their source: the OTLP push, the kubelet (tests/system/test_kubernetes.py has that one),
    # an XID error, NVLink; and the pods' GPM figures, since every GPU here is shared
    # (tests/unit/collect/test_device_health.py has them all).
    sourced = {"vgpu.agent.export.failures", "vgpu.agent.pod_resources.up", "vgpu.gpu.xid.errors"}
    sourced |= {f.name for figure in GPM_TABLE if figure.nvlink for f in GPM_FAMILIES_OF[figure.name]}
    sourced |= {f.name for f in FAMILIES if f.subject is POD and Read.GPM in f.reads}
    # The health figures of a video engine, which no H100 has (tests/unit/collect/test_device_health.py reads
    # them of an L4).
    sourced |= {HEALTH_FAMILIES[figure.name].name for figure in HEALTH_TABLE if figure.engine}
    # And the OTLP push's under the semantic conventions alone, which no scrape carries
    # (tests/system/test_otlp_semconv.py).
    sourced |= {f.name for f in FAMILIES if f.needs is Feature.SEMCONV}
    contract = {family.prometheus_name for family in FAMILIES if family.name not in sourced}
    assert {name.removesuffix("_total") for name in published} == {n.removesuffix("_total") for n in contract}
    for family in (*of_subject(POD, POD_COUNTED), *of_subject(GPU), *of_subject(GPU_HEALTH), *of_subject(SEED)):
        if family.name in sourced:
            continue
        series = exposition.series(family.prometheus_name)
        assert series, family.name
        for labels in series:
            assert {k for k, _ in labels} == set(family.labels), family.name
    assert len(exposition.series(GPU_FAMILIES[0])) == 2
    # GPU 0 has no encoder (the scenario's lacks): no encoder family for it or its pods.
    assert set(exposition.by("vgpu_gpu_encoder_utilization_ratio", "gpu_id")) == {("1",)}
    assert {gpu for _, gpu in exposition.by("vgpu_pod_encoder_busy_seconds_total", "pod", "gpu_id")} == {"1"}
    assert {gpu for _, gpu in exposition.by("vgpu_pod_decoder_busy_seconds_total", "pod", "gpu_id")} == {"0", "1"}
    for name, text in exposition.help.items():
        assert text, f"{name} has no description"
    assert exposition.types["vgpu_agent_collection_duration_seconds"] == "histogram"
    assert exposition.by("vgpu_agent_collection_errors_total", "stage")[("device",)] == 0
    assert exposition.by("vgpu_agent_driver_paused") == {(): 0}
    assert "process_resident_memory_bytes" in exposition.values
    target = dict(next(iter(exposition.series("target_info"))))
    assert target["service_name"] == "otel-vgpu" and target["k8s_node_name"] == "node-a"
    assert target["service_version"] and target["host_name"]


def test_one_sweep_per_scrape_even_with_min_interval_zero(telemetry: Telemetry) -> None:
    sampler = telemetry.scope._sampler
    before = sampler.sweeps
    scrape(telemetry)
    scrape(telemetry)
    assert sampler.sweeps - before == 2


def test_seed_families(telemetry: Telemetry) -> None:
    # The SM figures wait for a settled window: at the recorded cadence, until each process
    # sampled in the last 10 s has a newer sample (collect/settling.py `awaited`).
    exposition = wait_until(
        lambda: (e := scrape(telemetry)).by("pod_gpu_sm_util", "pod", "gpu_id").get(("trainer", "0")) and e,
        what="the trainer's SM figure",
    )
    used = exposition.by("pod_gpu_memory_used", "pod", "gpu_id")
    assert used[("trainer", "0")] == 12 * 1024  # MiB
    sm = exposition.by("pod_gpu_sm_util", "pod", "gpu_id")
    # Percent x ratio, to whole percents; alone with figures on GPU 0 while the probe's 0.02 is
    # seldom drawn, the trainer may take `SLACK` over its own (docs/chargeback.md).
    assert (0.6 - 0.01) * 100 * 2 <= sm[("trainer", "0")] <= (0.6 * (1 + SLACK) + 0.01) * 100 * 2
    total = exposition.by("pod_total_gpu_memory", "pod", "gpu_id")
    assert total[("trainer", "0")] == 2 * 80 * 1024 / 2  # 2 shares of 80 GiB at ratio 2, MiB
    for labels in exposition.series("pod_gpu_memory_used"):
        assert {k for k, _ in labels} == {"pod", "gpu_id"}


def test_eight_gpus_and_four_hundred_pods_lose_nothing(tmp_path: Path, ratio_file: Path) -> None:
    node = SimulatedNode(wide_scenario(8, 400), tmp_path / "proc")
    telemetry = Telemetry(
        make_sampler(node, ratio_file, health=AgentHealth()), AgentHealth(), 1.0, "n", seed_metrics=False
    )
    exposition = scrape(telemetry)
    # No process uses an engine beside SM: no pod has those families (tests/unit/collect/test_engines.py).
    engines = {f.prometheus_name for families in ENGINE_FAMILIES.values() for f in families if f.subject is not GPU}
    # Nor GPM's, which a pod has only where it has its GPU alone (tests/unit/collect/test_device_health.py).
    gpm = {f.prometheus_name for f in of_subject(POD) if Read.GPM in f.reads}
    # Nor the SM gauges at a first sweep: no period of a GPU has settled yet (a pod would read 0
    # beside a busy GPU), while the SM counters are there, at 0
    # (tests/unit/collect/test_aggregate.py, test_before_a_gpu_s_first_settled_period_its_pods_sm_is_not_shown).
    waiting = {"vgpu_pod_sm_utilization_ratio", "vgpu_pod_vgpu_utilization_ratio"}
    for name in waiting:
        assert not exposition.series(name), name
    assert len(exposition.series("vgpu_pod_sm_busy_seconds_total")) == 3200
    for name in POD_FAMILIES:
        if name in engines or name in gpm or name in waiting:
            continue
        series = exposition.series(name)
        assert len(series) == 3200, name
        assert not any(key == "otel_metric_overflow" for labels in series for key, _ in labels)
    telemetry.shutdown()
    node.close()


def test_ended_pod_disappears_and_churn_never_overflows(
    tmp_path: Path, ratio_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With a limit of 40 points per instrument, 150 pods passing through one
    # at a time must each still get their own series.
    monkeypatch.setattr(telemetry_module, "CARDINALITY_LIMIT", 40)
    base = wide_scenario(1, 3)
    node = SimulatedNode(base, tmp_path / "proc")
    telemetry = Telemetry(make_sampler(node, ratio_file), AgentHealth(), 0.0, "n", seed_metrics=False)
    for step in range(150):
        pod = dataclasses.replace(base.pods[0], name=f"job-{step}", uid=f"{step:08x}-1111-4000-8000-000000000000")
        node.scenario = dataclasses.replace(base, pods=(base.pods[1], pod))
        exposition = scrape(telemetry)
        pods = {labels for labels, _ in exposition.by("vgpu_pod_memory_used_bytes", "pod").items()}
        # the directory knows only the first scenario's pods: a job's UID stands for its name
        assert pods == {(base.pods[1].name,), (pod.uid,)}, step
    # Nor does the scrape keep the ended pods (export/direct.py holds the attribute sets as the
    # SDK's storage would): each gauge holds the attribute sets of the two live pods (times the
    # GPU's one), each counter those and the job that ended since the last scrape, at its final
    # value until that scrape has read it, no more.
    held = {
        family.name: telemetry._direct.held(family.name)
        for family in of_subject(POD, POD_COUNTED)
        if family.needs is None
    }
    counters = {family.name for family in FAMILIES if family.instrument is Instrument.COUNTER}
    assert held and max(count for name, count in held.items() if name not in counters) <= 2, held
    assert max(count for name, count in held.items() if name in counters) <= 3, held
    assert "vgpu.pod.sm.busy" in held
    telemetry.shutdown()
    node.close()


def test_the_push_forgets_ended_pods_as_the_scrape_does(
    tmp_path: Path, ratio_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The scrape holds its own attribute sets (export/direct.py); the push still relies on the
    # SDK's storage being pruned of the pods that ended, else a churning node's push would grow
    # with every pod it ever saw, and past the cardinality limit merge new pods into overflow.
    monkeypatch.setattr(telemetry_module, "CARDINALITY_LIMIT", 40)
    kept = KeptExporter()
    monkeypatch.setattr(telemetry_module, "make_exporter", lambda settings: kept)
    base = wide_scenario(1, 3)
    node = SimulatedNode(base, tmp_path / "proc")
    telemetry = Telemetry(
        make_sampler(node, ratio_file),
        AgentHealth(),
        0.0,
        "n",
        seed_metrics=False,
        otlp=OtlpSettings("http://collector:4317", "grpc", 3600.0, 1.0),
    )
    assert telemetry.pusher is not None
    telemetry.start()  # the push's thread, which waits out its hour: the test pushes
    try:
        for step in range(60):
            pod = dataclasses.replace(base.pods[0], name=f"job-{step}", uid=f"{step:08x}-1111-4000-8000-000000000000")
            node.scenario = dataclasses.replace(base, pods=(base.pods[1], pod))
            telemetry.pusher.push()
            pushed = {
                (point.attributes or {}).get("pod_uid")
                for resource in kept.batches[-1].resource_metrics
                for scope in resource.scope_metrics
                for metric in scope.metrics
                if metric.name == "vgpu.pod.memory.used"
                for point in metric.data.data_points
            }
            # The live pods only: the one that stays and this step's job, never an earlier job.
            assert pushed == {base.pods[1].uid, pod.uid}, (step, pushed)
    finally:
        telemetry.shutdown()
        node.close()


def test_pruning_that_cannot_work_warns_once_for_every_reader(
    telemetry: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    # A reader the SDK does not know stands in for an SDK whose internals moved.
    stranger = object()
    with caplog.at_level(logging.WARNING, logger="otel_vgpu"):
        telemetry._prune(stranger)
        telemetry._prune(stranger)
        telemetry._prune(telemetry.reader)
        scrape(telemetry)
    assert sum("cannot prune" in r.getMessage() for r in caplog.records) == 1


def value(observed: Mapping[str, Observations], name: str, **labels: str) -> float:
    """The one observation of `name` with these labels (and maybe others)."""
    (point,) = [v for attributes, v in observed[name] if labels.items() <= attributes.items()]
    return float(point)


def test_a_push_after_a_scrape_of_one_snapshot_shares_the_snapshots_rows_and_reads_the_rest_anew(
    steady: Scenario, tmp_path: Path, ratio_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each subject's rows counted as they are built, under its own per_snapshot.
    built: dict[str, int] = {}

    def counted(subject: Subject[Any]) -> Subject[Any]:
        def rows(seen: Observed) -> Any:
            built[subject.name] = built.get(subject.name, 0) + 1
            return subject.rows(seen)

        return dataclasses.replace(subject, rows=rows)

    subjects = {subject.name: counted(subject) for subject in SUBJECTS}
    families = [dataclasses.replace(family, subject=subjects[family.subject.name]) for family in FAMILIES]
    kept = KeptExporter()
    monkeypatch.setattr(telemetry_module, "make_exporter", lambda settings: kept)
    clock = Clock()
    node = SimulatedNode(steady, tmp_path / "proc", clock.monotonic, clock.wall_us)
    health = AgentHealth()
    sampler = make_sampler(node, ratio_file, health=health, clock=clock.monotonic)
    xids = XidCounts()
    gpu0 = steady.gpus[0].uuid
    xids.add([XidEvent(0, gpu0, 43)])
    telemetry = Telemetry(
        sampler,
        health,
        min_interval=60.0,  # one snapshot serves the scrape and the push
        node_name="n",
        seed_metrics=True,
        otlp=OtlpSettings("http://collector:4317", "grpc", 3600.0, 1.0),
        families=families,
        devices=DeviceHealth(sampler, health, clock.monotonic),
        xids=xids,
    )
    assert telemetry.pusher is not None
    telemetry.start()  # the push's thread, which waits out its interval: the test pushes
    try:
        scraped = scrape(telemetry)
        at_scrape = dict(telemetry.scope.observed())
        at_scrape_built = dict(built)
        # Between them, what each collection reads beside the snapshot moves: the agent's
        # health (its failures, refusals, a sweep's duration, the kubelet's call), the GPUs'
        # health figures (older by a second) and the XID counts.
        health.failed(Stage.KUBERNETES, "Timeout", "Kubernetes API failed")
        health.refused(Refusal.PID_REUSED, "4242:1", "refused")
        health.swept(0.25)
        health.passed(Reader.POD_RESOURCES, 0.5, False)
        clock.t += 1.0
        xids.add([XidEvent(0, gpu0, 79)])
        telemetry.pusher.push()
        at_push = telemetry.scope.observed()
        (batch,) = kept.batches
    finally:
        telemetry.shutdown()
        node.close()
    assert sampler.sweeps == 1
    # What the test moved reaches these subjects, and no other.
    read_anew = {subject.name for subject in (GPU_HEALTH, XID, XID_LAST, AGENT, STAGES, REFUSALS, SWEEPS, READERS)}
    # The others' rows follow from the snapshot alone: built once, at the scrape, and the push
    # reads those very rows, and observes what the scrape did.
    assert {name: built[name] for name in built.keys() - read_anew} == dict.fromkeys(
        {subject.name for subject in SUBJECTS} - read_anew, 1
    )
    for family in FAMILIES:
        # (The semantic-conventions push's own families are not made for this push's names.)
        if family.subject.name not in read_anew and family.needs is not Feature.SEMCONV:
            assert at_push[family.name] == at_scrape[family.name], family.name
    # The rest are built anew at the push, which has what moved since the scrape.
    assert all(built[name] > at_scrape_built[name] for name in read_anew), (built, at_scrape_built)
    assert {attributes["xid"] for attributes, _ in at_scrape["vgpu.gpu.xid.errors"]} == {"43"}
    assert value(at_push, "vgpu.gpu.xid.errors", gpu_id="0", xid="79") == 1
    assert value(at_scrape, "vgpu.gpu.xid.last", gpu_id="0") == 43
    assert value(at_push, "vgpu.gpu.xid.last", gpu_id="0") == 79
    assert value(at_push, "vgpu.gpu.health.age", gpu_id="0") == value(at_scrape, "vgpu.gpu.health.age", gpu_id="0") + 1
    kubernetes = value(at_scrape, "vgpu.agent.collection.errors", stage="kubernetes")
    assert value(at_push, "vgpu.agent.collection.errors", stage="kubernetes") == kubernetes + 1
    reused = value(at_scrape, "vgpu.agent.refusals", reason="pid_reused")
    assert value(at_push, "vgpu.agent.refusals", reason="pid_reused") == reused + 1
    assert at_scrape["vgpu.agent.pod_resources.up"] == [] and value(at_push, "vgpu.agent.pod_resources.up") == 0
    scraped_readers = {attributes["reader"] for attributes, _ in at_scrape["vgpu.agent.reader.success"]}
    assert "pod_resources" not in scraped_readers
    assert value(at_push, "vgpu.agent.reader.success", reader="pod_resources") == 0
    assert value(at_push, "vgpu.agent.reader.duration", reader="pod_resources") == 0.5
    # Each sweep in the histogram once: the scrape's sweep and the one said since, no more.
    assert scraped.by("vgpu_agent_collection_duration_seconds_count") == {(): 1}
    (histogram,) = [
        metric
        for resource in batch.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "vgpu.agent.collection.duration"
    ]
    (point,) = histogram.data.data_points
    assert isinstance(point, HistogramDataPoint)
    assert point.count == 2 and point.sum == pytest.approx(0.25)
