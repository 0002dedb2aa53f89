#!/usr/bin/env python3
"""Embeds Kubernetes' own types in the chart's values.schema.json, so that a value that would
break the pod is refused at `helm install`, not by the API server or the kubelet later.

The types are the strict schemas (`additionalProperties: false`) of the Kubernetes version the
manifests' tests validate against, as the kubernetes-validate package ships them
(kubernetes-json-schema/v<version>-local-strict): a misspelt `tolerations[0].opertor` or
`affinity.nodeAfinity` is refused, where `{"type": "object"}` took it. They are copied into
the schema's `definitions`, never fetched at install. Two are narrowed, since Kubernetes'
Quantity takes any string or number:
- `Quantity`: a string in Kubernetes' quantity form (or a number, as `cpu: 1`);
- `MemoryQuantity`: memory with its unit (`192Mi`): a bare `192` is 192 bytes, which no pod
  starts with.

Each of the chart's own properties gets its description from the `# --` comment above its key in
values.yaml, as the README's values table does.

Run from the repository root after a Kubernetes bump or a values.yaml change:
.venv/bin/python scripts/gen-values-schema-types.py (tests/system/test_chart.py checks the schema is current).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.manifests import KUBERNETES_VERSION
from testkit.scripts import load as load_script

SCHEMA = Path(__file__).resolve().parents[1] / "charts" / "otel-vgpu" / "values.schema.json"
VALUES = SCHEMA.parent / "values.yaml"
# Each value of the chart that is a Kubernetes type, and the type.
TYPED = {
    "resources": "io.k8s.api.core.v1.ResourceRequirements",
    "tolerations": "io.k8s.api.core.v1.Toleration",  # the items of the list
    "affinity": "io.k8s.api.core.v1.Affinity",
    "updateStrategy": "io.k8s.api.apps.v1.DaemonSetUpdateStrategy",
    "containerSecurityContext": "io.k8s.api.core.v1.SecurityContext",
    "livenessProbe": "io.k8s.api.core.v1.Probe",
    "readinessProbe": "io.k8s.api.core.v1.Probe",
    "otlp.collector.resources": "io.k8s.api.core.v1.ResourceRequirements",
    "otlp.collector.tolerations": "io.k8s.api.core.v1.Toleration",
    "otlp.collector.affinity": "io.k8s.api.core.v1.Affinity",
    "prometheus.monitor.selectorOverride": "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
    "prometheus.podMonitor.selectorOverride": "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
}
# `env`'s values: a string, or a `valueFrom` of Kubernetes' EnvVarSource.
ENV_SOURCE = "io.k8s.api.core.v1.EnvVarSource"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
# apimachinery's quantity grammar (resource/quantity.go): a signed decimal, then a binary
# suffix, a decimal suffix or an exponent.
QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
MEMORY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)$"


def strict_definitions() -> dict[str, Any]:
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    text = (root / f"v{KUBERNETES_VERSION}-local-strict" / "_definitions.json").read_text()
    return dict(json.loads(text)["$defs"])


def closure(definitions: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The definitions `names` need, their references rewritten to this schema's."""
    out: dict[str, Any] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out[name] = rewrite(definitions[name], todo)
    return dict(sorted(out.items()))


def rewrite(node: Any, todo: list[str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                name = value.rsplit("/", 1)[1]
                todo.append(name)
                out[key] = f"#/definitions/{name}"
            else:
                out[key] = rewrite(value, todo)
        return out
    if isinstance(node, list):
        return [rewrite(item, todo) for item in node]
    return node


# What Kubernetes' validation refuses but its OpenAPI types leave as any string: the values
# the API server takes (kubernetes/kubernetes pkg/apis/core/validation/validation.go
# validateTolerations; pkg/apis/apps/validation/validation.go ValidateDaemonSetUpdateStrategy),
# so that `Rollingupdate` is refused at install and not by the API server later.
ENUMS = {
    ("io.k8s.api.core.v1.Toleration", "operator"): ["Exists", "Equal", ""],
    ("io.k8s.api.core.v1.Toleration", "effect"): ["NoSchedule", "PreferNoSchedule", "NoExecute", ""],
    ("io.k8s.api.apps.v1.DaemonSetUpdateStrategy", "type"): ["RollingUpdate", "OnDelete"],
}


def definitions() -> dict[str, Any]:
    found = closure(strict_definitions(), [*TYPED.values(), ENV_SOURCE])
    for (name, field), values in ENUMS.items():
        found[name]["properties"][field] = {**found[name]["properties"][field], "enum": [*values, None]}
    found[QUANTITY] = {
        "description": "A Kubernetes quantity: a number and its unit, as `100m`, `0.5`, `96Mi` or `1Gi`.",
        "oneOf": [{"type": "string", "pattern": QUANTITY_PATTERN}, {"type": "number"}],
    }
    # A number passes here and is refused by templates/checks.yaml, whose message can say
    # what to write instead (a schema's "got number, want string" cannot).
    found["MemoryQuantity"] = {
        "description": "Memory with its unit, as `192Mi` or `1Gi` (a bare number is bytes).",
        "type": ["string", "number"],
        "pattern": MEMORY_PATTERN,
    }
    return found


def typed(name: str) -> dict[str, Any]:
    ref = {"$ref": f"#/definitions/{TYPED[name]}"}
    if name.endswith("tolerations"):
        return {"type": "array", "items": ref}
    if name.endswith("resources"):
        memory = {"properties": {"memory": {"$ref": "#/definitions/MemoryQuantity"}}}
        return {"allOf": [ref, {"properties": {"requests": memory, "limits": memory}}]}
    return ref


def described(node: dict[str, Any], docs: dict[str, str], prefix: str = "") -> dict[str, Any]:
    """`node` with each property's description the `# --` comment of its key in values.yaml
    (what `helm show values` shows and the README's table quotes), so that an editor offering
    the schema says what each value does."""
    properties = node.get("properties")
    if not properties:
        return node
    out = dict(node)
    out["properties"] = {}
    for key, sub in properties.items():
        dotted = f"{prefix}{key}"
        inner = described(sub, docs, f"{dotted}.")
        if dotted in docs:
            inner = {"description": docs[dotted], **{k: v for k, v in inner.items() if k != "description"}}
        out["properties"][key] = inner
    return out


# The sections of values.yaml (keys without a value of their own, so without a `# --` comment).
SECTIONS = {
    "global": "Helm's values shared with a parent chart; this chart reads none.",
    "namespace": "The release namespace as a rendered object, for tools that apply manifests.",
    "image": "The agent's image: registry, repository, tag or digest, pull policy.",
    "nodes": "Which nodes run the agent: GPU nodes by their labels, or every node.",
    "gpuOperator": "Working beside the NVIDIA GPU Operator.",
    "runtime": "How the container gets NVML from the node's container runtime.",
    "kubelet": "Where the kubelet's pod-resources socket is.",
    "gke": "Google Kubernetes Engine's requirements.",
    "openshift": "OpenShift's SecurityContextConstraints and platform monitoring.",
    "networkPolicy": "A NetworkPolicy for the metrics port.",
    "prometheus": "How Prometheus finds the agents: the Prometheus Operator's objects, or the pods' annotations.",
    "prometheus.monitor": "The ServiceMonitor.",
    "prometheus.podMonitor": "The PodMonitor.",
    "prometheus.rules": "The PrometheusRule.",
    "grafana": "Grafana, through its dashboard sidecar.",
    "grafana.dashboard": "The dashboard's ConfigMap.",
    "tls": "HTTPS on the metrics endpoint, and what the monitors verify.",
    "basicAuth": "Basic auth on /metrics, and what the monitors send.",
    "otlp": "OTLP push, and the optional Collector gateway.",
    "otlp.collector": "The Collector gateway Deployment.",
    "serviceAccount": "The agent's ServiceAccount.",
    "rbac": "The ClusterRole that reads the node's pods and the node.",
    "service": "The headless Service of the metrics port.",
}


def value_docs() -> dict[str, str]:
    table = load_script("gen-values-table.py")
    return {**SECTIONS, **dict(table.rows(VALUES.read_text()))}


def schema(current: dict[str, Any]) -> dict[str, Any]:
    out = described(copy.deepcopy(current), value_docs())
    for name in TYPED:
        *parents, key = name.split(".")
        node = out
        for parent in parents:
            node = node["properties"][parent]
        description = node["properties"][key].get("description")
        node["properties"][key] = {**({"description": description} if description else {}), **typed(name)}
    env = out["properties"]["env"]
    env["additionalProperties"] = {
        "anyOf": [
            {"type": ["string", "number", "boolean"]},
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["valueFrom"],
                "properties": {"valueFrom": {"$ref": f"#/definitions/{ENV_SOURCE}"}},
            },
        ]
    }
    out["definitions"] = definitions()
    return out


def text() -> str:
    return json.dumps(schema(json.loads(SCHEMA.read_text())), indent=2) + "\n"


def main() -> int:
    SCHEMA.write_text(text())
    print(f"{SCHEMA}: {len(definitions())} Kubernetes definitions embedded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
