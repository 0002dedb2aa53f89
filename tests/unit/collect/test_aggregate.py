"""Aggregation per GPU and per (pod, GPU), with the ratio."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import pytest

from otel_vgpu.allocation.ratio import Ratios
from otel_vgpu.allocation.shares import Allocation, Grant
from otel_vgpu.collect.aggregate import GpuReading, GpuRow, PodRow, aggregate
from otel_vgpu.export.family import Family
from otel_vgpu.export.pod_families import POD_FAMILIES
from otel_vgpu.gpu.backend import Device, GpuProcess, MigDevice, ProcessUse
from otel_vgpu.pods.cgroups import PodRef
from otel_vgpu.pods.directory import PodMeta

pytestmark = pytest.mark.unit

GIB = 1024**3
MIB = 1024**2
GPU0 = Device(0, "GPU-0", "H100", 80 * GIB, 40 * GIB, 0.7)
GPU1 = Device(1, "GPU-1", "H100", 80 * GIB, 10 * GIB, 0.1)
NAMES = {"uid-a": PodMeta("ml", "a"), "uid-b": PodMeta("web", "b")}


def use(sm_by_pid: Mapping[int, float]) -> dict[int, ProcessUse]:
    """Per-process figures of SM alone."""
    return {pid: ProcessUse(sm=sm) for pid, sm in sm_by_pid.items()}


def grants(
    shares: Mapping[tuple[str, str, str], float], unplaced: Mapping[tuple[str, str], float] | None = None
) -> Allocation:
    """An allocation of plain shares."""
    return Allocation(placed={k: Grant(shares=v) for k, v in shares.items()}, unplaced=unplaced or {})


def run(
    readings: Sequence[GpuReading],
    pods: Mapping[int, PodRef | None],
    lookup: Callable[[str], PodMeta | None],
    allocation: Allocation,
    ratio: float | Ratios,
    by_container: bool = False,
) -> tuple[tuple[GpuRow, ...], tuple[PodRow, ...]]:
    ratios = ratio if isinstance(ratio, Ratios) else Ratios(ratio)
    return aggregate(readings, pods, lookup, allocation, ratios, by_container)


def by_key(rows: tuple[PodRow, ...]) -> dict[tuple[str, str, int], PodRow]:
    return {(r.namespace, r.pod, r.gpu_index): r for r in rows}


def test_pods_on_two_gpus_with_unattributed_memory() -> None:
    readings = [
        GpuReading(
            GPU0,
            [GpuProcess(1, 10 * GIB), GpuProcess(2, 5 * GIB), GpuProcess(3, 2 * GIB), GpuProcess(9, GIB)],
            use({1: 0.5, 2: 0.1}),
        ),
        GpuReading(GPU1, [GpuProcess(4, 3 * GIB)], use({4: 0.2})),
    ]
    pods = {1: PodRef("uid-a", "c1"), 2: PodRef("uid-a", "c2"), 3: PodRef("uid-b", None), 4: PodRef("uid-a", "c1")}
    gpus, rows = run(readings, pods, NAMES.get, grants({("uid-a", "", "GPU-0"): 2}), 4.0)

    got = by_key(rows)
    a0 = got[("ml", "a", 0)]
    assert (a0.memory_used, a0.processes, a0.shares) == (15 * GIB, 2, 2)
    assert a0.memory_allocated == 2 * 80 * GIB / 4
    assert a0.sm_utilization is not None and abs(a0.sm_utilization - 0.6) < 1e-9
    assert a0.vgpu_utilization is not None and abs(a0.vgpu_utilization - 0.6 * 4 / 2) < 1e-9
    b0 = got[("web", "b", 0)]
    # no allocation known: one share; no sample: idle
    assert (b0.memory_used, b0.shares, b0.memory_allocated, b0.sm_utilization) == (2 * GIB, 1, 20 * GIB, 0.0)
    a1 = got[("ml", "a", 1)]
    assert (a1.memory_used, a1.shares, a1.gpu_uuid) == (3 * GIB, 1, "GPU-1")
    assert len(rows) == 3

    assert [g.unattributed_memory for g in gpus] == [GIB, 0]
    assert [g.vgpus for g in gpus] == [4.0, 4.0]
    # every byte of every process is either a pod's or unattributed
    for reading, gpu in zip(readings, gpus, strict=True):
        pod_bytes = sum(r.memory_used for r in rows if r.gpu_index == gpu.index)
        assert pod_bytes + (gpu.unattributed_memory or 0) == sum(p.used_memory or 0 for p in reading.processes or ())


# An H200 with driver 580 and two processes: NVML's v1 used 5761.4375 MiB, v2 reserved 615.0625 MiB,
# the two listed at 5132 MiB together; 14.375 MiB of the used in no listing.
H200_RESERVED = int(615.0625 * MIB)
H200 = Device(0, "GPU-0", "H200", 141 * GIB, int(5761.4375 * MIB), 0.5, memory_reserved=H200_RESERVED)
TWO_CONTEXTS = [GpuProcess(1, 3590 * MIB), GpuProcess(2, 1542 * MIB)]


def unlisted(device: Device, processes: Sequence[GpuProcess] | None, pods: Mapping[int, PodRef | None]) -> int | None:
    gpus, _ = run([GpuReading(device, processes, {})], pods, NAMES.get, Allocation(), 2.0)
    return gpus[0].unlisted_memory


def test_unlisted_memory_is_the_used_less_the_reserved_less_every_listed_process() -> None:
    # The pods' processes and those of no pod alike: it is what no listing holds, not what no pod does.
    assert unlisted(H200, TWO_CONTEXTS, {1: PodRef("uid-a", None)}) == int(14.375 * MIB)
    assert unlisted(H200, TWO_CONTEXTS, {}) == int(14.375 * MIB)
    gpus, rows = run([GpuReading(H200, TWO_CONTEXTS, {})], {1: PodRef("uid-a", None)}, NAMES.get, Allocation(), 2.0)
    gpu = gpus[0]
    assert gpu.unattributed_memory is not None and gpu.unlisted_memory is not None
    parts = sum(r.memory_used for r in rows) + gpu.unattributed_memory + H200_RESERVED
    assert gpu.device.memory_used == parts + gpu.unlisted_memory
    # An idle GPU's used is its reservation: nothing unlisted, 0 rather than no series.
    assert unlisted(dataclasses.replace(H200, memory_used=H200_RESERVED), [], {}) == 0


def test_unlisted_memory_is_never_below_zero() -> None:
    # A process that allocated between the used's read and the listing's: more listed than the used took in.
    assert unlisted(H200, [*TWO_CONTEXTS, GpuProcess(3, GIB)], {}) == 0


@pytest.mark.parametrize(
    ("device", "processes"),
    [
        (dataclasses.replace(H200, memory_reserved=None), TWO_CONTEXTS),  # a driver without v2
        (H200, None),  # the listing failed
        (H200, [GpuProcess(1, 3590 * MIB), GpuProcess(2, None)]),  # a process's memory NVML cannot give
        (
            dataclasses.replace(H200, migs=(MigDevice("MIG-1", "1g.18gb", 18 * GIB, 4 * GIB),)),
            [dataclasses.replace(p, mig_uuid="MIG-1") for p in TWO_CONTEXTS],
        ),  # MIG mode
    ],
    ids=["no-v2", "no-listing", "memory-unknown", "mig"],
)
def test_unlisted_memory_is_unknown_where_a_part_of_it_is(
    device: Device, processes: Sequence[GpuProcess] | None
) -> None:
    assert unlisted(device, processes, {}) is None


def test_unresolved_pod_keeps_uid_and_empty_namespace() -> None:
    _, rows = run(
        [GpuReading(GPU0, [GpuProcess(1, GIB)], {})], {1: PodRef("uid-x", None)}, NAMES.get, Allocation(), 2.0
    )
    assert [(r.namespace, r.pod) for r in rows] == [("", "uid-x")]


def test_idle_allocation_appears_with_zero_use() -> None:
    _, rows = run(
        [GpuReading(GPU0, [], {})],
        {},
        NAMES.get,
        grants({("uid-b", "", "GPU-0"): 1, ("uid-a", "", "GPU-9"): 1}),
        2.0,
    )
    assert [(r.pod, r.memory_used, r.memory_allocated, r.sm_utilization, r.processes) for r in rows] == [
        ("b", 0, 40 * GIB, 0.0, 0)
    ]


def test_zero_shares_are_no_allocation() -> None:
    _, rows = run([GpuReading(GPU0, [], {})], {}, NAMES.get, grants({("uid-b", "", "GPU-0"): 0}), 2.0)
    assert rows == ()


def test_memory_unavailable_counts_process_but_no_bytes() -> None:
    _, rows = run(
        [GpuReading(GPU0, [GpuProcess(1, None), GpuProcess(2, GIB)], {})],
        {1: PodRef("uid-a", None), 2: PodRef("uid-a", None)},
        NAMES.get,
        Allocation(),
        2.0,
    )
    assert [(r.memory_used, r.processes) for r in rows] == [(GIB, 2)]


def test_failed_process_listing_reports_gpu_but_no_pods() -> None:
    gpus, rows = run([GpuReading(GPU0, None, None)], {}, NAMES.get, grants({("uid-a", "", "GPU-0"): 1}), 2.0)
    assert rows == ()
    assert gpus[0].unattributed_memory is None and gpus[0].device.memory_total == 80 * GIB


def test_failed_utilization_leaves_sm_unknown_not_zero() -> None:
    _, rows = run(
        [GpuReading(GPU0, [GpuProcess(1, GIB)], None)], {1: PodRef("uid-a", None)}, NAMES.get, Allocation(), 2.0
    )
    assert (rows[0].memory_used, rows[0].sm_utilization, rows[0].vgpu_utilization) == (GIB, None, None)


def test_two_uids_with_one_name_are_two_series_told_apart_by_pod_uid() -> None:
    # a StatefulSet pod and its terminating predecessor
    names = {"old": PodMeta("ml", "db-0", uid="old"), "new": PodMeta("ml", "db-0", uid="new")}
    _, rows = run(
        [GpuReading(GPU0, [GpuProcess(1, GIB), GpuProcess(2, 2 * GIB)], use({1: 0.2, 2: 0.3}))],
        {1: PodRef("old", None), 2: PodRef("new", None)},
        names.get,
        Allocation(),
        2.0,
    )
    assert {(r.pod, r.pod_uid, r.memory_used) for r in rows} == {("db-0", "old", GIB), ("db-0", "new", 2 * GIB)}


def test_a_static_pod_is_labelled_with_its_mirror_pods_uid() -> None:
    names = {"0123abcd" * 4: PodMeta("kube-system", "probe-node-1", uid="7d1c1aa0-0000-4000-8000-000000000001")}
    _, rows = run(
        [GpuReading(GPU0, [GpuProcess(1, GIB)], {})], {1: PodRef("0123abcd" * 4, None)}, names.get, Allocation(), 2.0
    )
    assert [(r.pod, r.pod_uid) for r in rows] == [("probe-node-1", "7d1c1aa0-0000-4000-8000-000000000001")]


def test_sm_of_a_pod_is_capped_at_the_whole_gpu() -> None:
    _, rows = run(
        [GpuReading(GPU0, [GpuProcess(1, 0), GpuProcess(2, 0)], use({1: 0.7, 2: 0.6}))],
        {1: PodRef("uid-a", None), 2: PodRef("uid-a", None)},
        NAMES.get,
        Allocation(),
        2.0,
    )
    assert rows[0].sm_utilization == 1.0


def test_unplaced_shares_spread_over_the_gpus_the_pod_runs_on() -> None:
    readings = [
        GpuReading(GPU0, [GpuProcess(1, GIB)], {}),
        GpuReading(GPU1, [GpuProcess(2, GIB)], {}),
    ]
    pods = {1: PodRef("uid-a", "c1"), 2: PodRef("uid-a", "c1")}
    allocation = Allocation(unplaced={("uid-a", "trainer"): 2, ("uid-a", "sidecar"): 2, ("uid-b", "main"): 1})
    _, rows = run(readings, pods, NAMES.get, allocation, 2.0)
    # 4 GPUs in the limits, on 2 GPUs: 2 each; uid-b runs nowhere, so no row
    assert {(r.pod, r.gpu_index): r.shares for r in rows} == {("a", 0): 2.0, ("a", 1): 2.0}
    assert rows[0].memory_allocated == 2 * 80 * GIB / 2


def test_placed_shares_win_over_unplaced() -> None:
    allocation = grants({("uid-a", "", "GPU-0"): 3}, unplaced={("uid-a", ""): 8})
    _, rows = run([GpuReading(GPU0, [GpuProcess(1, GIB)], {})], {1: PodRef("uid-a", None)}, NAMES.get, allocation, 2.0)
    assert rows[0].shares == 3


def test_rows_per_container_with_names_from_the_directory() -> None:
    names = {"uid-a": PodMeta("ml", "a", containers={"c1": "trainer", "c2": "sidecar"})}
    readings = [GpuReading(GPU0, [GpuProcess(1, GIB), GpuProcess(2, 2 * GIB), GpuProcess(3, 4 * GIB)], use({1: 0.5}))]
    pods = {1: PodRef("uid-a", "c1"), 2: PodRef("uid-a", "c2"), 3: PodRef("uid-a", "c9")}
    allocation = grants({("uid-a", "trainer", "GPU-0"): 2, ("uid-a", "idle", "GPU-0"): 1})
    _, rows = run(readings, pods, names.get, allocation, 4.0, by_container=True)
    got = {r.container: (r.memory_used, r.shares, r.sm_utilization) for r in rows}
    assert got == {
        "trainer": (GIB, 2, 0.5),
        "sidecar": (2 * GIB, 1, 0.0),  # no allocation known: one share
        "c9": (4 * GIB, 1, 0.0),  # not in the directory: its ID
        "idle": (0, 1, 0.0),
    }
    _, pod_rows = run(readings, pods, names.get, allocation, 4.0)
    assert [(r.container, r.memory_used, r.shares) for r in pod_rows] == [(None, 7 * GIB, 3)]


def test_a_pod_whose_allocation_is_known_holds_no_share_where_it_was_given_none() -> None:
    # uid-a was given GPU 0 and runs on GPU 1 too; uid-b was given nothing. Both
    # were listed by the kubelet (answered); uid-c was not: its allocation is unknown.
    readings = [
        GpuReading(GPU0, [GpuProcess(1, 4 * GIB)], use({1: 0.4})),
        GpuReading(
            GPU1, [GpuProcess(2, GIB), GpuProcess(3, 2 * GIB), GpuProcess(4, GIB)], use({2: 0.1, 3: 0.2, 4: 0.3})
        ),
    ]
    pods = {1: PodRef("uid-a", None), 2: PodRef("uid-a", None), 3: PodRef("uid-b", None), 4: PodRef("uid-c", None)}
    names = {**NAMES, "uid-c": PodMeta("web", "c")}
    known = Allocation(placed={("uid-a", "", "GPU-0"): Grant(shares=1.0)}, answered=frozenset({"uid-a", "uid-b"}))
    _, rows = run(readings, pods, names.get, known, 2.0)
    got = {(r.pod, r.gpu_index): (r.shares, r.memory_allocated, r.vgpu_utilization) for r in rows}
    assert got[("a", 0)] == (1.0, 40 * GIB, 0.4 * 2)
    # use without an allocation: no share, nothing allocated, no SM-against-share figure
    assert got[("a", 1)] == (0.0, 0, None)
    assert got[("b", 1)] == (0.0, 0, None)
    # its SM and memory are still its own
    assert {(r.pod, r.gpu_index): r.memory_used for r in rows}[("b", 1)] == 2 * GIB
    # the pod nobody answered for keeps the rule for unknown allocations: one share
    assert got[("c", 1)] == (1.0, 40 * GIB, 0.3 * 2)


def test_before_a_gpu_s_first_settled_period_its_pods_sm_is_not_shown() -> None:
    # The ledger has settled no period of GPU 0 yet (they wait for samples NVML shows late;
    # window_seconds 0, no window figure): what its pods ran is not known, and their SM gauges
    # have no series, where they read 0 beside the GPU's own figure (0.7). Their SM counters
    # still begin, at 0 (collect/usage.py counts `sm_utilization`). Once a period has settled,
    # the pods' figures are shown, 0 included.
    def rows(window_utilization: float | None) -> dict[tuple[str, str, int], PodRow]:
        reading = GpuReading(
            GPU0,
            [GpuProcess(1, 10 * GIB), GpuProcess(2, 5 * GIB)],
            {},
            window_seconds=0.0,
            window_utilization=window_utilization,
        )
        pods = {1: PodRef("uid-a", "c1"), 2: PodRef("uid-b", "c1")}
        shares = {("uid-a", "", "GPU-0"): 1, ("uid-b", "", "GPU-0"): 1}
        return by_key(run([reading], pods, NAMES.get, grants(shares), 2.0)[1])

    waiting = rows(None)
    assert [(r.sm_utilization, r.sm_shown, r.vgpu_utilization) for r in waiting.values()] == [(0.0, None, None)] * 2
    shown = rows(0.0)
    assert [(r.sm_utilization, r.sm_shown, r.vgpu_utilization) for r in shown.values()] == [(0.0, 0.0, 0.0)] * 2
    # The gauge families read the shown figure; the counters' source stays the figure itself.
    sm_gauge = cast(
        Family[PodRow], next(f for f in POD_FAMILIES if f.prometheus_name == "vgpu_pod_sm_utilization_ratio")
    )
    assert [sm_gauge.value(r) for r in waiting.values()] == [None, None]
    assert [sm_gauge.value(r) for r in shown.values()] == [0.0, 0.0]
