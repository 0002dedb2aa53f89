"""GPU driver upgrades by the GPU Operator: the agent lets go of NVML while
the driver manager has paused the node's GPU operands, and comes back after.

The driver manager's node-label protocol is played against the Kubernetes
API double (testkit/driver_manager.py); the simulated driver keeps a file
open while NVML is in use, as NVML keeps /dev/nvidiactl, and the module's
unload is refused while any process holds it."""

from __future__ import annotations

import contextlib
import http.client
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_vgpu.kubernetes.driver_upgrade import driver_pause
from testkit.agent import Agent, clean_env, get, running_agent, wait_until
from testkit.certs import make_certs
from testkit.driver_manager import OPERATOR_LABELS, PAUSED, DriverManager, maybe_set_paused, maybe_set_true
from testkit.kube_api_double import KubeApiDouble, pod_object
from testkit.promtext import Exposition
from testkit.sim_cluster import service_account

NODE = "gpu-node-1"
UID = "3b0c6f52-5d8e-4d3b-9a57-1f6f0d0d2c11"
SCENARIO = f"""
gpus:
  - {{memory: 80GiB}}
  - {{memory: 80GiB}}
pods:
  - namespace: ml
    name: trainer-0
    uid: {UID}
    processes:
      - {{gpu: 0, memory: 10GiB, sm: 0.5}}
"""
# How soon NVML must be let go of once the label changes: the watch brings the
# change at once and one sweep (milliseconds here) may be in flight; the rest is
# room for a loaded machine. docs/kubernetes.md states the bound.
RELEASE_WITHIN_S = 10.0


@dataclass
class Node:
    api: KubeApiDouble
    manager: DriverManager
    args: list[str]
    env: dict[str, str]


@pytest.fixture
def node(tmp_path: Path, ratio_file: Path) -> Iterator[Node]:
    certs = make_certs(tmp_path / "pki")
    account = service_account(tmp_path, certs)
    api = KubeApiDouble(certs, NODE).start()
    api.put(pod_object("ml", "trainer-0", UID, NODE))
    manager = DriverManager(api, NODE)
    manager.label_as_the_operator_does()
    scenario = tmp_path / "node.yaml"
    scenario.write_text(SCENARIO)
    env = clean_env(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=str(api.port))
    args = [
        *("--simulate", str(scenario), "--allocation-file", str(ratio_file), "--min-interval", "0"),
        *("--node-name", NODE, "--service-account-dir", str(account), "--no-pod-resources"),
    ]
    yield Node(api, manager, args, env)
    api.stop()


def driver_file_of(pid: int) -> Path | None:
    """The simulated driver file the agent holds open, found through its descriptors."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.endswith("/nvidiactl"):
            return Path(target)
    return None


def ready(agent: Agent) -> tuple[int, str]:
    status, body, _ = get(f"{agent.url}/readyz", timeout=10)
    return status, body.decode()


def gpus(exposition: Exposition) -> set[str]:
    return {gpu for (gpu,) in exposition.by("vgpu_gpu_memory_total_bytes", "gpu_id")}


def test_the_agent_lets_go_of_the_driver_for_an_upgrade_and_comes_back(node: Node) -> None:
    with running_agent(*node.args, env=node.env) as agent:
        wait_until(lambda: ready(agent)[0] == 200, what="ready")
        first = agent.scrape()
        assert gpus(first) == {"0", "1"} and first.value("vgpu_agent_driver_paused") == 0
        assert first.by("vgpu_pod_memory_used_bytes", "pod") == {("trainer-0",): 10 * 2**30}
        driver = wait_until(lambda: driver_file_of(agent.process.pid), what="the driver file held")
        assert node.manager.unload(driver) == [agent.process.pid], "while the agent runs, the driver is in use"

        node.manager.pause()
        paused_at = time.monotonic()
        wait_until(lambda: not node.manager.unload(driver), timeout=RELEASE_WITHIN_S, what="NVML released")
        released_after = time.monotonic() - paused_at
        assert released_after < RELEASE_WITHIN_S
        status, body = ready(agent)
        assert status == 503 and "driver is upgraded" in body and PAUSED in body, body
        during = agent.scrape()
        assert during.value("vgpu_agent_driver_paused") == 1
        assert not gpus(during) and not during.series("vgpu_pod_memory_used_bytes"), "no figures while away"
        # Scrapes while paused never take the driver again.
        assert node.manager.unload(driver) == []

        node.manager.reschedule()
        wait_until(lambda: gpus(agent.scrape()) == {"0", "1"}, what="GPU series back")
        after = agent.scrape()
        assert after.value("vgpu_agent_driver_paused") == 0
        assert after.by("vgpu_pod_memory_used_bytes", "pod") == {("trainer-0",): 10 * 2**30}
        assert ready(agent)[0] == 200
        assert node.manager.unload(driver) == [agent.process.pid]
        errors = after.by("vgpu_agent_collection_errors_total", "stage")
        assert all(count == 0 for count in errors.values()), "an upgrade is not an error"

        status, log = agent.stop()
    assert status == 0
    assert log.count("NVML released") == 1 and log.count("upgrade is over") == 1, log
    assert "nvidia.com/gpu.deploy." in log


def test_without_rights_on_nodes_the_agent_works_and_says_what_it_needs(node: Node) -> None:
    node.api.state.forbid_nodes = True
    with running_agent(*node.args, env=node.env) as agent:
        exposition = wait_until(
            lambda: (e := agent.scrape()).by("vgpu_agent_collection_errors_total", "stage").get(("node",)) and e,
            what="the node stage counted",
        )
        assert exposition.by("vgpu_pod_memory_used_bytes", "namespace", "pod") == {("ml", "trainer-0"): 10 * 2**30}
        assert ready(agent)[0] == 200
        _, log = agent.stop()
    assert log.count("get, list and watch on nodes") == 1, log


def test_a_library_that_no_longer_matches_the_driver_ends_the_agent(tmp_path: Path, ratio_file: Path) -> None:
    # After an upgrade the container still holds the old driver's libnvidia-ml.so.1:
    # NVML answers LIB_RM_VERSION_MISMATCH, and only a restart brings the new one.
    scenario = tmp_path / "mismatch.yaml"
    scenario.write_text(SCENARIO + "faults:\n  - {call: device_count, code: LIB_RM_VERSION_MISMATCH, from_s: 1.0}\n")
    with running_agent("--simulate", str(scenario), "--allocation-file", str(ratio_file), "--min-interval", "0") as a:

        def ended() -> bool:
            # The probes sweep, as the kubelet's would; the agent ends on the sweep that meets the fault.
            # The agent may end in the middle of this very answer: a cut read is no failure.
            with contextlib.suppress(OSError, http.client.HTTPException):
                get(f"{a.url}/readyz", timeout=5)
            return a.process.poll() is not None

        wait_until(ended, what="the agent's exit")
        status, log = a.process.returncode, a.process.communicate()[1]
    assert status == 3, log
    assert "restarts with the new driver's library" in log


@pytest.mark.parametrize(
    ("labels", "paused"),
    [
        ({"nvidia.com/gpu.deploy.device-plugin": "true"}, None),
        ({"nvidia.com/gpu.deploy.device-plugin": "false"}, None),
        ({"nvidia.com/gpu.present": "true", "kubernetes.io/os": "linux"}, None),
        ({"nvidia.com/gpu.deploy.device-plugin": PAUSED}, f"nvidia.com/gpu.deploy.device-plugin={PAUSED}"),
        # a value other than true keeps its own word before the suffix (maybeSetPaused)
        (
            {"nvidia.com/gpu.deploy.client": f"pre-installed_{PAUSED}"},
            f"nvidia.com/gpu.deploy.client=pre-installed_{PAUSED}",
        ),
        # another label that happens to say paused is none of the operator's business
        ({"example.com/state": PAUSED}, None),
    ],
)
def test_what_counts_as_paused(labels: dict[str, str], paused: str | None) -> None:
    assert driver_pause(labels) == paused


def test_the_driver_managers_label_values_round_trip() -> None:
    # maybeSetPaused / maybeSetTrue of k8s-driver-manager, as the double plays them
    for value in ("true", "pre-installed", "false", ""):
        assert maybe_set_true(maybe_set_paused(value)) == value
    paused = {key: maybe_set_paused(value) for key, value in OPERATOR_LABELS.items()}
    assert driver_pause(paused) is not None
    assert driver_pause(OPERATOR_LABELS) is None
