"""A skip fails a run that has installed every tool (testkit/skips.py), and elsewhere passes;
where podman is missing the image tests skip, saying why (testkit/image_build.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import image_build
from testkit.agent import ROOT
from testkit.skips import NO_SKIPS

# A test that skips beside one that passes, and a module skipped as it is collected.
SKIPPING = {
    "test_one.py": (
        "import pytest\n\n\ndef test_runs() -> None:\n    pass\n\n\n"
        "def test_needs_a_tool() -> None:\n    pytest.skip('frobnicate is not installed')\n"
    ),
    "test_two.py": "import pytest\n\npytest.skip('no frobnicator here', allow_module_level=True)\n",
}


def run_pytest(folder: Path, *options: str, no_skips: str | None) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("PYTEST_", NO_SKIPS))}
    env["PYTHONPATH"] = str(ROOT)
    if no_skips is not None:
        env[NO_SKIPS] = no_skips
    command = [sys.executable, "-m", "pytest", "-p", "testkit.skips", "-p", "no:cacheprovider", "-rs", *options]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def skipping(tmp_path: Path) -> Path:
    for name, text in SKIPPING.items():
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one process", "xdist"])
def test_a_skip_fails_the_run_where_every_tool_is_installed(skipping: Path, workers: tuple[str, ...]) -> None:
    run = run_pytest(skipping, *workers, no_skips="1")
    said = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, said
    assert f"2 skipped where {NO_SKIPS}=1" in said, said
    assert "frobnicate is not installed" in said and "no frobnicator here" in said, said


@pytest.mark.parametrize("no_skips", [None, "0"])
def test_elsewhere_a_skip_passes_with_its_reason(skipping: Path, no_skips: str | None) -> None:
    run = run_pytest(skipping, no_skips=no_skips)
    said = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.OK, said
    assert "1 passed, 2 skipped" in said and "frobnicate is not installed" in said, said
    assert NO_SKIPS not in said


@pytest.mark.unit
def test_without_podman_the_image_is_unbuildable_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert image_build.unbuildable() == "podman is not installed (scripts/test.sh installs it)"
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert image_build.unbuildable() is None
