#!/usr/bin/env python3
"""Checks a release tag against every version the tree states, and names what the release publishes.

Run by .github/workflows/release.yaml before anything is built or pushed, and by
tests/system/test_release_workflow.py. The tag `vX.Y.Z` must be `v` and the version of
pyproject.toml, of otel_vgpu/__init__.py, and of charts/otel-vgpu/Chart.yaml (its
`version` and its `appVersion`), and CHANGELOG.md must have a section `## X.Y.Z`:
the release's notes. Each disagreement is one line naming the file, what it holds
and what to do; any one fails the release (exit 1).

Usage: release-check.py TAG OWNER [--root DIR] [--notes FILE]
OWNER is the GitHub owner (github.repository_owner); the registry wants it in lower
case. Prints, and appends to $GITHUB_OUTPUT where the workflow sets it:
version=X.Y.Z, image=ghcr.io/<owner>/otel-vgpu, charts=oci://ghcr.io/<owner>/charts.
With --notes, the CHANGELOG section is written to FILE. Only the standard library:
it runs on the runner's own Python, before any install.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from pathlib import Path

REGISTRY = "ghcr.io"
# The image's and the chart's names in the registry, as charts/otel-vgpu/values.yaml's
# image.repository names the image under the owner (tests/system/test_release_workflow.py checks).
IMAGE_NAME = "otel-vgpu"
CHARTS_PATH = "charts"
# SemVer 2 (helm refuses a chart version that is not), which PEP 440 reads alike for X.Y.Z.
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?")


def top_level(text: str, key: str) -> str | None:
    """A top-level scalar of a YAML file such as Chart.yaml (`key: value` at column 0), unquoted.
    Read as text: the runner's Python has no YAML parser before an install."""
    match = re.search(rf"(?m)^{re.escape(key)}:[ \t]*(.*?)[ \t]*(#.*)?$", text)
    return match.group(1).strip("\"'") if match else None


def stated(root: Path) -> dict[str, str | None]:
    """Each place a version is written, by a name the messages give."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    init = re.search(r'(?m)^__version__ = "([^"]*)"', (root / "otel_vgpu/__init__.py").read_text())
    chart = (root / "charts/otel-vgpu/Chart.yaml").read_text()
    return {
        "pyproject.toml [project] version": pyproject.get("project", {}).get("version"),
        "otel_vgpu/__init__.py __version__": init.group(1) if init else None,
        "charts/otel-vgpu/Chart.yaml version": top_level(chart, "version"),
        "charts/otel-vgpu/Chart.yaml appVersion": top_level(chart, "appVersion"),
    }


def changelog_section(root: Path, version: str) -> str | None:
    """The text of CHANGELOG.md's `## <version>` section; None where it has none, or an empty one."""
    text = (root / "CHANGELOG.md").read_text()
    match = re.search(rf"(?ms)^## {re.escape(version)}[ \t]*\n(.*?)(?=^## |\Z)", text)
    if match is None:
        return None
    return match.group(1).strip() or None


def problems(tag: str, root: Path) -> list[str]:
    """What stops a release of `tag`; empty where nothing does."""
    if not tag.startswith("v") or not SEMVER.fullmatch(tag[1:]):
        return [f"tag {tag!r}: expected v and a SemVer version, e.g. v0.3.0 or v0.3.0-rc.1"]
    version = tag[1:]
    found = [
        f"{where} is {value!r}, the tag {tag} is {version!r}: set it to {version!r}, or tag v{value}"
        if value
        else f"{where}: none found; set it to {version!r}"
        for where, value in stated(root).items()
        if value != version
    ]
    if changelog_section(root, version) is None:
        found.append(f"CHANGELOG.md has no section '## {version}' with the release's notes: add it")
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("tag", help="the tag pushed, e.g. v0.3.0 (github.ref_name)")
    parser.add_argument("owner", help="the repository's owner (github.repository_owner)")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the tree checked")
    parser.add_argument("--notes", type=Path, help="write the CHANGELOG section here")
    args = parser.parse_args(argv)
    found = problems(args.tag, args.root)
    if found:
        # On a runner, each line is an error annotation on the run's page too.
        prefix = "::error::" if os.environ.get("GITHUB_ACTIONS") == "true" else ""
        for line in found:
            print(f"{prefix}release-check: {line}", file=sys.stderr)
        return 1
    version = args.tag[1:]
    owner = args.owner.lower()
    outputs = {
        "version": version,
        "image": f"{REGISTRY}/{owner}/{IMAGE_NAME}",
        "charts": f"oci://{REGISTRY}/{owner}/{CHARTS_PATH}",
    }
    lines = [f"{key}={value}" for key, value in outputs.items()]
    print("\n".join(lines))
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as output:
            output.write("\n".join(lines) + "\n")
    if args.notes is not None:
        args.notes.parent.mkdir(parents=True, exist_ok=True)
        args.notes.write_text(f"{changelog_section(args.root, version)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
