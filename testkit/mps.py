"""A real MPS control daemon for the GPU scripts (bench/gpu_validate_sharing.py,
bench/gpu_validate_tenants.py), started in a pod's container cgroup and told to quit after."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from testkit.cuda_workloads import in_cgroup
from testkit.host_pods import HostPod, new_container


@dataclass
class MpsDaemon:
    env: dict[str, str]
    """What a client's environment needs to reach this daemon (its pipe and log directories)."""
    quit_code: int | None = field(default=None)
    """How `quit` exited, once the daemon was told to."""


@contextlib.contextmanager
def mps_daemon(pod: HostPod, directory: Path) -> Iterator[MpsDaemon]:
    """`nvidia-cuda-mps-control -f` in a new container cgroup of `pod`, its pipe and logs under
    `directory`: the server it spawns for its first client inherits the cgroup, as in a
    container. On leaving, it is told to quit, and killed if it does not within 30 s."""
    pipe, logs = directory / "mps-pipe", directory / "mps-log"
    pipe.mkdir(parents=True)
    logs.mkdir(parents=True)
    daemon = MpsDaemon({"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)})
    process = subprocess.Popen(
        in_cgroup(new_container(pod), ["nvidia-cuda-mps-control", "-f"]),
        env={**os.environ, **daemon.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield daemon
    finally:
        told = subprocess.run(
            ["nvidia-cuda-mps-control"],
            input="quit\n",
            text=True,
            env={**os.environ, **daemon.env},
            timeout=30,
            check=False,
        )
        daemon.quit_code = told.returncode
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
