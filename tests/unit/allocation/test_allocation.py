"""What each container was given: device names, the kubelet's answers, allocator annotations, pod limits."""

from __future__ import annotations

import re

import pytest

from otel_vgpu.agent_health import Refusal
from otel_vgpu.allocation.devices import DeviceMap, dra_profile
from otel_vgpu.allocation.hami import MIB, HamiAnnotationError, parse_hami
from otel_vgpu.allocation.ratio import resolve_ratios
from otel_vgpu.allocation.shares import (
    ClaimAssignment,
    DeviceAssignment,
    Grant,
    KubeletView,
    from_kubelet,
    from_limits,
)
from otel_vgpu.config import ConfigError, parse_config
from otel_vgpu.gpu.backend import Device, MigDevice
from otel_vgpu.pods.directory import PodMeta, StatedGrant

pytestmark = pytest.mark.unit

GIB = 1024**3
U0 = "GPU-5f1c7a3e-2b9d-4e61-9c0a-7d3e8f21b604"
U1 = "GPU-a83d02c4-6e17-4b5f-8d92-1c4f6b7e9a30"
M0 = "MIG-0b2c3a4d-1111-2222-3333-444455556666"
M1 = "MIG-0b2c3a4d-1111-2222-3333-777788889999"
# GPU 0 is /dev/nvidia3 and GPU 1, in MIG mode, /dev/nvidia1: minor numbers need not follow NVML indexes.
MIGS = (
    MigDevice(M0, "1g.18gb", 18 * GIB, 0, gpu_instance_id=9, profile_id=19, placement_start=4),
    MigDevice(M1, "3g.71gb", 71 * GIB, 0, gpu_instance_id=2, profile_id=9, placement_start=0),
)
GPUS = [
    Device(0, U0, "H200", 141 * GIB, 0, 0.0, minor_number=3),
    Device(1, U1, "H200", 141 * GIB, 0, None, minor_number=1, migs=MIGS),
]


@pytest.mark.parametrize(
    ("device_id", "device"),
    [
        (U0, U0),  # the device plugin: a whole GPU
        (f"{U0}::3", U0),  # a time-slicing or MPS replica
        (M0, M0),  # a MIG device is itself, not its parent
        (f"{M1}::1", M1),  # a replica of a MIG device
        (f"{U0}-7", U0),  # HAMi's replica
        ("nvidia3", U0),  # GKE: the minor number, not the NVML index
        ("nvidia3/vgpu5", U0),
        ("nvidia0", None),  # index 0 is not minor 0
        ("nvidia1/gi9", M0),  # GKE's MIG device: parent minor and GPU instance
        ("nvidia1/gi2/vgpu1", M1),
        ("GPU-00000000-0000-0000-0000-000000000000", None),  # not on this node
        (f"{M0}-1", None),
        ("0", None),  # the device plugin names GPUs by UUID, never by index
        ("something-else", None),
    ],
)
def test_device_plugin_and_gke_names(device_id: str, device: str | None) -> None:
    target = DeviceMap(GPUS).device(device_id)
    assert (target.uuid if target else None) == device
    if target is not None and target.mig is not None:
        assert target.gpu == U1


def test_dra_names() -> None:
    devices = DeviceMap(GPUS)
    assert dra_profile("1g.18gb") == "1g18gb"
    assert dra_profile("1g.18gb+me") == "1g18gb-me"
    assert (devices.dra("gpu-3") or None) is not None and devices.dra("gpu-3").uuid == U0  # type: ignore[union-attr]
    assert devices.dra("gpu-0") is None
    assert devices.dra("gpu-1-mig-1g18gb-19-4").uuid == M0  # type: ignore[union-attr]
    assert devices.dra("gpu-1-mig-1g18gb-19-0") is None  # another placement
    # Without profile ID and placement from NVML, a unique profile on the parent still matches.
    vague = Device(1, U1, "H200", 141 * GIB, 0, None, minor_number=1, migs=(MigDevice(M0, "1g.18gb", 18 * GIB, 0),))
    assert DeviceMap([vague]).dra("gpu-1-mig-1g18gb-19-4").uuid == M0  # type: ignore[union-attr]
    twins = Device(
        1,
        U1,
        "H200",
        141 * GIB,
        0,
        None,
        1,
        (MigDevice(M0, "1g.18gb", 18 * GIB, 0), MigDevice(M1, "1g.18gb", 18 * GIB, 0)),
    )
    assert DeviceMap([twins]).dra("gpu-1-mig-1g18gb-19-4") is None


def test_replicas_per_device() -> None:
    ids = [f"{U0}::{n}" for n in range(4)] + [f"{M0}::0", f"{M0}::1", M1, "GPU-elsewhere::0"]
    assert DeviceMap(GPUS).replicas(ids) == {U0: 4, M0: 2, M1: 1}


def pods(**extra: PodMeta) -> dict[str, PodMeta]:
    return {"uid-t": PodMeta("ml", "trainer"), "uid-a": PodMeta("web", "api"), **extra}


def test_kubelet_ids_count_one_share_each_on_default_resources() -> None:
    view = KubeletView(
        devices=(
            # failRequestsGreaterThanOne off: two replicas of one GPU are two shares.
            DeviceAssignment("ml", "trainer", "main", "nvidia.com/gpu", (f"{U0}::0", f"{U0}::1")),
            DeviceAssignment("ml", "trainer", "aux", "nvidia.com/gpu.shared", (f"{U0}::2",)),  # renameByDefault
            DeviceAssignment("ml", "trainer", "main", "nvidia.com/mig-1g.18gb", (M0,)),  # mixed strategy
            DeviceAssignment("ml", "trainer", "main", "example.com/nic", ("eth1",)),
            DeviceAssignment("web", "api", "main", "nvidia.com/gpu", (M1,)),  # single strategy
            DeviceAssignment("ml", "unknown-pod", "main", "nvidia.com/gpu", (U0,)),
        )
    )
    placed = dict(from_kubelet(view, pods(), GPUS).placed)
    assert placed == {
        ("uid-t", "main", U0): Grant(2.0),
        ("uid-t", "aux", U0): Grant(1.0),
        ("uid-t", "main", M0): Grant(1.0),
        ("uid-a", "main", M1): Grant(1.0),
    }
    only_custom = from_kubelet(view, pods(), GPUS, resources=["nvidia.com/mig-*"])
    assert set(only_custom.placed) == {("uid-t", "main", M0)}


def test_ended_pods_hold_nothing_and_a_reused_device_counts_once() -> None:
    # A kubelet before 1.34 lists the finished Job and gives its replica to the new pod.
    view = KubeletView(
        devices=(
            DeviceAssignment("batch", "job-1", "main", "nvidia.com/gpu", (f"{U0}::0",)),
            DeviceAssignment("batch", "job-2", "main", "nvidia.com/gpu", (f"{U0}::0",)),
            DeviceAssignment("batch", "job-0", "main", "nvidia.com/gpu", (f"{U0}::1",)),
        )
    )
    directory = {
        "uid-1": PodMeta("batch", "job-1", phase="Succeeded"),
        "uid-0": PodMeta("batch", "job-0", phase="Failed"),
        "uid-2": PodMeta("batch", "job-2"),
    }
    assert dict(from_kubelet(view, directory, GPUS).placed) == {("uid-2", "main", U0): Grant(1.0)}
    limits = {
        "uid-1": PodMeta("batch", "job-1", phase="Succeeded", gpu_limits={"main": 1}),
        "uid-2": PodMeta("batch", "job-2", gpu_limits={"main": 1}),
    }
    assert dict(from_limits(limits).unplaced) == {("uid-2", "main"): 1}


def test_the_pods_the_kubelet_lists_are_answered_for_devices_or_not() -> None:
    # List answers for every pod of the node; the MPS control daemon has no device.
    view = KubeletView(
        devices=(DeviceAssignment("ml", "trainer", "main", "nvidia.com/gpu", (f"{U0}::0",)),),
        pods=(
            ("ml", "trainer"),
            ("gpu-operator", "mps-control-daemon"),
            ("web", "not-in-the-directory"),
            ("ai", "bad-0"),
        ),
    )
    directory = pods(mps=PodMeta("gpu-operator", "mps-control-daemon"), bad=PodMeta("ai", "bad-0", unreadable=True))
    # uid-a (web/api) is not listed: an answer older than the pod; it stays unknown; so
    # does bad-0, whose HAMi annotation could not be read
    assert from_kubelet(view, directory, GPUS).answered == {"uid-t", "mps"}
    # a kubelet answer that does not say which pods it lists answers for none
    assert from_kubelet(KubeletView(devices=view.devices), directory, GPUS).answered == frozenset()
    # without the kubelet, limits leave every pod's allocation open
    assert from_limits({"uid-t": PodMeta("ml", "trainer", gpu_limits={"main": 1})}).answered == frozenset()


def test_hami_pods_count_from_their_annotation_not_the_kubelet_ids() -> None:
    stated = {"main": (StatedGrant(U0, 4000 * MIB, 0.3),)}
    directory = pods(hami=PodMeta("ai", "infer", stated=stated, gpu_limits={"main": 1}))
    view = KubeletView(devices=(DeviceAssignment("ai", "infer", "main", "nvidia.com/gpu", (f"{U0}-3",)),))
    assert dict(from_kubelet(view, directory, GPUS).placed) == {("hami", "main", U0): Grant(1.0, 4000 * MIB, 0.3)}
    # Without the kubelet too, where the container's limits ask for as many GPUs.
    assert dict(from_limits(directory, GPUS).placed) == {("hami", "main", U0): Grant(1.0, 4000 * MIB, 0.3)}


@pytest.mark.parametrize(
    ("stated", "served", "why"),
    [
        # a pod HAMi's device plugin never served: the kubelet gave its container nothing
        ({"main": (StatedGrant(U0, 80 * GIB, 1.0),)}, (), "where HAMi's device plugin gave it 0"),
        # a time-slicing replica of NVIDIA's device plugin, and an annotation claiming the whole GPU
        ({"main": (StatedGrant(U0, 80 * GIB, 1.0),)}, (f"{U0}::1",), "where HAMi's device plugin gave it 0"),
        # 1 MiB and 1 % twice on one GPU, for a container given one device
        ({"main": (StatedGrant(U0, MIB, 0.01), StatedGrant(U0, MIB, 0.01))}, (f"{U0}-1",), f"GPU {U0} twice"),
        # a GPU of another node
        ({"main": (StatedGrant("GPU-elsewhere", 4000 * MIB, 0.3),)}, (f"{U0}-1",), "no GPU of this node"),
        # more memory than the GPU has
        ({"main": (StatedGrant(U0, 200 * GIB, 0.3),)}, (f"{U0}-1",), "more memory"),
    ],
)
def test_a_hami_annotation_the_device_plugin_did_not_serve_is_refused_for_the_kubelets_shares(
    stated: dict[str, tuple[StatedGrant, ...]], served: tuple[str, ...], why: str
) -> None:
    directory = pods(hami=PodMeta("ai", "forged", stated=stated, gpu_limits={"main": 1}))
    view = KubeletView(
        devices=(DeviceAssignment("ai", "forged", "main", "nvidia.com/gpu", served),) if served else (),
        pods=(("ai", "forged"),),
    )
    allocation = from_kubelet(view, directory, GPUS)
    [(reason, uid, message)] = allocation.refused
    assert reason is Refusal.HAMI_ANNOTATION
    assert uid == "hami" and why in message and message.startswith("pod ai/forged: annotation hami.io/"), message
    # What the kubelet gave, as for any pod: its one device of GPU 0, or nothing.
    assert dict(allocation.placed) == ({("hami", "main", U0): Grant(1.0)} if served else {})


def test_a_dra_claim_is_shared_by_the_containers_that_use_it() -> None:
    def claim(pod: str, container: str, device: str, driver: str = "gpu.nvidia.com") -> ClaimAssignment:
        return ClaimAssignment(
            "ml" if pod == "trainer" else "web", pod, container, "ml/shared", driver, "node-1", device
        )

    view = KubeletView(
        claims=(
            claim("trainer", "main", "gpu-3"),
            claim("api", "main", "gpu-3"),
            claim("trainer", "main", "gpu-1-mig-3g71gb-9-0"),
            claim("api", "main", "nic-0", driver="nic.example.com"),
        )
    )
    placed = dict(from_kubelet(view, pods(), GPUS).placed)
    half = int(141 * GIB / 2)
    assert placed == {
        ("uid-t", "main", U0): Grant(0.5, half, 0.5),
        ("uid-a", "main", U0): Grant(0.5, half, 0.5),
        ("uid-t", "main", M1): Grant(1.0, 71 * GIB, 1.0),
    }


def test_allocatable_gives_replicas_of_counted_resources() -> None:
    view = KubeletView(
        allocatable=(
            ("nvidia.com/gpu.shared", tuple(f"{U0}::{n}" for n in range(4))),
            ("nvidia.com/mig-1g.18gb", (M0,)),
            ("example.com/other", (f"{U0}::9",)),
        )
    )
    assert from_kubelet(view, pods(), GPUS).replicas == {U0: 4, M0: 1}
    assert from_kubelet(KubeletView(), pods(), GPUS).replicas is None


def test_limits_are_unplaced_shares() -> None:
    directory = {
        "uid-t": PodMeta("ml", "trainer", gpu_limits={"main": 2, "aux": 0}),
        "uid-c": PodMeta("ml", "cpu-only"),
    }
    allocation = from_limits(directory)
    assert dict(allocation.unplaced) == {("uid-t", "main"): 2}
    assert not allocation.placed


def test_hami_annotation_follows_init_then_regular_containers() -> None:
    value = f"{U0},NVIDIA,1024,0:;;{U1},NVIDIA,3000,25:{U0},NVIDIA,500,10:;"
    grants = parse_hami(value, ["setup"], ["server", "sidecar"])
    assert grants == {
        "setup": (StatedGrant(U0, 1024 * MIB, 1.0),),  # cores 0: no compute limit
        "sidecar": (StatedGrant(U1, 3000 * MIB, 0.25), StatedGrant(U0, 500 * MIB, 0.1)),
    }
    # One entry per regular container (no init entries) is read against the regular containers.
    assert parse_hami(f"{U0},NVIDIA,1024,50:;", ["setup", "other"], ["server"]) == {
        "server": (StatedGrant(U0, 1024 * MIB, 0.5),)
    }


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        (f"{U0},NVIDIA,lots,0:;", "memory 'lots'"),
        (f"{U0},NVIDIA:;", "has 2 fields"),
        ("nvidia0,NVIDIA,10,0:;", "not a GPU UUID"),
        (f"{U0},NVIDIA,10,150:;", "cores 150 %"),
        (f"{U0},NVIDIA,1,0:;{U0},NVIDIA,1,0:;{U0},NVIDIA,1,0:;", "3 container entries for 2 containers"),
    ],
)
def test_bad_hami_annotations_say_where_and_what(value: str, complaint: str) -> None:
    with pytest.raises(HamiAnnotationError) as caught:
        parse_hami(value, [], ["a", "b"], "pod ai/infer: annotation hami.io/vgpu-devices-allocated")
    message = str(caught.value)
    assert message.startswith("pod ai/infer: annotation hami.io/vgpu-devices-allocated:")
    assert complaint in message and "expected '<GPU uuid>,<type>,<memory MiB>,<cores %>'" in message


def test_quantities_are_refused_as_gpu_resources(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_config(["--gpu-resource", "nvidia.com/gpu", "--gpu-resource", "nvidia.com/gpumem"], {})
    assert exit_.value.code == 2
    assert re.search(
        r"--gpu-resource: nvidia.com/gpumem: a quantity .* not a count of devices", capsys.readouterr().err
    )
    with pytest.raises(ConfigError, match=r"OTEL_VGPU_GPU_RESOURCES: nvidia.com/gpucores: a quantity"):
        parse_config([], {"OTEL_VGPU_GPU_RESOURCES": "nvidia.com/gpu,nvidia.com/gpucores"})
    assert parse_config([], {}).gpu_resources == ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")


def test_a_numbered_ratio_rules_whole_gpus_and_a_mismatch_is_a_problem() -> None:
    resolved = resolve_ratios(2.0, GPUS, {U0: 4, M0: 2}, {})
    assert resolved.ratios.of(U0) == 2.0
    assert resolved.ratios.of(M0) == 2.0  # a MIG device's replicas come from the kubelet
    assert resolved.ratios.of(M1) == 1.0
    assert [kind for kind, _ in resolved.problems] == [f"mismatch:{U0}"]
    assert "says 2 vGPUs per GPU but the kubelet advertises 4 replicas of GPU 0" in resolved.problems[0][1]
    assert resolve_ratios(4.0, GPUS, {U0: 4}, {}).problems == ()
    assert resolve_ratios(2.0, GPUS, None, {}).problems == ()


def test_auto_follows_the_kubelet_then_its_last_answer_then_one() -> None:
    resolved = resolve_ratios(None, GPUS, {U0: 4}, {})
    assert (resolved.ratios.of(U0), resolved.ratios.of(U1), resolved.problems) == (4.0, 1.0, ())
    # A GPU the kubelet answered without (DRA, not shared) has 1, silently.
    assert resolve_ratios(None, GPUS[:1], {}, {}).ratios.of(U0) == 1.0
    assert resolve_ratios(None, GPUS[:1], {}, {}).problems == ()
    # The kubelet silent: the last count it gave, else 1 and a problem.
    assert resolve_ratios(None, GPUS[:1], None, {U0: 3}).ratios.of(U0) == 3.0
    silent = resolve_ratios(None, GPUS[:1], None, {})
    assert silent.ratios.of(U0) == 1.0
    assert [kind for kind, _ in silent.problems] == [f"unknown:{U0}"]
