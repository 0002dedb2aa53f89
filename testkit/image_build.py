"""The container image, built once per test session in the background.

Building it takes about two minutes (a Debian root from debootstrap, then the
two-stage build: scripts/build-test-image.sh), most of it waiting on the
network and the disk. scripts/test.sh starts it first, before it installs
anything, and names its folder (SHARED_BUILD): the image tests wait for the
build's mark there. Without it, the xdist controller starts the build as the
session starts, or a single pytest process as soon as the tests are
collected, niced, with the image tests last, so the build runs while the
other tests do. One build a session: no worker builds a second image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from testkit.agent import ROOT

# The sandbox refuses the default rlimits runc asks for.
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
TAG = "localhost/otel-vgpu:test"
# The build yields the processor to the tests that run meanwhile.
NICE = ("nice", "-n", "15")
BUILD_SCRIPT = ROOT / "scripts" / "build-test-image.sh"
# The environment variable that names a build started by another process of the session.
SHARED_BUILD = "TESTKIT_IMAGE_DIR"
# The marks a finished build leaves in its folder (scripts/build-test-image.sh).
BUILT, FAILED = "built", "failed"


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

    def __init__(self, work: Path | None = None) -> None:
        """`work`: the folder of a build another process of the session runs, to wait for."""
        self.shared = work is not None
        self.work = work or Path(tempfile.mkdtemp(prefix="otel-vgpu-image-"))
        self.podman = Podman(self.work)
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._wait if self.shared else self._build, name="image-build", daemon=True
        )

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
        if self.shared:
            return  # whoever started the build cleans it
        self._thread.join(60)
        subprocess.run([str(BUILD_SCRIPT), "--clean", str(self.work)], check=False, timeout=300)

    def _build(self) -> None:
        # One build, the script's: scripts/test.sh runs it before the tests start.
        subprocess.run([str(BUILD_SCRIPT), str(self.work)], check=False, timeout=1500)
        self._wait()

    def _wait(self) -> None:
        """For a build another process runs: its mark, polled."""
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline:
            if (self.work / BUILT).exists():
                return
            if (self.work / FAILED).exists():
                self._error = AssertionError(f"the image build failed: {(self.work / FAILED).read_text()}")
                return
            time.sleep(0.5)
        self._error = AssertionError("the image build did not finish")


def unbuildable() -> str | None:
    """Why the image cannot be built on this machine, for its tests to skip with; None where it can."""
    return None if shutil.which("podman") else "podman is not installed (scripts/test.sh installs it)"


_build: ImageBuild | None = None


def start_build() -> ImageBuild:
    """The session's build, started on first call (or the one another process started)."""
    global _build
    if _build is None:
        shared = os.environ.get(SHARED_BUILD)
        _build = ImageBuild(Path(shared) if shared else None).start()
    return _build
