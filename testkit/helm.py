"""The chart, rendered by the real helm (scripts/install-helm.py puts it in the venv)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from testkit.agent import ROOT, tool
from testkit.yamldocs import documents

CHART = ROOT / "charts" / "otel-vgpu"
RELEASE = NAMESPACE = "otel-vgpu"
# The flavours: ci/<overlay>-values.yaml renders what kustomize/overlays/<overlay> renders.
FLAVOURS = sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))
# What a cluster with the Prometheus Operator's and OpenShift's CRDs lists (group/version/Kind).
CUSTOM_KINDS = (
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
    "security.openshift.io/v1/SecurityContextConstraints",
)
# A cluster without the Prometheus Operator (kustomize/base's): no monitoring.coreos.com kind.
WITHOUT_OPERATOR = tuple(kind for kind in CUSTOM_KINDS if not kind.startswith("monitoring.coreos.com/"))


def helm(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    binary = tool("helm")
    assert binary, "helm comes with ./scripts/test.sh (scripts/install-helm.py)"
    home = Path(os.environ.get("TMPDIR", "/tmp")) / "otel-vgpu-helm-home"
    env = {
        **os.environ,
        # No helm call may reach a cluster, and none writes the user's own helm settings.
        "KUBECONFIG": "/dev/null",
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        # Go's collector off and one thread: a render lives a tenth of a second and holds some
        # 60 MiB without collecting (52 with), and the suite's 350-odd calls each cost 0.70x the
        # CPU (0.09 s against 0.13 on the 2-core machine).
        "GOGC": "off",
        "GOMAXPROCS": "1",
    }
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True, check=False, env=env, cwd=cwd)


def values_file(flavour: str) -> Path:
    return CHART / "ci" / f"{flavour}-values.yaml"


@functools.cache
def template(*args: str, chart: Path = CHART, kinds: tuple[str, ...] = CUSTOM_KINDS) -> str:
    """`helm template` of the release as the README installs it, with the cluster's custom kinds
    listed: by default every kind the chart can render, the Prometheus Operator's among them."""
    listed = [f"--api-versions={kind}" for kind in kinds]
    result = helm("template", RELEASE, chart, "--namespace", NAMESPACE, *listed, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


@functools.cache
def packaged() -> Path:
    """The chart as `helm package` makes it (what a chart repository or an OCI registry
    serves): ci/ is not in it, files/ is."""
    out = Path(tempfile.mkdtemp(prefix="otel-vgpu-chart-"))
    # Kept for the process's life (the cache hands it out), then removed: each run left its own.
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    result = helm("package", CHART, "--destination", out)
    assert result.returncode == 0, result.stderr
    (archive,) = out.glob("otel-vgpu-*.tgz")
    return archive


def flavour_args(flavour: str) -> tuple[str, ...]:
    return () if flavour == "defaults" else ("--values", str(values_file(flavour)))


def chart_daemonset(*args: str, kinds: tuple[str, ...] = CUSTOM_KINDS) -> dict[str, Any]:
    (found,) = [d for d in documents(template(*args, kinds=kinds)) if d["kind"] == "DaemonSet"]
    return found


def install_notes(*args: str) -> str:
    """What `helm install` prints after NOTES:, on no cluster (--dry-run=client lists no custom
    kind, as a cluster without the Prometheus Operator)."""
    result = helm("install", RELEASE, CHART, "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def notes_scrape_job(notes: str) -> dict[str, Any]:
    """The scrape_configs job the notes print where no monitor renders."""
    block = notes.split("add this job to its scrape_configs:\n\n", 1)[1].split("\n\n", 1)[0]
    (job,) = yaml.safe_load(block)
    assert isinstance(job, dict)
    return job
