"""Tenants as adversaries: what a pod can write (its cgroup subtree, its process names, its
annotations, a PID it is given) never moves its usage to another pod or out of the bill.

Each test is an attack a tenant can make on a node, run on the simulated node or against
the Kubernetes API double, with the bill it must leave: the attacker pays for what it ran.
docs/trust.md says who can write each input and which ones decide attribution.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from otel_vgpu.agent_health import AgentHealth, Refusal
from otel_vgpu.collect.reading import GpuReader
from otel_vgpu.export.exposition import TEXT
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.proc_tree import container_id
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.agent import InProcessAgent, agent_in_process, clean_env, wait_for
from testkit.clock import Clock
from testkit.kube_api_double import pod_object
from testkit.promtext import Exposition, parse
from testkit.sim_cluster import sim_cluster

from ...conftest import GIB, make_sampler

VICTIM = "5a1e0c2b-7d3f-4e8a-9b6c-1d2e3f405162"
ATTACKER = "a77ac4e2-0b1d-4c2e-8f3a-6b5c4d3e2f10"
MADE_UP = "deadbeef-0000-4000-8000-00000000beef"
GPU = "GPU-00000000-0000-0000-0000-000000000000"


def nested_in(uid: str, version: int) -> str:
    """The path a pod running its own systemd (or Docker-in-Docker) nests below its container,
    named like the kubelet's cgroups of pod `uid`."""
    if version == 1:
        return f"kubepods/besteffort/pod{uid}/{'b' * 64}"
    underscored = uid.replace("-", "_")
    return f"kubepods.slice/kubepods-pod{underscored}.slice/cri-containerd-{'b' * 64}.scope"


def node(*pods: str, head: str = "", model: str = "NVIDIA H100 80GB HBM3", memory: str = "80GiB") -> str:
    """A scenario of one GPU and `pods` (each from `pod`)."""
    return f"{head}\ngpus:\n  - {{model: {model}, memory: {memory}, uuid: {GPU}}}\npods:\n" + "".join(pods)


def pod(namespace: str, name: str, uid: str | None, *processes: str, more: str = "", shares: bool = True) -> str:
    """One pod of a scenario, holding a share of GPU 0 unless `shares` is False; `more`: its other fields."""
    lines = [f"  - namespace: {namespace}", f"    name: {name}"]
    lines += [f"    uid: {uid}"] if uid else []
    lines += ["    shares: {0: 1}"] if shares else []
    lines += [f"    {line}" for line in more.splitlines() if line]
    lines += ["    processes:", *(f"      - {{gpu: 0, {process}}}" for process in processes)]
    return "\n".join(lines) + "\n"


def scenario(version: int, driver: str, named: str) -> str:
    layout = f"cgroup: {{version: {version}, driver: {driver}, qos: besteffort}}"
    return node(
        pod("team-a", "victim", VICTIM, "memory: 4GiB, sm: 0.1", more=layout),
        pod(
            "team-b",
            "attacker",
            ATTACKER,
            "memory: 1GiB, sm: 0.0",
            f'memory: 30GiB, sm: 0.7, nested: "{nested_in(named, version)}"',
            more=layout,
        ),
    )


@contextmanager
def scraped_settled(tmp_path: Path, text: str, *extra: str) -> Iterator[Exposition]:
    """A scrape of the agent on the scenario `text` once every pod's SM figure stands for
    periods its processes lived in. Just after the start, the periods that settle (3 s back,
    collect/settling.py) may all be from before the simulated processes began, whose samples
    stand for none of them: every pod's figure then reads 0, as one run in five did when the
    second scrape was taken whatever it read."""
    path = tmp_path / "node.yaml"
    path.write_text(text)
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("2\n")
    args = ["--simulate", str(path), "--allocation-file", str(ratio), "--min-interval", "0", "--no-kubernetes"]
    with agent_in_process(*args, *extra, env=clean_env(), engine_every_s=0.0) as agent:
        yield wait_for(agent, _sm_in, timeout=30)


def _sm_in(exposition: Exposition) -> bool:
    sm = exposition.by("vgpu_pod_sm_utilization_ratio", "pod_uid")
    return bool(sm) and all(value > 0 for value in sm.values())


@pytest.mark.parametrize(("version", "driver"), [(2, "systemd"), (1, "cgroupfs"), (1, "systemd"), (2, "cgroupfs")])
@pytest.mark.parametrize("named", [VICTIM, MADE_UP], ids=["another-pod", "made-up-uid"])
def test_a_cgroup_nested_below_a_container_is_that_containers_whatever_it_is_named(
    tmp_path: Path, version: int, driver: str, named: str
) -> None:
    with scraped_settled(tmp_path, scenario(version, driver, named)) as exposition:
        pass
    memory = exposition.by("vgpu_pod_memory_used_bytes", "pod_uid")
    sm = exposition.by("vgpu_pod_sm_utilization_ratio", "pod_uid")
    processes = exposition.by("vgpu_pod_processes", "pod_uid")
    # The attacker pays for its 30 GiB process at 0.7 SM, however its cgroup is named.
    assert memory == {(VICTIM,): 4 * GIB, (ATTACKER,): 31 * GIB}
    assert processes == {(VICTIM,): 1, (ATTACKER,): 2}
    assert sm[(ATTACKER,)] == pytest.approx(0.7, abs=0.01)
    assert sm[(VICTIM,)] == pytest.approx(0.1, abs=0.01)
    # A made-up UID gets no row, no share and no allocation on the GPU: two pods hold one share each.
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod_uid")
    assert allocated == {(VICTIM,): 40 * GIB, (ATTACKER,): 40 * GIB}


# --- a process named like the MPS server ---------------------------------------------------------

RENAMED = "memory: 256MiB, sm: 0.4, command: nvidia-cuda-mps-server"
DECOY = node(pod("team-a", "victim", VICTIM, "memory: 4GiB, sm: 0.3"), pod("team-b", "attacker", ATTACKER, RENAMED))


def test_a_process_that_only_calls_itself_the_mps_server_is_its_pods_and_switches_nothing_off(
    tmp_path: Path,
) -> None:
    # prctl(PR_SET_NAME) in a tenant's pod: no MPS client is listed by NVML, so no MPS here.
    with scraped_settled(tmp_path, DECOY) as exposition:
        pass
    sm = exposition.by("vgpu_pod_sm_utilization_ratio", "pod_uid")
    assert sm == {(VICTIM,): pytest.approx(0.3, abs=0.01), (ATTACKER,): pytest.approx(0.4, abs=0.01)}
    busy = exposition.by("vgpu_pod_sm_busy_seconds_total", "pod_uid")
    assert set(busy) == {(VICTIM,), (ATTACKER,)}
    assert exposition.by("vgpu_gpu_mps_servers", "gpu_id") == {("0",): 0}
    assert exposition.by("vgpu_agent_refusals_total", "reason")[("mps_server_name",)] == 1


DECOY_BESIDE_REAL_MPS = node(
    pod("nvidia-device-plugin", "mps-control-daemon", None, "memory: 300MiB, sm: 0.0, mps: server", shares=False),
    pod("team-a", "client", VICTIM, "memory: 8GiB, sm: 0.3, mps: client"),
    pod("team-b", "attacker", ATTACKER, RENAMED),
    model="NVIDIA H200",
    memory="140GiB",
)


def test_a_renamed_process_beside_a_real_mps_daemon_is_still_billed(tmp_path: Path) -> None:
    # The default compute mode, as on a node where an MPS daemon runs beside time-sliced pods:
    # the daemon's server (in the GPU stack's namespace) is recognised, the tenant's is not.
    with scraped_settled(tmp_path, DECOY_BESIDE_REAL_MPS) as exposition:
        pass
    sm = exposition.by("vgpu_pod_sm_utilization_ratio", "pod_uid")
    assert sm == {(ATTACKER,): pytest.approx(0.4, abs=0.01)}  # the client's SM is unknown, not the attacker's
    assert exposition.by("vgpu_gpu_mps_servers", "gpu_id") == {("0",): 1}
    assert exposition.by("vgpu_agent_refusals_total", "reason")[("mps_server_name",)] == 1


# --- a reused PID ---------------------------------------------------------------------------------

REUSED_PID = node(
    pod("team-a", "busy", VICTIM, "memory: 4GiB, sm: 0.45, pid: 3000", more="period_s: 100\nactive_s: 9"),
    pod(
        "team-b",
        "idle",
        ATTACKER,
        "memory: 1GiB, sm: 0.0, pid: 3000",
        more="period_s: 100\nactive_s: 90\noffset_s: 9.2",
    ),
)


@pytest.mark.unit
@pytest.mark.parametrize("kept_s", [10.0, 0.0], ids=["a-driver-that-keeps-samples", "the-h200s"])
def test_a_reused_pid_inherits_nothing_of_the_process_that_held_it(tmp_path: Path, kept_s: float) -> None:
    # busy's process ends at 9 s; 0.2 s later idle's takes its PID, before the sweep at 10 s.
    # A driver that keeps an ended process's last sample keeps it under the PID: it is busy's
    # work, and idle's bill must not show it. (An H200's drops it at once:
    # bench/results/h200-nvml-ended-samples.md; then busy is billed up to its last sweep.)
    clock = Clock()
    text = f"driver: {{ended_samples_s: {kept_s}}}\n" + REUSED_PID
    node = SimulatedNode(parse_scenario(text, "reused.yaml"), tmp_path / "proc", clock.monotonic, clock.wall_us)
    health = AgentHealth()
    sampler = make_sampler(node, write_ratio(tmp_path), health=health, clock=clock.monotonic)
    busy: dict[str, float | None] = {}
    sm_seen: dict[str, float] = {}
    try:
        for _ in range(10):  # sweeps every 2 s over 20 s
            snapshot = sampler.snapshot(0.0)
            sampler.collected("scrape", snapshot)  # a scraper reads every sweep
            for row in (*snapshot.pods, *snapshot.ended):
                busy[row.pod] = row.sm_busy_seconds
                if row.sm_utilization is not None:
                    sm_seen[row.pod] = max(sm_seen.get(row.pod, 0.0), row.sm_utilization)
            clock.t += 2.0
    finally:
        node.close()
    assert sm_seen["idle"] == 0.0 and busy["idle"] == 0.0
    assert sm_seen["busy"] == pytest.approx(0.45, abs=0.01)
    # busy is billed the 9 s it ran, not to its last sweep at 8 s: the listing at 10 s shows
    # its PID held by another, so it ended halfway between the two (collect/ledger.py).
    assert busy["busy"] == pytest.approx(0.45 * 9, abs=0.45 * 0.4)
    # A driver that keeps the ended process's sample gives it under the PID idle holds now:
    # refused to idle, once; an H200's gives none.
    assert health.refusals().get(Refusal.PID_REUSED, 0) == (1 if kept_s else 0)


def write_ratio(tmp_path: Path) -> Path:
    ratio = tmp_path / "gpu_allocation.txt"
    ratio.write_text("2\n")
    return ratio


# --- a pod's own annotations, through the Kubernetes API double ---------------------------------

NODE = "gpu-node-1"
ANNOTATED = node(
    pod("team-a", "victim", VICTIM, "memory: 4GiB, sm: 0.2"),
    pod("team-b", "attacker", ATTACKER, "memory: 8GiB, sm: 0.5"),
    head=f"node: {NODE}",
)


@contextmanager
def in_a_cluster(tmp_path: Path, annotations: dict[str, str]) -> Iterator[InProcessAgent]:
    """The agent on the ANNOTATED node, its pods in the API double (the attacker's with
    `annotations`, as its author wrote them at creation) and its devices in the kubelet double."""
    scenario = parse_scenario(ANNOTATED, "annotated.yaml")
    path = tmp_path / "annotated.yaml"
    path.write_text(ANNOTATED)
    with sim_cluster(scenario, tmp_path) as cluster:
        attacker = next(pod for pod in scenario.pods if pod.name == "attacker")
        containers = {"main": container_id(attacker, "main")}
        cluster.api.put(
            pod_object("team-b", "attacker", ATTACKER, NODE, containers=containers, annotations=annotations)
        )
        args = ["--simulate", str(path), "--allocation-file", str(write_ratio(tmp_path)), "--min-interval", "0"]
        with agent_in_process(*args, *cluster.args, env=clean_env(**cluster.env), engine_every_s=0.0) as agent:
            yield agent


HAMI = "hami.io/vgpu-devices-allocated"


@pytest.mark.parametrize(
    "claim",
    [
        f"{GPU},NVIDIA,81920,100:;",  # the whole GPU, on a time-slicing replica
        f"{GPU},NVIDIA,1,1:{GPU},NVIDIA,1,1:;",  # 1 MiB and 1 % twice
        "GPU-99999999-9999-4999-8999-999999999999,NVIDIA,4000,30:;",  # a GPU of another node
    ],
    ids=["whole-gpu", "twice", "other-node"],
)
def test_a_pods_own_hami_annotation_does_not_change_what_it_was_given(tmp_path: Path, claim: str) -> None:
    with in_a_cluster(tmp_path, {HAMI: claim}) as agent:
        exposition = wait_for(
            agent, lambda e: ("team-b", "attacker") in set(e.by("vgpu_pod_processes", "namespace", "pod"))
        )
        exposition = wait_for(
            agent, lambda e: e.by("vgpu_agent_refusals_total", "reason").get(("hami_annotation",), 0) >= 1
        )
        log = agent.logged()
    # What the kubelet's device plugin gave it: one replica of two, half the GPU.
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod")
    assert allocated == {("victim",): 40 * GIB, ("attacker",): 40 * GIB}
    vgpu = exposition.by("vgpu_pod_vgpu_utilization_ratio", "pod")
    assert vgpu[("attacker",)] == pytest.approx(0.5 * 2, abs=0.02)
    assert exposition.by("vgpu_agent_refusals_total", "reason")[("hami_annotation",)] == 1
    assert sum(f"pod team-b/attacker: annotation {HAMI}" in line for line in log.splitlines()) == 1, log


@pytest.mark.parametrize("claimed", [VICTIM, "0123456789abcdef0123456789abcdef"], ids=["victims-uid", "made-up"])
def test_a_pods_own_config_hash_annotation_moves_nothing(tmp_path: Path, claimed: str) -> None:
    with in_a_cluster(tmp_path, {"kubernetes.io/config.hash": claimed}) as agent:
        exposition = wait_for(
            agent, lambda e: e.by("vgpu_agent_refusals_total", "reason").get(("config_hash",), 0) >= 1
        )
        agent.wait_sweeps(2)
        exposition = agent.scrape()
        log = agent.logged()
    # Each pod keeps its own usage under its own name, and its counters count.
    memory = exposition.by("vgpu_pod_memory_used_bytes", "namespace", "pod", "pod_uid")
    assert memory == {("team-a", "victim", VICTIM): 4 * GIB, ("team-b", "attacker", ATTACKER): 8 * GIB}
    busy = exposition.by("vgpu_pod_sm_busy_seconds_total", "pod")
    assert busy[("attacker",)] > 0 and busy[("victim",)] > 0
    # The pods' joules never add up to more than the GPU's.
    joules = exposition.by("vgpu_pod_energy_joules_total", "pod")
    assert sum(joules.values()) <= exposition.by("vgpu_gpu_energy_joules_total", "gpu_id")[("0",)] + 1e-6
    assert exposition.by("vgpu_agent_refusals_total", "reason")[("config_hash",)] == 1
    assert sum("kubernetes.io/config.hash on a pod that is not a mirror pod" in line for line in log.splitlines()) == 1


# --- a pod that ends between scrapes --------------------------------------------------------------

ENDING = node(
    pod("team-a", "stays", VICTIM, "memory: 4GiB, sm: 0.3"),
    pod("team-b", "ends", ATTACKER, "memory: 8GiB, sm: 0.5", more="period_s: 1000\nactive_s: 28"),
)
SCRAPE_EVERY_S = 15.0


@pytest.mark.unit
@pytest.mark.parametrize("kept_s", [0.0, 10.0], ids=["the-h200s", "a-driver-that-keeps-samples"])
@pytest.mark.parametrize("sweep_every", [2.0, 5.0, 10.0])
def test_an_ended_pods_last_increments_reach_the_bill(tmp_path: Path, sweep_every: float, kept_s: float) -> None:
    # Sweeps on the agent's cadence, scrapes every 15 s; a pod ends at 28 s, between the
    # scrapes at 15 and 30 and a few seconds after a sweep. Every joule the GPU drew must be in
    # a series a scrape read: the pods' (an ended pod's final value) or the unattributed.
    clock = Clock(0.0)
    text = f"driver: {{ended_samples_s: {kept_s}}}\n" + ENDING
    node = SimulatedNode(parse_scenario(text, "ending.yaml"), tmp_path / "proc", clock.monotonic, clock.wall_us)
    health = AgentHealth()
    sampler = make_sampler(
        node, write_ratio(tmp_path), health=health, clock=clock.monotonic, reader=GpuReader(node, clock.monotonic)
    )
    telemetry = Telemetry(sampler, health, min_interval=sweep_every / 2, node_name="n", seed_metrics=False)
    seen: dict[tuple[str, str], float] = {}
    try:
        events = sorted(
            {*(k * sweep_every for k in range(int(60 / sweep_every) + 1)), *(k * SCRAPE_EVERY_S for k in range(1, 5))}
        )
        for t in events:
            clock.t = t
            if t % SCRAPE_EVERY_S == 0 and t > 0:
                exposition = parse(telemetry.render(TEXT).decode())
                if t == 30:
                    after_the_end = exposition
                for family in ("vgpu_pod_energy_joules_total", "vgpu_pod_sm_busy_seconds_total"):
                    for (uid,), value in exposition.by(family, "pod_uid").items():
                        seen[(family, uid)] = value
            else:
                sampler.snapshot(sweep_every / 2)
    finally:
        telemetry.shutdown()
        node.close()
    gpu = exposition.by("vgpu_gpu_energy_joules_total", "gpu_id")[("0",)]
    unattributed = exposition.by("vgpu_gpu_energy_unattributed_joules_total", "gpu_id")[("0",)]
    pods = sum(value for (family, _), value in seen.items() if family == "vgpu_pod_energy_joules_total")
    assert gpu > 0 and pods + unattributed == pytest.approx(gpu, rel=1e-9), (pods, unattributed, gpu)
    # Its busy seconds are its work, 0.5 of the GPU for the 28 s it ran, up to the last sample
    # the driver kept, where it keeps an ended process's: about one process a period gets a new
    # sample on the recorded driver, this one (0.5 beside 0.3) within a second of its end. Else,
    # with sweeps alone (no watch here), it ran at least to halfway between the last sweep that
    # listed it and the first that did not, and at most to its end, at its last figure (its
    # tail: collect/estimator.py).
    billed = seen[("vgpu_pod_sm_busy_seconds_total", ATTACKER)]
    if kept_s:
        assert 0.5 * (28 - 1.0) - 0.1 <= billed <= 0.5 * 28 + 0.1
    else:
        last_sweep = (math.ceil(28 / sweep_every) - 1) * sweep_every  # the last that saw it running
        assert 0.5 * (last_sweep + sweep_every / 2) - 0.2 <= billed <= 0.5 * 28 + 0.2
    # The first scrape after the end has its counters at their final values, and no gauge of it.
    assert (ATTACKER,) in after_the_end.by("vgpu_pod_energy_joules_total", "pod_uid")
    assert (ATTACKER,) in after_the_end.by("vgpu_pod_sm_busy_seconds_total", "pod_uid")
    assert (ATTACKER,) not in after_the_end.by("vgpu_pod_memory_used_bytes", "pod_uid")
    assert (ATTACKER,) not in after_the_end.by("vgpu_pod_sm_utilization_ratio", "pod_uid")
    # and once every reader has collected them, they go.
    assert (ATTACKER,) not in exposition.by("vgpu_pod_energy_joules_total", "pod_uid")
