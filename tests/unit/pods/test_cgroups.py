"""The cgroup parser against real nodes' files and the kubelet's naming rules."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from otel_vgpu.pods.cgroups import PodRef, parse_cgroup
from otel_vgpu.sim.proc_tree import cgroup_file
from otel_vgpu.sim.scenario import DRIVERS, QOS_CLASSES, RUNTIMES, CgroupSpec
from testkit.agent import ROOT

pytestmark = pytest.mark.unit

# A copy of shared/data/cgroup-samples.json: real /proc/<pid>/cgroup texts
# and cgroup paths, each with the pod and container its source shows.
SAMPLES: list[dict[str, Any]] = json.loads((ROOT / "tests" / "data" / "cgroup-samples.json").read_text())
UID = "0e886e9a-3879-45f9-b44d-86ef9df03224"
CID = "a" * 64


@pytest.mark.parametrize("sample", SAMPLES, ids=[s["id"] for s in SAMPLES])
def test_real_samples(sample: dict[str, Any]) -> None:
    ref = parse_cgroup(sample["cgroup"])
    if sample["pod_uid"] is None:
        assert ref is None
    else:
        assert ref == PodRef(pod_uid=sample["pod_uid"], container_id=sample["container_id"])


def test_samples_cover_every_layout() -> None:
    # The sample file is the evidence; make sure it still spans what the
    # parser claims to handle.
    seen = {(s["cgroup_version"], s["driver"], s["runtime"]) for s in SAMPLES if s["pod_uid"]}
    assert {2, 1} <= {version for version, _, _ in seen}
    assert {"systemd", "cgroupfs"} <= {driver for _, driver, _ in seen}
    assert {"containerd", "crio", "docker"} <= {runtime for _, _, runtime in seen}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "0::/",
        "0::/init.scope",
        "0::/user.slice/user-1000.slice/session-3.scope",
        "12:memory:/docker/" + CID,
        # "pod" followed by something that is not a UID
        "0::/kubepods/burstable/podcast/" + CID,
        f"0::/kubepods/burstable/pod{UID[:-1]}/{CID}",
        # a UID-shaped component without the pod prefix (Cloud Foundry)
        f"4:memory:/garden/{UID}",
        "garbage without any structure \x00\xff",
    ],
)
def test_not_in_a_pod(text: str) -> None:
    assert parse_cgroup(text) is None


def test_uppercase_and_underscored_uid_is_normalised() -> None:
    text = f"0::/kubepods.slice/kubepods-pod{UID.upper().replace('-', '_')}.slice/cri-containerd-{CID}.scope"
    assert parse_cgroup(text) == PodRef(UID, CID)


def test_pod_cgroup_without_container_gives_pod_only() -> None:
    assert parse_cgroup(f"0::/kubepods/besteffort/pod{UID}") == PodRef(UID, None)


def test_conmon_scope_has_no_container() -> None:
    pod = f"kubepods-burstable-pod{UID.replace('-', '_')}.slice"
    text = f"0::/kubepods.slice/kubepods-burstable.slice/{pod}/crio-conmon-{CID}.scope"
    assert parse_cgroup(text) == PodRef(UID, None)


def test_line_with_container_wins_over_pod_only_line() -> None:
    text = f"3:cpu:/kubepods/pod{UID}\n2:memory:/kubepods/pod{UID}/{CID}\n1:name=systemd:/"
    assert parse_cgroup(text) == PodRef(UID, CID)


def test_the_container_is_the_runtimes_component_below_the_pod() -> None:
    node = "b" * 64
    text = f"0::/system.slice/docker-{node}.scope/kubepods/pod{UID}/{CID}/nested"
    assert parse_cgroup(text) == PodRef(UID, CID)


OTHER = "66666666-7777-8888-9999-000000000000"
OTHER_CID = "d" * 64


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd: a pod running systemd nests a kubelet-shaped tree below its container
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
        f"cri-containerd-{CID}.scope/kubepods.slice/kubepods-pod{OTHER.replace('-', '_')}.slice/"
        f"cri-containerd-{OTHER_CID}.scope",
        # seen from an agent in a cgroup namespace of its own: the node's part is `..`
        f"0::/../../kubepods-burstable-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope/"
        f"kubepods-pod{OTHER.replace('-', '_')}.slice/crio-{OTHER_CID}.scope",
        # cgroup v1, cgroupfs: every hierarchy nested the same way
        f"4:memory:/kubepods/besteffort/pod{UID}/{CID}/kubepods/pod{OTHER}/{OTHER_CID}\n"
        f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}/kubepods/pod{OTHER}/{OTHER_CID}",
        # cgroup v1, containerd's systemd layout: the container inline in the pod's component
        f"1:name=systemd:/system.slice/containerd.service/kubepods-besteffort-pod{UID.replace('-', '_')}.slice"
        f":cri-containerd:{CID}/pod{OTHER}/{OTHER_CID}",
        # a static pod's hash nested below an ordinary pod's container
        f"0::/kubepods/burstable/pod{UID}/{CID}/kubepods/pod{'e' * 32}/{OTHER_CID}",
    ],
)
def test_a_pod_shaped_cgroup_nested_below_a_container_stays_that_containers(text: str) -> None:
    # What a pod nests below its own container (a delegated subtree) is its own, whatever it
    # is named: the outermost pod component is the kubelet's, the container the runtime's.
    assert parse_cgroup(text) == PodRef(UID, CID)


def test_a_v1_line_nested_differently_still_names_the_outer_pod() -> None:
    # cgroup v1 delegates each hierarchy apart: a tenant may nest in one and not another.
    text = f"4:memory:/kubepods/pod{UID}/{CID}/kubepods/pod{OTHER}\n1:name=systemd:/kubepods/pod{UID}/{CID}"
    assert parse_cgroup(text) == PodRef(UID, CID)


def test_static_pod_hash_is_kept_as_is() -> None:
    digest = "09a70ae9ccc491e651e5c773579b3490"
    assert parse_cgroup(f"0::/kubepods/burstable/pod{digest}/{CID}") == PodRef(digest, CID)


@pytest.mark.parametrize(
    ("version", "driver", "runtime", "qos"), list(itertools.product((1, 2), DRIVERS, RUNTIMES, QOS_CLASSES))
)
def test_every_layout_the_simulator_writes(version: int, driver: str, runtime: str, qos: str) -> None:
    spec = CgroupSpec(version=version, driver=driver, runtime=runtime, qos=qos)
    assert parse_cgroup(cgroup_file(spec, UID, CID)) == PodRef(UID, CID)
