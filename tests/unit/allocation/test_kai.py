"""KAI Scheduler's GPU fractions: what its BindRequests grant each pod on the GPU its reservation
pod holds, and what a tenant's own labels and annotations cannot claim (allocation/kai.py).

The pure rules first, each worked out by hand; then the agent on a simulated KAI node whose pods
and BindRequests the Kubernetes API double serves as KAI makes them (tests/data/sharing/kai.yaml).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from otel_vgpu.agent_health import Refusal
from otel_vgpu.allocation.kai import BindRequest, KaiSettings, KaiView, kai_marks
from otel_vgpu.allocation.shares import Allocation, DeviceAssignment, Grant, KubeletView, from_kubelet, from_limits
from otel_vgpu.config import ConfigError, parse_config
from otel_vgpu.gpu.backend import Device
from otel_vgpu.kubernetes.bind_requests import bind_request
from otel_vgpu.pods.directory import PodMeta
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.agent import ROOT, InProcessAgent, agent_in_process, clean_env, wait_for
from testkit.kube_api_double import BIND_REQUESTS, KubeApiDouble, bind_request_object
from testkit.promtext import Exposition
from testkit.sim_cluster import sim_cluster

from ...conftest import GIB

GPU = 80 * GIB
U0 = "GPU-6a4c2e10-0000-4000-8000-00000000e001"
U1 = "GPU-6a4c2e10-0000-4000-8000-00000000e002"
GPUS = [Device(0, U0, "H100", GPU, 0, 0.0), Device(1, U1, "H100", GPU, 0, 0.0)]
NODE = "node-1"
RESERVATION = "kai-resource-reservation"
GROUP_A, GROUP_B = "0b8e3c9a-1f2d-4e5b-9a6c-7d8e9f0a1b2c", "5d7f9b1c-3e4a-4c6d-8e0f-1a2b3c4d5e6f"


def reservation(
    name: str = "gpu-reservation-5c1e9a0b7d3f2468",
    group: str = GROUP_A,
    gpu: str | None = U0,
    namespace: str = RESERVATION,
    account: str = RESERVATION,
    app: str = RESERVATION,
    more: dict[str, str] | None = None,
) -> PodMeta:
    """A reservation pod as KAI's binder makes it, its process having written its GPU (None: not yet);
    `more`: labels beside KAI's."""
    annotations = {} if gpu is None else {"run.ai/reserve_for_gpu_index": gpu}
    labels = {"app": app, "runai-gpu-group": group, **(more or {})}
    marks = kai_marks(labels, annotations, account, (), ("resource-reservation",))
    return PodMeta(namespace, name, uid=f"uid-{name}", kai=marks)


def fraction(name: str, namespace: str = "team-a", group: str | None = GROUP_A, **annotations: str) -> PodMeta:
    """A pod that asked KAI for a fraction and carries the group label KAI's binder gives it."""
    labels = {} if group is None else {"runai-gpu-group": group}
    asked = annotations or {"gpu-fraction": "0.5"}
    return PodMeta(namespace, name, uid=f"uid-{name}", kai=kai_marks(labels, asked, "default", (), ("main",)))


def request(
    pod: PodMeta,
    portion: float = 0.5,
    groups: tuple[str, ...] = (GROUP_A,),
    node: str = NODE,
    kind: str = "Fraction",
    phase: str = "Succeeded",
    owner: str | None = None,
) -> BindRequest:
    owners = (owner or pod.uid,)
    return BindRequest(pod.namespace, pod.name, owners, node, kind, portion, groups, phase)


def by_uid(*metas: PodMeta) -> dict[str, PodMeta]:
    return {meta.uid: meta for meta in metas}


def kubelet(metas: dict[str, PodMeta], given: dict[str, str]) -> KubeletView:
    """The kubelet's answer: every pod listed, `given` the GPU (by UUID) of each pod given one."""
    devices = tuple(
        DeviceAssignment(metas[uid].namespace, metas[uid].name, "resource-reservation", "nvidia.com/gpu", (gpu,))
        for uid, gpu in given.items()
    )
    return KubeletView(devices=devices, pods=tuple((meta.namespace, meta.name) for meta in metas.values()))


def allocate(metas: dict[str, PodMeta], requests: list[BindRequest], given: dict[str, str] | None = None) -> Allocation:
    """from_kubelet on a node where the reservation pods were given the GPU their annotation names."""
    if given is None:
        given = {uid: m.kai.reserved_gpu for uid, m in metas.items() if m.kai and m.kai.reserved_gpu}
    return from_kubelet(kubelet(metas, given), metas, GPUS, kai=KaiView(NODE, tuple(requests)))


@pytest.mark.unit
def test_each_fraction_is_its_bind_requests_portion_of_the_reserved_gpu_and_the_reservation_holds_none() -> None:
    holder, a, b = reservation(), fraction("notebook-a"), fraction("embed-b", "team-b", **{"gpu-memory": "16000"})
    metas = by_uid(holder, a, b)
    allocation = allocate(metas, [request(a, 0.5), request(b, 0.2)])
    # Half the GPU's memory, and 16000 MiB as KAI's scheduler turned it into 0.20 of it; no compute share.
    assert dict(allocation.placed) == {
        ("uid-notebook-a", "main", U0): Grant(0.5, GPU // 2, 0.0),
        ("uid-embed-b", "main", U0): Grant(0.2, int(0.2 * GPU), 0.0),
    }
    # The reservation pod's own device is gone: it holds its fraction pods' GPU, no idle share of its own.
    assert allocation.answered >= {holder.uid, a.uid, b.uid}
    assert allocation.refused == ()


@pytest.mark.unit
def test_the_fraction_goes_to_the_container_kai_names() -> None:
    init, named = ("setup",), {"gpu-fraction": "0.5", "gpu-fraction-container-name": "setup"}
    marks = kai_marks({"runai-gpu-group": GROUP_A}, named, "default", init, ("server", "sidecar"))
    assert marks is not None and marks.container == "setup"
    gone = {**named, "gpu-fraction-container-name": "nowhere"}
    assert (kai_marks({}, gone, "default", init, ("server", "sidecar")) or pytest.fail()).container == "server"
    # Every group of a pod with fractions of several GPUs; nothing of KAI's, no marks.
    several = {"runai-gpu-group/g1": "g1", "runai-gpu-group/g2": "g2", "team": "x"}
    assert (kai_marks(several, {}, "default", (), ("main",)) or pytest.fail()).groups == {"g1", "g2"}
    assert kai_marks({"app": "web"}, {"note": "x"}, "default", (), ("main",)) is None


@pytest.mark.unit
@pytest.mark.parametrize(
    ("pod", "requests", "key"),
    [
        # gpu-fraction "1" written by the pod's author, no BindRequest of KAI's
        (fraction("forged", group=None, **{"gpu-fraction": "1"}), [], "uid-forged"),
        # KAI's group label copied from a neighbour, no BindRequest
        (fraction("copied", **{"team": "x"}), [], "uid-copied"),
        # the BindRequest of the pod of that name before it (another UID)
        (fraction("again"), [request(fraction("again"), owner="uid-earlier")], "uid-again"),
        # a BindRequest for another node
        (fraction("elsewhere"), [request(fraction("elsewhere"), node="node-2")], "uid-elsewhere"),
        # a whole GPU from KAI, and a gpu-fraction annotation added since
        (fraction("whole"), [request(fraction("whole"), 1.0, (), kind="Regular")], "uid-whole"),
        # a group no reservation pod of KAI's holds on this node
        (fraction("lost", group=GROUP_B), [request(fraction("lost"), groups=(GROUP_B,))], f"uid-lost:{GROUP_B}"),
    ],
    ids=["own-annotation", "own-label", "another-uids", "another-node", "regular", "no-reservation"],
)
def test_kais_marks_without_a_bind_request_that_grants_them_give_nothing_and_are_counted(
    pod: PodMeta, requests: list[BindRequest], key: str
) -> None:
    metas = by_uid(reservation(), fraction("notebook-a"), pod)
    allocation = allocate(metas, [request(metas["uid-notebook-a"]), *requests])
    assert [grant for (uid, _, _), grant in allocation.placed.items() if uid == pod.uid] == []
    assert [(reason, refused) for reason, refused, _ in allocation.refused] == [(Refusal.KAI_FRACTION, key)]
    # The kubelet listed it with no device: use without an allocation, as on any node.
    assert pod.uid in allocation.answered
    assert allocation.placed[("uid-notebook-a", "main", U0)] == Grant(0.5, GPU // 2, 0.0)


@pytest.mark.unit
def test_before_the_bind_requests_are_listed_the_reservation_holds_its_gpu_and_nothing_is_refused() -> None:
    holder, pod, forged = reservation(), fraction("notebook-a"), fraction("forged", **{"gpu-fraction": "1"})
    metas = by_uid(holder, pod, forged)
    view = kubelet(metas, {holder.uid: U0})
    allocation = from_kubelet(view, metas, GPUS, kai=KaiView(NODE, (request(pod),), listed=False))
    assert dict(allocation.placed) == {} and allocation.refused == ()


@pytest.mark.unit
def test_a_pod_not_yet_bound_is_neither_given_nor_refused() -> None:
    pod = fraction("starting")
    allocation = allocate(by_uid(reservation(), pod), [request(pod, phase="Pending")])
    assert dict(allocation.placed) == {} and allocation.refused == ()


@pytest.mark.unit
def test_a_pod_bound_to_one_gpu_cannot_relabel_itself_onto_another() -> None:
    other = reservation("gpu-reservation-0a0b0c0d0e0f1011", GROUP_B, U1)
    pod = fraction("mover", group=GROUP_B)  # its BindRequest selects group A (GPU 0)
    allocation = allocate(by_uid(reservation(), other, pod), [request(pod, 0.25)])
    assert dict(allocation.placed) == {("uid-mover", "main", U0): Grant(0.25, GPU // 4, 0.0)}
    assert [(reason, key) for reason, key, _ in allocation.refused] == [(Refusal.KAI_FRACTION, f"uid-mover:{GROUP_B}")]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("holder", "given", "why"),
    [
        (reservation(namespace="team-z"), U0, "outside KAI's reservation namespace"),
        (reservation(account="default"), U0, "service account"),
        (reservation(app="mine"), U0, "app=kai-resource-reservation"),
        (reservation(more={f"runai-gpu-group/{GROUP_B}": GROUP_B}), U0, "labelled with one runai-gpu-group; it has 2"),
        # the GPU its annotation names is not the one the kubelet gave it
        (reservation(gpu=U0), U1, f"where the kubelet gave it {U1}"),
        (reservation(gpu="GPU-99999999-9999-4999-8999-999999999999"), U0, "no GPU of this node"),
    ],
    ids=["namespace", "service-account", "app-label", "groups", "another-gpu", "another-node"],
)
def test_a_reservation_pod_that_is_not_kais_holds_no_fraction(holder: PodMeta, given: str, why: str) -> None:
    pod = fraction("notebook-a")
    metas = by_uid(holder, pod)
    allocation = allocate(metas, [request(pod)], given={holder.uid: given})
    refused = {reason: (key, message) for reason, key, message in allocation.refused}
    assert refused[Refusal.KAI_RESERVATION][0] == holder.uid and why in refused[Refusal.KAI_RESERVATION][1]
    assert refused[Refusal.KAI_FRACTION][0] == f"uid-notebook-a:{GROUP_A}"
    # It is a pod the kubelet gave a GPU, as any other; the fraction pod was given nothing by it.
    assert dict(allocation.placed) == {(holder.uid, "resource-reservation", given): Grant(1.0)}


@pytest.mark.unit
def test_two_reservation_pods_of_one_group_on_two_gpus_hold_nothing() -> None:
    first, second = reservation(), reservation("gpu-reservation-ffeeddccbbaa9988", GROUP_A, U1)
    pod = fraction("notebook-a")
    allocation = allocate(by_uid(first, second, pod), [request(pod)])
    reasons = sorted((reason.value, key) for reason, key, _ in allocation.refused)
    assert reasons == [
        ("kai_fraction", f"uid-notebook-a:{GROUP_A}"),
        ("kai_reservation", f"{first.uid}:{GROUP_A}"),
        ("kai_reservation", f"{second.uid}:{GROUP_A}"),
    ]
    assert not [key for key in allocation.placed if key[0] == pod.uid]


@pytest.mark.unit
def test_fractions_of_one_gpu_add_up_to_at_most_the_gpu() -> None:
    pods = [fraction(f"p{n}", f"team-{n}") for n in range(3)]
    allocation = allocate(by_uid(reservation(), *pods), [request(pod, 0.5) for pod in pods])
    # 1.5 of the GPU granted: each scaled by 1.5, a third of the GPU apiece, counted once.
    for pod in pods:
        grant = allocation.placed[(pod.uid, "main", U0)]
        assert grant.shares == pytest.approx(1 / 3) and grant.memory == int(GPU / 2 / 1.5)
    assert [(reason, key) for reason, key, _ in allocation.refused] == [
        (Refusal.KAI_OVERCOMMIT, f"{U0}:uid-p0,uid-p1,uid-p2")
    ]


@pytest.mark.unit
def test_a_reservation_pod_before_its_process_names_the_gpu_holds_it_for_fractions_to_come() -> None:
    holder = reservation(gpu=None)
    allocation = allocate(by_uid(holder), [], given={holder.uid: U0})
    assert dict(allocation.placed) == {} and allocation.refused == ()


@pytest.mark.unit
def test_without_the_kubelet_the_reservation_pods_own_word_stands_for_its_gpu() -> None:
    holder = dataclasses.replace(reservation(), uid="uid-r", gpu_limits={"resource-reservation": 1})
    tenant = reservation(namespace="team-z", name="gpu-reservation-0123456789abcdef", group=GROUP_B)
    pod, other = fraction("notebook-a"), fraction("mine", group=GROUP_B)
    metas = by_uid(holder, tenant, pod, other)
    allocation = from_limits(metas, GPUS, KaiView(NODE, (request(pod), request(other, groups=(GROUP_B,)))))
    assert dict(allocation.placed) == {("uid-notebook-a", "main", U0): Grant(0.5, GPU // 2, 0.0)}
    assert ("uid-r", "resource-reservation") not in allocation.unplaced  # no GPU limit of its own counted
    reasons = {(reason, key) for reason, key, _ in allocation.refused}
    assert reasons == {(Refusal.KAI_RESERVATION, tenant.uid), (Refusal.KAI_FRACTION, f"uid-mine:{GROUP_B}")}


@pytest.mark.unit
def test_a_bind_request_is_read_as_kais_scheduler_writes_it() -> None:
    written = bind_request_object("team-a", "notebook-a", "uid-a", NODE, portion="0.50", groups=(GROUP_A,))
    written["metadata"]["ownerReferences"].append({"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "c"})
    read = bind_request(written)
    assert read == BindRequest("team-a", "notebook-a", ("uid-a",), NODE, "Fraction", 0.5, (GROUP_A,), "Succeeded")
    for portion in ("half", "0", "1.5", "nan"):
        assert bind_request(bind_request_object("a", "p", "u", NODE, portion=portion)).portion is None, portion
    assert bind_request(bind_request_object("a", "p", "u", NODE, phase=None)).phase == ""


@pytest.mark.unit
def test_the_reservation_namespace_account_and_label_are_kais_values() -> None:
    assert parse_config([]).kai_reservation == (RESERVATION,) * 3
    assert parse_config(["--kai-reservation", "runai-reservation"]).kai_reservation == ("runai-reservation",) * 3
    assert parse_config([], {"OTEL_VGPU_KAI_RESERVATION": "rr/rr-sa/RR"}).kai_reservation == ("rr", "rr-sa", "RR")
    assert KaiSettings(*parse_config([]).kai_reservation) == KaiSettings()
    for bad in ("Upper", "a/b/c/d", "a//b", "a/b/-x-"):
        with pytest.raises(ConfigError, match="NAMESPACE"):
            parse_config([], {"OTEL_VGPU_KAI_RESERVATION": bad})
    with pytest.raises(ConfigError, match="auto"):
        parse_config([], {"OTEL_VGPU_KAI": "sometimes"})


# --- the agent on a KAI node, through the Kubernetes API double and the kubelet double ------------

SCENARIO = ROOT / "tests" / "data" / "sharing" / "kai.yaml"


@contextmanager
def kai_node(
    tmp_path: Path, text: str, *args: str, api: dict[str, bool] | None = None
) -> Iterator[tuple[InProcessAgent, KubeApiDouble]]:
    """The agent on the simulated node of `text`, its pods and BindRequests in the API double as
    KAI makes them, its devices in the kubelet double; `api`: the double's switches."""
    scenario = parse_scenario(text, "kai.yaml")
    path = tmp_path / "kai.yaml"
    path.write_text(text)
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("auto\n")
    with sim_cluster(scenario, tmp_path) as cluster:
        for switch, value in (api or {}).items():
            setattr(cluster.api.state, switch, value)
        flags = ["--simulate", str(path), "--allocation-file", str(ratio), "--sweep-interval", "0.2", *args]
        with agent_in_process(*flags, *cluster.args, env=clean_env(**cluster.env), engine_every_s=0.0) as agent:
            yield agent, cluster.api


def by_pod(exposition: Exposition, family: str) -> dict[tuple[str, ...], float]:
    return exposition.by(family, "namespace", "pod")


def granted(namespace: str, pod: str, memory: float) -> Callable[[Exposition], bool]:
    """A scrape that says the pod was given `memory` bytes."""
    return lambda e: by_pod(e, "vgpu_pod_memory_allocated_bytes").get((namespace, pod)) == memory


def test_on_a_kai_node_each_pod_is_given_what_kai_granted_and_the_reservation_is_neither_idle_nor_billed(
    tmp_path: Path,
) -> None:
    with kai_node(tmp_path, SCENARIO.read_text()) as (agent, api):
        wait_for(agent, granted("team-a", "notebook-a", GPU * 0.5))
        agent.wait_sweeps(2)
        # The pods' SM once GPU 0's first periods have settled: with four processes on it they
        # wait for samples the driver gives one a period (collect/settling.py), and until then
        # its pods have no SM figure (they read 0 before PodRow.settled, one run in twelve under
        # load, a scrape two sweeps after the grants).
        notebook = ("team-a", "notebook-a")
        exposition = wait_for(agent, lambda e: by_pod(e, "vgpu_pod_sm_utilization_ratio").get(notebook, 0.0) > 0)
        log = agent.logged()
    allocated = by_pod(exposition, "vgpu_pod_memory_allocated_bytes")
    assert allocated == {
        ("team-a", "notebook-a"): GPU * 0.5,  # gpu-fraction 0.5
        ("team-b", "infer-b"): GPU * 0.25,
        ("team-b", "embed-c"): int(GPU * 0.2),  # gpu-memory 16000: 0.20 of the GPU, as KAI enforces it
        ("team-c", "trainer-d"): GPU,  # a whole GPU, from the kubelet
        ("team-c", "forged-e"): 0,  # its own gpu-fraction "1": use without an allocation
    }
    # Each one's own use, the reservation pod in no series: no idle allocation, nothing billed.
    used = by_pod(exposition, "vgpu_pod_memory_used_bytes")
    assert used[("team-a", "notebook-a")] == 20 * GIB and used[("team-b", "infer-b")] == 12 * GIB
    for family in ("vgpu_pod_memory_allocated_bytes", "vgpu_pod_processes", "vgpu_pod_energy_joules_total"):
        assert RESERVATION not in {namespace for namespace, _ in by_pod(exposition, family)}, family
    # KAI sets no compute limit: a fraction has no vGPU utilization; the whole GPU has its SM over 1.
    vgpu = by_pod(exposition, "vgpu_pod_vgpu_utilization_ratio")
    assert set(vgpu) == {("team-c", "trainer-d")} and vgpu[("team-c", "trainer-d")] == pytest.approx(0.6, abs=0.01)
    assert by_pod(exposition, "vgpu_pod_sm_utilization_ratio")[("team-a", "notebook-a")] == pytest.approx(0.3, abs=0.01)
    # The pod that wrote gpu-fraction "1" itself, and the one that made itself a reservation pod in
    # its own namespace: each refused, counted and said once.
    refusals = exposition.by("vgpu_agent_refusals_total", "reason")
    assert refusals[("kai_fraction",)] == 1 and refusals[("kai_reservation",)] == 1
    assert sum("pod team-c/forged-e carries KAI's" in line for line in log.splitlines()) == 1, log
    impostor = "pod team-c/gpu-reservation-0000000000000000 is taken for no reservation pod of KAI's"
    assert sum(impostor in line for line in log.splitlines()) == 1, log
    assert exposition.by("vgpu_agent_reader_success", "reader")[("api_bind_requests",)] == 1
    # Only this node's BindRequests are asked for, by the label KAI's scheduler gives them.
    asked = [r for r in api.state.requests if r.startswith("/apis/")]
    assert asked and all(
        r.startswith(f"{BIND_REQUESTS}?") and "labelSelector=selected-node%3Dsim-kai" in r for r in asked
    )


def test_a_bind_request_that_comes_and_goes_moves_the_allocation_with_it(tmp_path: Path) -> None:
    with kai_node(tmp_path, SCENARIO.read_text()) as (agent, api):
        wait_for(agent, granted("team-a", "notebook-a", GPU * 0.5))
        uid = next(u for u, r in api.state.bindrequests.items() if r["metadata"]["name"] == "notebook-a")
        api.delete_bind_request(uid)
        gone = wait_for(agent, granted("team-a", "notebook-a", 0))
        assert gone.by("vgpu_agent_refusals_total", "reason")[("kai_fraction",)] == 2  # the forged pod, and it
        forged = next(r for r in api.state.pods.values() if r["metadata"]["name"] == "forged-e")
        uid = forged["metadata"]["uid"]
        # KAI's scheduler places it after all: its BindRequest, Succeeded, now gives it 0.05 of GPU 0.
        request = bind_request_object("team-c", "forged-e", uid, "sim-kai", portion="0.05", groups=(GROUP_A,))
        api.put_bind_request(request)
        wait_for(agent, granted("team-c", "forged-e", int(GPU * 0.05)))


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_node_without_kais_reservation_pods_never_asks_for_bind_requests(tmp_path: Path, mode: str) -> None:
    text = SCENARIO.read_text().replace("namespace: kai-resource-reservation", "namespace: team-z")
    with kai_node(tmp_path, text, "--kai", mode, api={"serve_bind_requests": False}) as (agent, api):
        exposition = wait_for(agent, lambda e: ("team-c", "trainer-d") in by_pod(e, "vgpu_pod_memory_allocated_bytes"))
        agent.wait_sweeps(2)
        exposition = agent.scrape()
    assert not [r for r in api.state.requests if r.startswith("/apis/")]
    assert ("api_bind_requests",) not in exposition.by("vgpu_agent_reader_success", "reader")
    assert exposition.by("vgpu_agent_collection_errors_total", "stage")[("bind_requests",)] == 0
    # No fraction is granted where KAI is not read: the pod it would hold them is a pod with a GPU.
    assert by_pod(exposition, "vgpu_pod_memory_allocated_bytes")[("team-a", "notebook-a")] == 0


@pytest.mark.parametrize(
    ("switch", "said"),
    [
        (
            "forbid_bind_requests",
            "needs get, list and watch on bindrequests.scheduling.run.ai (the chart's kai.enabled)",
        ),
        ("serve_bind_requests", "serves no bindrequests.scheduling.run.ai/v1alpha2: KAI Scheduler is not installed"),
    ],
    ids=["forbidden", "no-crd"],
)
def test_bind_requests_it_cannot_read_are_said_once_and_counted(tmp_path: Path, switch: str, said: str) -> None:
    value = switch == "forbid_bind_requests"
    with kai_node(tmp_path, SCENARIO.read_text(), api={switch: value}) as (agent, _):
        exposition = wait_for(
            agent, lambda e: e.by("vgpu_agent_collection_errors_total", "stage")[("bind_requests",)] >= 2, timeout=30
        )
        log = agent.logged()
    assert sum(said in line for line in log.splitlines()) == 1, log
    assert exposition.by("vgpu_agent_reader_success", "reader")[("api_bind_requests",)] == 0
    # Nothing refused for want of what could not be read.
    assert exposition.by("vgpu_agent_refusals_total", "reason")[("kai_fraction",)] == 0
