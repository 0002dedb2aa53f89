"""The container image, built once per test session in the background.

Building it takes a minute and a half (a Debian root from debootstrap, then
the two-stage build), almost all of it waiting on the network and the disk.
conftest.py starts the build as soon as the tests are collected, niced, and
puts the image tests last, so the build runs while the other tests do.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from testkit.agent import ROOT

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# The sandbox refuses the default rlimits runc asks for.
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
TAG = "localhost/otel-vgpu:test"
# The build yields the processor to the tests that run meanwhile.
NICE = ("nice", "-n", "15")


class Podman:
    def __init__(self, root: Path) -> None:
        binary = shutil.which("podman")
        assert binary, "podman is installed by scripts/test.sh"
        self.base = [
            *NICE,
            binary,
            "--root",
            str(root / "storage"),
            "--runroot",
            str(root / "run"),
            "--runtime",
            "runc",
            "--storage-driver",
            "vfs",
        ]

    def __call__(self, *args: str, check: bool = True, timeout: float = 600, stdin: bytes | None = None) -> str:
        result = subprocess.run([*self.base, *args], capture_output=True, input=stdin, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} failed:\n{result.stdout.decode()}\n{result.stderr.decode()}")
        return result.stdout.decode()

    def logs(self, name: str) -> str:
        result = subprocess.run([*self.base, "logs", name], capture_output=True, timeout=60, check=False)
        return result.stdout.decode() + result.stderr.decode()


class ImageBuild:
    """The image build on its own thread; `result()` waits for it."""

    def __init__(self) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="otel-vgpu-image-"))
        self.podman = Podman(self.work)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._build, name="image-build", daemon=True)

    def start(self) -> ImageBuild:
        self._thread.start()
        return self

    def result(self, timeout: float = 1200) -> tuple[Podman, str]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the image build did not finish"
        if self._error is not None:
            raise self._error
        return self.podman, TAG

    def clean(self) -> None:
        self._thread.join(60)
        self.podman("rm", "--all", "--force", check=False)
        self.podman("rmi", "--all", "--force", check=False)
        shutil.rmtree(self.work, ignore_errors=True)

    def _build(self) -> None:
        try:
            debootstrap = shutil.which("debootstrap")
            assert debootstrap, "debootstrap is installed by scripts/test.sh"
            rootfs = self.work / "rootfs"
            subprocess.run(
                [*NICE, debootstrap, "--variant=minbase", "--include=python3,python3-venv", "bookworm",
                 str(rootfs), "http://deb.debian.org/debian"],
                check=True,
                capture_output=True,
                timeout=900,
            )  # fmt: skip
            tarball = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
            self.podman("import", "-", "localhost/otel-vgpu-test-base:latest", stdin=tarball)
            shutil.rmtree(rootfs, ignore_errors=True)
            self.podman(
                "build", "--network", "host", *ULIMITS, "-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro",
                "--build-arg", "BASE_IMAGE=localhost/otel-vgpu-test-base:latest", "-t", TAG, str(ROOT),
            )  # fmt: skip
        except BaseException as error:  # handed to the test that waits for it
            self._error = error


_build: ImageBuild | None = None


def start_build() -> ImageBuild:
    """The session's build, started on first call."""
    global _build
    if _build is None:
        _build = ImageBuild().start()
    return _build
