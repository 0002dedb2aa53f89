"""The agent against a Kubernetes API double (HTTPS, the API's JSON) and a
kubelet double (the real pod-resources gRPC), on the simulated GPU node."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_vgpu.collect.estimator import SLACK
from testkit.agent import Agent, InProcessAgent, agent_in_process, clean_env, get, running_agent, wait_for, wait_until
from testkit.certs import make_certs
from testkit.kube_api_double import KubeApiDouble, pod_object
from testkit.kube_node import IDLE, NODE, ORPHAN, SCENARIO, TRAINER, U0, U1, cid, populate
from testkit.kubelet_double import KubeletDouble
from testkit.promtext import Exposition
from testkit.sim_cluster import service_account

from ..conftest import GIB, MIB


@dataclass
class Cluster:
    api: KubeApiDouble
    kubelet: KubeletDouble
    env: dict[str, str]
    args: list[str]
    account: Path

    def agent(self, *extra: str, env: dict[str, str] | None = None) -> AbstractContextManager[Agent]:
        return running_agent(*self.args, *extra, env=env or self.env)

    def in_process(self, *extra: str) -> AbstractContextManager[InProcessAgent]:
        """The agent in this process with short backoffs: for failure and recovery paths."""
        return agent_in_process(*self.args, *extra, env=self.env)


@pytest.fixture
def cluster(tmp_path: Path, ratio_file: Path) -> Iterator[Cluster]:
    certs = make_certs(tmp_path / "pki")
    account = service_account(tmp_path, certs)
    api = KubeApiDouble(certs, NODE).start()
    socket_path = tmp_path / "kubelet.sock"
    kubelet = KubeletDouble(socket_path).start()
    populate(api, kubelet)
    scenario = tmp_path / "k8s.yaml"
    scenario.write_text(SCENARIO)
    env = clean_env(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=str(api.port))
    args = [
        "--simulate",
        str(scenario),
        "--allocation-file",
        str(ratio_file),
        "--min-interval",
        "0",
        "--node-name",
        NODE,
        "--service-account-dir",
        str(account),
        "--pod-resources-socket",
        str(socket_path),
        "--pod-resources-interval",
        "0.2",
    ]
    yield Cluster(api, kubelet, env, args, account)
    kubelet.stop()
    api.stop()


def pods_of(exposition: Exposition) -> set[tuple[str, str]]:
    return {(ns, pod) for (ns, pod) in exposition.by("vgpu_pod_memory_allocated_bytes", "namespace", "pod")}


def readers(exposition: Exposition) -> dict[str, float]:
    """Each reader's last pass: 1 where it succeeded, 0 where it failed."""
    return {reader: ok for (reader,), ok in exposition.by("vgpu_agent_reader_success", "reader").items()}


def test_names_shares_idle_allocation_and_static_pod(cluster: Cluster) -> None:
    with cluster.agent() as agent:
        exposition = wait_for(
            agent,
            lambda e: (
                ("web", "idle-0") in pods_of(e)
                and e.by("vgpu_pod_vgpu_utilization_ratio", "pod", "gpu_id").get(("trainer-7f9c", "0"), 0) > 0
            ),
        )
        code, err = agent.stop()
    assert code == 0, err
    memory = exposition.by("vgpu_pod_memory_used_bytes", "namespace", "pod", "gpu_id")
    assert memory == {
        ("ml", "trainer-7f9c", "0"): 12 * GIB,
        ("ml", "trainer-7f9c", "1"): 4 * GIB,
        ("web", "api-0", "1"): 3 * GIB,
        ("web", "idle-0", "0"): 0,  # an idle allocation
        ("kube-system", "gpu-probe-node-a", "0"): 256 * MIB,  # static pod through its config hash
        ("", ORPHAN, "1"): 1 * GIB,  # unknown to the API: its UID
    }
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id")
    # 80 GiB GPUs at ratio 2: 40 GiB a share
    assert allocated == {
        ("trainer-7f9c", "0"): 2 * 40 * GIB,  # two replicas of GPU 0
        ("trainer-7f9c", "1"): 1 * 40 * GIB,
        ("api-0", "1"): 40 * GIB,
        ("idle-0", "0"): 40 * GIB,
        ("gpu-probe-node-a", "0"): 0,  # listed without a device: use without an allocation
        (ORPHAN, "1"): 0,  # a pod the API does not know, while it answers: no share
    }
    vgpu = exposition.by("vgpu_pod_vgpu_utilization_ratio", "pod", "gpu_id")
    # To NVML's whole percents; the trainer, alone with figures while the probe's 0.02 goes
    # periods without a sample (the recorded cadence), may take `SLACK` over its own.
    assert 0.6 - 0.01 <= vgpu[("trainer-7f9c", "0")] <= 0.6 * (1 + SLACK) * 2 / 2 + 0.01
    assert exposition.by("vgpu_pod_processes", "pod", "gpu_id")[("idle-0", "0")] == 0
    assert "elsewhere" not in {pod for (_, pod) in pods_of(exposition)}
    # pod_uid joins with kube_pod_info{uid}: the API's UID, a static pod's mirror's, else the cgroup's.
    uids = {pod: uid for (pod, uid) in exposition.by("vgpu_pod_memory_used_bytes", "pod", "pod_uid")}
    assert uids["trainer-7f9c"] == TRAINER
    assert uids["gpu-probe-node-a"] == "f3b5c0de-0000-4000-8000-000000000001"
    assert uids[ORPHAN] == ORPHAN
    # Only this node's pods, and this node itself (its labels: driver upgrades), are ever asked for.
    for request in cluster.api.state.requests:
        assert (request.startswith("/api/v1/pods?") and "fieldSelector=spec.nodeName%3Dnode-a" in request) or (
            request.startswith("/api/v1/nodes?") and "fieldSelector=metadata.name%3Dnode-a" in request
        ), request
    assert any(request.startswith("/api/v1/nodes?") for request in cluster.api.state.requests)


def test_ended_pod_disappears_and_new_pod_appears(cluster: Cluster) -> None:
    with cluster.agent() as agent:
        wait_for(agent, lambda e: ("web", "idle-0") in pods_of(e))
        cluster.api.delete(IDLE)
        cluster.kubelet.remove("web", "idle-0")
        gone = wait_for(agent, lambda e: ("web", "idle-0") not in pods_of(e))
        for family in ("vgpu_pod_memory_used_bytes", "vgpu_pod_processes", "vgpu_pod_sm_utilization_ratio"):
            assert "idle-0" not in {pod for (pod,) in gone.by(family, "pod")}
        cluster.api.put(pod_object("web", "idle-1", IDLE, NODE))
        cluster.kubelet.assign("web", "idle-1", {"main": [f"{U1}::3"]})
        renamed = wait_for(agent, lambda e: ("web", "idle-1") in pods_of(e))
        assert renamed.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id")[("idle-1", "1")] == 40 * GIB
        agent.stop()


def test_by_container(cluster: Cluster) -> None:
    with cluster.agent("--by-container") as agent:
        exposition = wait_for(agent, lambda e: ("web", "idle-0") in pods_of(e))
        agent.stop()
    rows = exposition.by("vgpu_pod_memory_used_bytes", "pod", "container", "gpu_id")
    assert rows[("trainer-7f9c", "trainer", "0")] == 10 * GIB
    assert rows[("trainer-7f9c", "sidecar", "0")] == 2 * GIB
    assert rows[("trainer-7f9c", "trainer", "1")] == 4 * GIB
    assert rows[("idle-0", "main", "0")] == 0
    # the orphan's container is not known to the API: its ID stands in
    assert rows[(ORPHAN, cid("sim-orphan", "main"), "1")] == GIB
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod", "container", "gpu_id")
    assert allocated[("trainer-7f9c", "trainer", "0")] == 2 * 40 * GIB
    # the sidecar was given no device: its GPU use is use without an allocation
    assert allocated[("trainer-7f9c", "sidecar", "0")] == 0


def test_limits_without_pod_resources(cluster: Cluster) -> None:
    with cluster.agent("--no-pod-resources") as agent:
        exposition = wait_for(agent, lambda e: ("ml", "trainer-7f9c") in pods_of(e))
        agent.stop()
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id")
    # 3 GPUs in the trainer's limits, processes on 2 GPUs: 1.5 shares each
    assert allocated[("trainer-7f9c", "0")] == 1.5 * 40 * GIB
    assert allocated[("trainer-7f9c", "1")] == 1.5 * 40 * GIB
    assert allocated[("api-0", "1")] == 40 * GIB
    # which GPU the idle pod holds is not known without the kubelet
    assert "idle-0" not in {pod for (_, pod) in pods_of(exposition)}
    assert cluster.kubelet.calls == 0
    # A reader that is off has no series; the API's are there.
    assert "pod_resources" not in readers(exposition) and readers(exposition)["api_pods"] == 1


def test_kubelet_down_falls_back_then_recovers(cluster: Cluster) -> None:
    cluster.kubelet.unavailable = True
    with cluster.agent() as agent:
        fallback = wait_for(agent, lambda e: ("ml", "trainer-7f9c") in pods_of(e))
        assert fallback.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id")[("trainer-7f9c", "0")] == 1.5 * 40 * GIB
        assert fallback.by("vgpu_agent_collection_errors_total", "stage")[("pod_resources",)] >= 1
        assert fallback.by("vgpu_agent_pod_resources_up") == {(): 0}
        assert readers(fallback)["pod_resources"] == 0
        cluster.kubelet.unavailable = False
        healed = wait_for(agent, lambda e: ("web", "idle-0") in pods_of(e))
        assert healed.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id")[("trainer-7f9c", "0")] == 2 * 40 * GIB
        assert wait_for(agent, lambda e: e.by("vgpu_agent_pod_resources_up") == {(): 1})
        assert wait_for(agent, lambda e: readers(e)["pod_resources"] == 1)
        code, err = agent.stop()
    assert code == 0
    assert err.count("pod-resources API failed") == 1


def test_a_socket_where_the_kubelet_is_not_says_where_to_look(cluster: Cluster, tmp_path: Path) -> None:
    # k0s, microk8s or a custom --root-dir: the manifest's hostPath made an empty
    # directory where /var/lib/kubelet/pod-resources would be.
    empty = tmp_path / "var-lib-kubelet" / "pod-resources"
    empty.mkdir(parents=True)
    args = [*cluster.args]
    args[args.index("--pod-resources-socket") + 1] = str(empty / "kubelet.sock")
    with running_agent(*args, env=cluster.env) as agent:
        exposition = wait_for(agent, lambda e: ("ml", "trainer-7f9c") in pods_of(e))
        assert exposition.by("vgpu_agent_pod_resources_up") == {(): 0}
        assert exposition.by("vgpu_agent_collection_errors_total", "stage")[("pod_resources",)] >= 1
        # Shares from limits: the idle pod's allocation is not seen.
        assert ("web", "idle-0") not in pods_of(exposition)
        code, err = agent.stop()
    assert code == 0
    assert err.count(f"no kubelet pod-resources socket at {empty / 'kubelet.sock'}") == 1, err
    assert "/var/lib/k0s/kubelet" in err and "/var/snap/microk8s/common/var/lib/kubelet" in err


def kubernetes_errors(exposition: Exposition) -> float:
    return exposition.by("vgpu_agent_collection_errors_total", "stage")[("kubernetes",)]


def test_api_down_at_start_then_recovers(cluster: Cluster) -> None:
    cluster.api.state.list_failures = [500]
    cluster.api.state.down = True
    with cluster.in_process() as agent:
        first = agent.scrape()
        assert ("", TRAINER) in pods_of(first), "UIDs stand in while the API is down"
        cluster.api.state.down = False
        healed = wait_for(agent, lambda e: ("ml", "trainer-7f9c") in pods_of(e), timeout=30)
        assert ("", TRAINER) not in pods_of(healed)
        assert healed.by("vgpu_agent_collection_errors_total", "stage")[("kubernetes",)] >= 1
        code, err = agent.stop()
    assert code == 0
    assert "Kubernetes API reachable again" in err


def test_refused_token_leaves_uids_and_says_what_is_needed(cluster: Cluster) -> None:
    (cluster.account / "token").write_text("wrong-token")
    with cluster.in_process() as agent:
        wait_until(lambda: "refused the agent" in agent.logged(), what="the refusal logged")
        wait_until(
            lambda: cluster.api.state.lists + cluster.api.state.watches == 0 and len(cluster.api.state.requests) >= 2
        )
        exposition = agent.scrape()
        code, err = agent.stop()
    assert code == 0
    assert ("", TRAINER) in pods_of(exposition)
    assert "refused the agent (401)" in err and "get, list and watch on pods" in err
    # Each refusal said once, not once a retry: the pods' and, where its watch has started by the
    # stop (a matter of timing), the node's, which asks for another permission.
    assert err.count("refused the agent (401): it needs get, list and watch on pods") == 1
    node_refusal = "refused the agent (401) reading node node-a: it needs get, list and watch on nodes"
    assert err.count(node_refusal) <= 1
    assert err.count("refused the agent") == 1 + err.count(node_refusal), err


def test_watch_410_and_broken_stream_relist(cluster: Cluster) -> None:
    with cluster.agent() as agent:
        wait_for(agent, lambda e: ("ml", "trainer-7f9c") in pods_of(e))
        lists, watches = cluster.api.state.lists, cluster.api.state.watches
        cluster.api.compact()
        cluster.api.put(pod_object("web", "after-410", "11111111-aaaa-4000-8000-000000000000", NODE))
        cluster.kubelet.assign("web", "after-410", {"main": [f"{U0}::5"]})
        wait_for(agent, lambda e: ("web", "after-410") in pods_of(e))
        assert cluster.api.state.lists > lists, "410 Gone must lead to a new list"

        # The watch that follows the new list is open before it is broken (else the next pod
        # could arrive on a watch started after the break, with no list in between).
        wait_until(lambda: cluster.api.state.watches > watches, what="the watch after the new list")
        lists = cluster.api.state.lists
        cluster.api.break_watches()
        cluster.api.put(pod_object("web", "after-break", "22222222-aaaa-4000-8000-000000000000", NODE))
        cluster.kubelet.assign("web", "after-break", {"main": [f"{U1}::5"]})
        wait_for(agent, lambda e: ("web", "after-break") in pods_of(e))
        assert cluster.api.state.lists > lists, "a broken watch must lead to a new list"
        agent.stop()


def test_slow_api_does_not_hold_scrapes(cluster: Cluster) -> None:
    cluster.api.state.list_delay = 3.0
    with cluster.in_process() as agent:
        started = time.monotonic()
        status, _, _ = get(f"{agent.url}/metrics")
        assert status == 200 and time.monotonic() - started < 2  # well within the list's 3 s
        wait_for(agent, lambda e: ("ml", "trainer-7f9c") in pods_of(e), timeout=20)
        agent.stop()


def test_tls_is_verified_against_the_service_account_ca(cluster: Cluster, tmp_path: Path) -> None:
    other = make_certs(tmp_path / "other-pki")
    (cluster.account / "ca.crt").write_bytes(other.ca.read_bytes())
    with cluster.in_process() as agent:
        wait_until(lambda: "certificate verify failed" in agent.logged().lower(), what="the TLS failure logged")
        exposition = agent.scrape()
        code, err = agent.stop()
    assert code == 0
    assert ("", TRAINER) in pods_of(exposition)
    assert cluster.api.state.lists == 0, "no request may pass an unverified TLS handshake"
    assert "CERTIFICATE_VERIFY_FAILED" in err or "certificate verify failed" in err


def test_no_kubernetes_flag(cluster: Cluster) -> None:
    with cluster.agent("--no-kubernetes") as agent:
        exposition = agent.scrape()
        code, err = agent.stop()
    # the simulated node's own directory names the pods; the API is never asked
    assert ("default", "sim-trainer") in pods_of(exposition)
    assert cluster.api.state.requests == []
    assert code == 0
    assert "Kubernetes API off (--no-kubernetes)" not in err  # names are resolved, so nothing to warn of


def test_api_going_down_mid_run_keeps_names_and_catches_up(cluster: Cluster) -> None:
    with cluster.in_process() as agent:
        wait_for(agent, lambda e: ("ml", "trainer-7f9c") in pods_of(e))
        cluster.api.state.down = True
        cluster.api.break_watches()
        during = wait_for(agent, lambda e: kubernetes_errors(e) >= 2)  # relists refused
        assert ("ml", "trainer-7f9c") in pods_of(during), "names known before the outage stay"
        cluster.api.put(pod_object("web", "born-in-outage", "33333333-aaaa-4000-8000-000000000000", NODE))
        cluster.kubelet.assign("web", "born-in-outage", {"main": [f"{U0}::7"]})
        cluster.api.state.down = False
        wait_for(agent, lambda e: ("web", "born-in-outage") in pods_of(e), timeout=20)
        code, _ = agent.stop()
    assert code == 0


def test_every_reader_has_its_last_pass_and_an_api_outage_reads_0_until_a_list_answers(cluster: Cluster) -> None:
    everyone = {"sweep", "process_watch", "gpm", "health", "xid", "pod_resources", "api_pods", "api_node"}
    # GPM windows of half a second: the gpm reader's first pass closes one.
    with agent_in_process(*cluster.args, env=cluster.env, engine_every_s=0.5) as agent:
        # The health reader's first round may come before the first sweep, and the next 10 s on.
        seen = wait_for(agent, lambda e: readers(e) == dict.fromkeys(everyone, 1), timeout=30)
        assert set(seen.by("vgpu_agent_reader_duration_seconds", "reader")) == {(r,) for r in everyone}
        cluster.api.state.down = True
        cluster.api.break_watches()
        during = wait_for(agent, lambda e: readers(e)["api_pods"] == readers(e)["api_node"] == 0)
        assert readers(during)["sweep"] == readers(during)["pod_resources"] == 1  # the others read on
        cluster.api.state.down = False
        wait_for(agent, lambda e: readers(e) == dict.fromkeys(everyone, 1), timeout=30)
        code, _ = agent.stop()
    assert code == 0


def test_malformed_list_and_forbidden_are_retried(cluster: Cluster) -> None:
    cluster.api.state.garbage_lists = 1
    cluster.api.state.forbidden = True
    with cluster.in_process() as agent:
        refused = wait_for(agent, lambda e: kubernetes_errors(e) >= 2)  # the garbage list, then a 403
        assert ("", TRAINER) in pods_of(refused)
        cluster.api.state.forbidden = False
        wait_for(agent, lambda e: ("ml", "trainer-7f9c") in pods_of(e), timeout=20)
        code, err = agent.stop()
    assert code == 0
    assert "refused the agent (403)" in err


def test_a_hung_watch_is_abandoned_and_the_pods_listed_again(cluster: Cluster) -> None:
    with cluster.in_process("--kube-watch-seconds", "1") as agent:
        wait_for(agent, lambda e: ("ml", "trainer-7f9c") in pods_of(e))
        lists, watches = cluster.api.state.lists, cluster.api.state.watches
        cluster.api.state.hang_watches = True
        cluster.api.break_watches()  # the running watch ends; every new one hangs
        wait_until(lambda: cluster.api.state.lists > lists, what="the relist after the broken watch")
        wait_until(lambda: cluster.api.state.watches > watches + 1, what="a watch that will never say anything")
        lists = cluster.api.state.lists
        cluster.api.put(pod_object("web", "after-hang", "44444444-aaaa-4000-8000-000000000000", NODE))
        cluster.kubelet.assign("web", "after-hang", {"main": [f"{U1}::6"]})
        wait_for(agent, lambda e: ("web", "after-hang") in pods_of(e), timeout=20)
        assert cluster.api.state.lists > lists

        # The abandoned loop's thread, still inside its read of a watch the server never ends,
        # is woken (its socket shut down) and ends, closing its own connection: closed from
        # another thread, its descriptor would be free for the next socket while still read.
        def loops() -> list[str]:
            return [t.name for t in threading.enumerate() if t.name.startswith("kubernetes-pods-")]

        wait_until(lambda: len(loops()) == 1, what="every abandoned loop's thread ended but the current one")
        code, err = agent.stop()
    assert code == 0 and "no word from the Kubernetes API watch" in err


def test_a_watch_line_that_never_ends_is_cut_at_its_bound_and_the_pods_listed_again(cluster: Cluster) -> None:
    from otel_vgpu.kubernetes.bounded import MAX_WATCH_LINE_BYTES  # noqa: PLC0415
    from testkit.procstat import rss_mib  # noqa: PLC0415

    with cluster.agent() as agent:
        wait_for(agent, lambda e: ("ml", "trainer-7f9c") in pods_of(e))
        before = rss_mib(agent.process.pid)
        peak = [before]
        done = threading.Event()

        def watch_memory() -> None:
            while not done.wait(0.02):
                peak[0] = max(peak[0], rss_mib(agent.process.pid))

        watcher = threading.Thread(target=watch_memory, daemon=True)
        watcher.start()
        lists = cluster.api.state.lists
        cluster.api.state.endless_watch_line = 12 * MAX_WATCH_LINE_BYTES  # 96 MiB of one line
        cluster.api.break_watches()
        wait_until(lambda: cluster.api.state.endless_watch_line == 0, what="the endless line sent")
        cluster.api.put(pod_object("web", "after-endless", "55555555-aaaa-4000-8000-000000000000", NODE))
        cluster.kubelet.assign("web", "after-endless", {"main": [f"{U1}::7"]})
        wait_for(agent, lambda e: ("web", "after-endless") in pods_of(e), timeout=30)
        done.set()
        watcher.join()
        assert cluster.api.state.lists > lists, "listed again"
        # Held to its bound (and a few copies of it), not the 96 MiB sent.
        assert peak[0] < before + 5 * MAX_WATCH_LINE_BYTES / 2**20, (before, peak[0])
        code, err = agent.stop()
    assert code == 0
    assert err.count(f"more than {MAX_WATCH_LINE_BYTES} bytes without a newline") == 1, err


def test_phases_annotations_claims_and_replica_counts_through_the_real_protocols(
    cluster: Cluster, tmp_path: Path
) -> None:
    job, hami, bad = (
        "b7d1c1aa-0000-4000-8000-000000000001",
        "b7d1c1aa-0000-4000-8000-000000000002",
        "b7d1c1aa-0000-4000-8000-000000000003",
    )
    # A finished Job the kubelet still lists (before 1.34), with a replica it also gave api-0.
    cluster.api.put(pod_object("batch", "job-done", job, NODE, phase="Succeeded"))
    cluster.kubelet.assign("batch", "job-done", {"main": [f"{U1}::1"]})
    # HAMi: the annotation (init container first) decides; the kubelet's HAMi ID does not count.
    annotation = {"hami.io/vgpu-devices-allocated": f";{U0},NVIDIA,4000,25:;"}
    cluster.api.put(pod_object("ai", "hami-0", hami, NODE, annotations=annotation, init_containers=("setup",)))
    cluster.kubelet.assign("ai", "hami-0", {"main": [f"{U0}-3"]})
    cluster.api.put(pod_object("ai", "bad-0", bad, NODE, annotations={"hami.io/vgpu-devices-allocated": "garbage"}))
    # DRA: the whole of GPU 1 (minor 1) through a claim, on top of idle-0's replica of GPU 0.
    cluster.kubelet.claim("web", "idle-0", "main", "idle-gpu", "gpu.nvidia.com", NODE, "gpu-1")
    cluster.kubelet.allocatable = {"nvidia.com/gpu": [f"{U0}::{n}" for n in range(4)]}
    auto = tmp_path / "auto.txt"
    auto.write_text("auto\n")
    with cluster.in_process("--allocation-file", str(auto)) as agent:
        exposition = wait_for(agent, lambda e: ("ai", "hami-0") in pods_of(e))
        log = agent.logged()
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id")
    assert allocated[("hami-0", "0")] == 4000 * MIB
    assert ("hami-0", "1") not in allocated
    assert allocated[("idle-0", "0")] == 80 * GIB / 4  # auto: 4 replicas of GPU 0
    assert allocated[("idle-0", "1")] == 80 * GIB  # the claim's whole GPU
    assert allocated[("api-0", "1")] == 80 * GIB  # GPU 1 has no replicas: ratio 1
    assert "job-done" not in {pod for (pod, _) in allocated}
    assert exposition.by("vgpu_gpu_vgpus", "gpu_id") == {("0",): 4, ("1",): 1}
    assert exposition.by("vgpu_agent_collection_errors_total", "stage")[("pod_annotations",)] >= 1
    assert "pod ai/bad-0: annotation hami.io/vgpu-devices-allocated" in log
