"""An agent outside the host's PID namespace is blind, and says so.

Drivers since 535.113 list only the GPU processes that have a PID in the
caller's PID namespace. The simulated node models that; these tests run the
agent in a PID namespace of its own (`unshare --pid`, as a pod without
hostPID is) and in the host's, and check what the agent reports in each.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from otel_vgpu.gpu.backend import Device, GpuProcess, MigDevice
from otel_vgpu.gpu.pidns import IDLE_MEMORY_BYTES, PROC_PID_INIT_INO, blind_gpus, in_host_pid_namespace
from otel_vgpu.sim.node import SimulatedNode
from otel_vgpu.sim.scenario import Scenario
from otel_vgpu.sim.scenario_file import parse_scenario
from testkit.agent import clean_env, command, free_port, get, wait_serving
from testkit.procstat import children
from testkit.promtext import parse

from ..conftest import GIB, STEADY, make_sampler


def device(index: int = 0, memory_used: int = 0, utilization: float = 0.0, mig: tuple[str, ...] = ()) -> Device:
    migs = tuple(MigDevice(uuid, "1g.18gb", 18 * GIB, 0) for uuid in mig)
    return Device(index, f"GPU-{index}", "H200", 141 * GIB, memory_used, utilization, migs=migs)


PROCESS = [GpuProcess(pid=10, used_memory=GIB)]


def test_blind_gpus_are_busy_or_holding_memory_with_no_process_listed() -> None:
    readings = [
        (device(0, utilization=1.0), []),  # busy, nothing listed
        (device(1, memory_used=18 * GIB), []),  # holding memory, nothing listed
        (device(2, memory_used=IDLE_MEMORY_BYTES), []),  # idle: the driver's own reservations
        (device(3, memory_used=18 * GIB, utilization=1.0), PROCESS),  # its processes are listed
        (device(4, utilization=1.0), None),  # the listing failed: an error, not blindness
        (device(5, utilization=1.0, mig=("MIG-a",)), []),  # MIG: processes live on MIG devices
    ]
    assert [gpu.index for gpu in blind_gpus(readings, in_host_namespace=False)] == [0, 1]
    # in the host's namespace, or where that cannot be told, an empty GPU is just empty
    assert blind_gpus(readings, in_host_namespace=True) == ()
    assert blind_gpus(readings, in_host_namespace=None) == ()


def test_namespace_test_is_the_kernel_initial_inode(tmp_path: Path) -> None:
    assert in_host_pid_namespace(str(tmp_path / "missing")) is None
    other = tmp_path / "file"
    other.write_text("")
    assert os.stat(other).st_ino != PROC_PID_INIT_INO
    assert in_host_pid_namespace(str(other)) is False


def scenario(filter_pids: bool = True) -> Scenario:
    return parse_scenario(STEADY + f"driver: {{pid_namespace_filter: {str(filter_pids).lower()}}}\n", "steady.yaml")


def test_sampler_outside_the_host_namespace_reports_blind_gpus_and_logs_once(
    tmp_path: Path, ratio_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = SimulatedNode(scenario(), tmp_path / "proc", host_pid_namespace=False)
    sampler = make_sampler(node, ratio_file, host_pid_namespace=False)
    with caplog.at_level(logging.INFO, logger="otel_vgpu"):
        first = sampler.snapshot(0.0)
        second = sampler.snapshot(0.0)
    node.close()
    assert [gpu.uuid for gpu in first.blind] == [gpu.uuid for gpu in first.gpus] == [gpu.uuid for gpu in second.blind]
    # unknown, not zero: no pod rows (no false idle allocations), no unattributed figure
    assert first.ok and first.pods == ()
    assert [gpu.unattributed_memory for gpu in first.gpus] == [None, None]
    assert [gpu.unlisted_memory for gpu in first.gpus] == [None, None], "what the driver hides is not unlisted"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, "logged once, not every sweep"
    assert "hostPID: true" in errors[0].getMessage() and "GPU 0" in errors[0].getMessage()


@pytest.mark.parametrize(
    ("filter_pids", "host_namespace"), [(True, True), (False, False), (False, True)], ids=["host", "old-driver", "both"]
)
def test_sampler_sees_every_process_when_the_driver_shows_them(
    tmp_path: Path, ratio_file: Path, filter_pids: bool, host_namespace: bool
) -> None:
    node = SimulatedNode(scenario(filter_pids), tmp_path / "proc", host_pid_namespace=host_namespace)
    snapshot = make_sampler(node, ratio_file, host_pid_namespace=host_namespace).snapshot(0.0)
    node.close()
    assert snapshot.blind == ()
    assert {(row.namespace, row.pod) for row in snapshot.pods} >= {("ml", "trainer"), ("web", "api")}


# --- the agent as a process, in a PID namespace of its own -------------------------

UNSHARE = shutil.which("unshare")


def in_own_pid_namespace(*args: str) -> list[str]:
    """The command in a new PID namespace with its own /proc, as a pod without hostPID."""
    assert UNSHARE, "unshare comes with util-linux"
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [UNSHARE, *user, "--pid", "--fork", "--kill-child", "--mount-proc", *args]


def run_and_scrape(cmd: list[str]) -> tuple[int, bytes, bytes, str]:
    """Start the agent, wait for it to serve, then return /readyz, /metrics and its log."""
    port = cmd[cmd.index("--port") + 1]
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        wait_serving(url, process, lambda: process.communicate()[1])
        ready, ready_body, _ = get(f"{url}/readyz")
        status, metrics, _ = get(f"{url}/metrics")
        assert status == 200
    finally:
        stop(process)
        _, err = process.communicate(timeout=10)
    return ready, ready_body, metrics, err


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the agent, as the kubelet sends it to a container's first
    process. unshare ignores SIGTERM while it waits, so its child gets it."""
    if process.args[0] == UNSHARE:  # type: ignore[index]
        for child in children(process.pid):
            os.kill(child, signal.SIGTERM)
    else:
        process.terminate()


def agent_command(tmp_path: Path, ratio_file: Path, filter_pids: bool = True) -> list[str]:
    path = tmp_path / "node.yaml"
    path.write_text(STEADY + f"driver: {{pid_namespace_filter: {str(filter_pids).lower()}}}\n")
    return command(
        "--simulate", str(path), "--allocation-file", str(ratio_file), "--no-kubernetes",
        "--address", "127.0.0.1", "--port", str(free_port()),
    )  # fmt: skip


def test_agent_without_host_pid_says_it_is_blind(tmp_path: Path, ratio_file: Path) -> None:
    ready, body, metrics, err = run_and_scrape(in_own_pid_namespace(*agent_command(tmp_path, ratio_file)))
    exposition = parse(metrics.decode())
    assert exposition.series("vgpu_agent_blind_gpus") == {frozenset(): 2}
    assert exposition.series("vgpu_pod_memory_used_bytes") == {}
    assert exposition.series("vgpu_pod_memory_allocated_bytes") == {}, "no false idle allocations"
    assert exposition.series("vgpu_gpu_memory_unattributed_bytes") == {}, "unknown, not zero"
    # the devices themselves are still reported, busy and holding memory
    assert all(v > IDLE_MEMORY_BYTES for v in exposition.series("vgpu_gpu_memory_used_bytes").values())
    assert ready == 503
    assert b"hostPID: true" in body and b"NVML lists no process" in body
    blind_lines = [line for line in err.splitlines() if " ERROR " in line]
    assert len(blind_lines) == 1 and "hostPID: true" in blind_lines[0], err


def test_agent_in_the_host_namespace_sees_every_pod(tmp_path: Path, ratio_file: Path) -> None:
    assert in_host_pid_namespace() is True, "this test needs the machine's initial PID namespace"
    ready, _, metrics, err = run_and_scrape(agent_command(tmp_path, ratio_file))
    exposition = parse(metrics.decode())
    assert ready == 200
    assert exposition.series("vgpu_agent_blind_gpus") == {frozenset(): 0}
    pods = {(ns, pod) for ns, pod in exposition.by("vgpu_pod_memory_used_bytes", "namespace", "pod")}
    assert {("ml", "trainer"), ("web", "api"), ("kube-system", "probe")} <= pods
    assert "hostPID" not in err


def test_agent_without_host_pid_on_an_older_driver_sees_every_pod(tmp_path: Path, ratio_file: Path) -> None:
    # Before 535.113 NVML listed host PIDs to every caller: the pod's own PID
    # namespace did not matter, only reading the host's /proc did.
    cmd = in_own_pid_namespace(*agent_command(tmp_path, ratio_file, filter_pids=False))
    ready, _, metrics, _ = run_and_scrape(cmd)
    exposition = parse(metrics.decode())
    assert ready == 200
    assert exposition.series("vgpu_agent_blind_gpus") == {frozenset(): 0}
    assert exposition.by("vgpu_pod_memory_used_bytes", "pod", "gpu_id")[("trainer", "0")] == 12 * GIB
