"""The shipped Grafana dashboard's queries, as Grafana sends them to Prometheus."""

from __future__ import annotations

import json
import re
from typing import Any

from testkit.agent import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "otel-vgpu-dashboard.json"
# What Grafana puts in place of its range variables: $__rate_interval is at least four
# scrape intervals of the data source (15 s by default), $__range the time picker's span.
RATE_INTERVAL = "1m"
RANGE = "1h"


def panels() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return panels


def dashboard_queries() -> list[str]:
    """Every panel target's expression, then the template variables' queries."""
    dashboard = json.loads(DASHBOARD.read_text())
    # A row panel has no targets.
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return queries


def as_promql(query: str) -> str:
    """Grafana's variables, as Grafana would substitute them with every value chosen."""
    for variable in ("$cluster", "$node", "$namespace", "$pod"):
        query = query.replace(variable, ".*")
    match = re.fullmatch(r"label_values\((?P<metric>\w+(\{[^}]*\})?), *(?P<label>\w+)\)", query)
    if match:
        return f"count by ({match['label']}) ({match['metric']})"
    return query.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", RANGE)


def scoped(query: str, job: str) -> str:
    """`query` over the series of one scrape job: a job matcher beside the cluster matcher,
    which every selector of the dashboard carries (checked), so that several ways of
    scraping one agent can sit in one Prometheus and each be read alone."""
    # label_values(metric, label) reads metric{}: the same with every cluster.
    query = re.sub(r"^label_values\((\w+),", r'label_values(\1{cluster=~"$cluster"},', query)
    assert query.count("{") == query.count('cluster=~"$cluster"'), f"a selector without $cluster: {query}"
    return as_promql(query.replace('cluster=~"$cluster"', f'cluster=~"$cluster", job="{job}"'))


def panel(title: str) -> dict[str, Any]:
    return next(p for p in panels() if p["title"] == title)


def panel_query(title: str, position: int = 0) -> str:
    return as_promql(panel(title)["targets"][position]["expr"])
