"""Custom resources checked against their upstream CRDs (tests/data/crds/).

A CRD's `openAPIV3Schema` is JSON Schema with Kubernetes' extensions; this
turns it into plain JSON Schema the way the API server reads it: `nullable`
admits null, `x-kubernetes-int-or-string` admits either, an object with
declared properties admits no other field (the API server's strict field
validation, kubectl's default) unless it preserves unknown fields.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml

CRDS = Path(__file__).resolve().parents[1] / "tests" / "data" / "crds"


def json_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    schema = {key: json_schema(value) for key, value in node.items() if not key.startswith("x-kubernetes-")}
    schema.pop("nullable", None)
    if node.get("x-kubernetes-int-or-string"):
        schema.pop("type", None)
        schema["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    closed = "properties" in node and "additionalProperties" not in node
    if closed and not node.get("x-kubernetes-preserve-unknown-fields"):
        schema["additionalProperties"] = False
    if node.get("nullable"):
        schema = {"anyOf": [schema, {"type": "null"}]}
    return schema


@functools.cache
def validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) to a validator of its served versions."""
    found = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = json_schema(version["schema"]["openAPIV3Schema"])
            key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
            found[key] = jsonschema.Draft7Validator(schema)
    return found


def problems(document: dict[str, Any]) -> list[str]:
    """Where `document` breaks its CRD's schema; empty when it holds. A kind
    without a CRD here is itself a problem."""
    key = (document.get("apiVersion", ""), document.get("kind", ""))
    validator = validators().get(key)
    if validator is None:
        return [f"no CRD for {key[1]} {key[0]} in {CRDS}"]
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in validator.iter_errors(document)
    ]
