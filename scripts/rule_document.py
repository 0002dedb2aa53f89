"""A PrometheusRule holding rule groups, named and labelled as kube-prometheus-stack's
Prometheus selects rules: the one shape the agent's rules (gen-prometheusrule.py) and the
dcgm-exporter names (gen-dcgm-rules.py) are shipped in as kustomize components."""

from __future__ import annotations

from typing import Any


def rule_document(name: str, groups: list[Any]) -> dict[str, Any]:
    """The PrometheusRule `name` of `groups`."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        # release: what kube-prometheus-stack's Prometheus selects rules by (the PodMonitor says more).
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "otel-vgpu", "release": "kube-prometheus-stack"},
        },
        "spec": {"groups": groups},
    }
