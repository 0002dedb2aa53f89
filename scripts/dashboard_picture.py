#!/usr/bin/env python3
"""The dashboard's main panels on the demo node, drawn from real data: the demo agent
(`otel-vgpu --simulate`) scraped by the real Prometheus, with the repository's recording
rules, for a couple of minutes; then each panel's own queries, as the dashboard holds them,
asked over that range (the HTTP API's query_range) and plotted into an SVG. No Grafana
runs: these are the panels' queries, plotted.

    .venv/bin/python scripts/dashboard_picture.py [--seconds 150] [--out docs/dashboard.svg]
"""

from __future__ import annotations

import argparse
import html
import math
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import ROOT, running_agent
from testkit.dashboard import as_promql, panel
from testkit.prometheus import Prometheus, running_prometheus

RULES = ROOT / "deploy" / "prometheus" / "otel-vgpu-rules.yaml"
# The builtin scenario's node name, which a monitor's relabeling gives every series.
NODE = "sim-gpu-node-1"
# The panels a reader looks at first: pods against their share, the GPUs, the bill.
PANELS = (
    "GPU memory per pod: used and allocated",
    "SM use against the pod's share",
    "GPU utilization",
    "GPUs busy by namespace",
    "Power by namespace",
    "Unattributed GPU memory",
)
STEP_S = 2
# The panels' rates are over $__rate_interval (testkit/dashboard.py: 1 m) and divide by all of
# it: the range plotted starts once a whole one has been scraped, as on a node that runs on.
WARM_UP_S = 60
# Grafana's classic palette, in its order.
COLOURS = (
    "#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0",
    "#508642", "#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62", "#584477",
)  # fmt: skip
WIDTH, PLOT_W, LEGEND_X, LINE_H = 1200, 640, 730, 13


class Line(NamedTuple):
    legend: str
    # The series' labels but its name: a panel's targets over the same subject share a colour.
    subject: str
    dashed: bool
    points: list[tuple[float, float]]


class Plot(NamedTuple):
    title: str
    unit: str
    lines: list[Line]


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label, empty where it has none.
    The node is left out: there is one."""
    template = re.sub(r"(on )?\{\{\s*node\s*\}\} ?", "", template)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


def scrape(seconds: float, work: Path) -> tuple[list[Plot], float]:
    """The demo agent scraped for `seconds`; the panels' queries over that time, and its span."""
    with running_agent("--simulate") as agent:
        job = {
            "job_name": "otel-vgpu",
            # The agent's pod and namespace labels name the pods using the GPUs: keep them.
            "honor_labels": True,
            "static_configs": [{"targets": [agent.url.removeprefix("http://")], "labels": {"node": NODE}}],
        }
        with running_prometheus(work, [job], [RULES]) as prometheus:
            prometheus.wait_for('up{job="otel-vgpu"} == 1')
            start = time.time() + WARM_UP_S
            while time.time() < start + seconds:
                at = time.time() - start
                doing = f"warming up: {-at:3.0f} s to go" if at < 0 else f"scraping: {at:3.0f} of {seconds:g} s"
                print(f"\r{doing:<40}", end="", file=sys.stderr, flush=True)
                time.sleep(1)
            print(file=sys.stderr)
            end = time.time()
            plots = [plot(prometheus, title, start, end) for title in PANELS]
        agent.stop()
    return plots, end - start


def plot(prometheus: Prometheus, title: str, start: float, end: float) -> Plot:
    shown = panel(title)
    lines = []
    for target in shown["targets"]:
        data = prometheus.api(
            "query_range", query=as_promql(target["expr"]), start=f"{start:.3f}", end=f"{end:.3f}", step=f"{STEP_S}"
        )
        for series in sorted(data["result"], key=lambda s: legend(target.get("legendFormat", ""), s["metric"])):
            points = [(float(t) - start, float(v)) for t, v in series["values"] if math.isfinite(float(v))]
            # A second target of a panel (allocated against used) drawn dashed.
            name = legend(target.get("legendFormat", ""), series["metric"]) or target["refId"]
            subject = str(sorted((k, v) for k, v in series["metric"].items() if k != "__name__"))
            lines.append(Line(name, subject, target is not shown["targets"][0], points))
    return Plot(title, shown.get("fieldConfig", {}).get("defaults", {}).get("unit", "none"), lines)


def formatted(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / 1024**3:g} GiB" if value >= 1024**3 or value == 0 else f"{value / 1024**2:g} MiB"
    if unit == "percentunit":
        return f"{value * 100:.0f}%"
    if unit == "watt":
        return f"{value:.0f} W"
    return f"{value:g}"


def ceiling(value: float, unit: str) -> float:
    """The axis' top: the highest value rounded up to a round figure of its power of ten
    (four ticks apart), in GiB or MiB for bytes, where the ticks are read."""
    scale = float((1024**3 if value >= 1024**3 else 1024**2) if unit == "bytes" else 1)
    value /= scale
    if value <= 0:
        return scale
    power = 10.0 ** math.floor(math.log10(value))
    return scale * next(m * power for m in (1.0, 1.2, 1.6, 2.0, 2.5, 4.0, 5.0, 6.0, 8.0, 10.0) if m * power >= value)


def segments(points: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """A series broken where it had no sample (a pod that came and went)."""
    runs: list[list[tuple[float, float]]] = []
    for point in points:
        if runs and point[0] - runs[-1][-1][0] <= 1.5 * STEP_S:
            runs[-1].append(point)
        else:
            runs.append([point])
    return runs


def panel_svg(shown: Plot, top: float, seconds: float) -> tuple[list[str], float]:
    """One panel's elements, and its height: the plot on the left, the legend on the right."""
    height = max(220.0, 40 + LINE_H * len(shown.lines))
    left, plot_top, plot_h = 80.0, top + 30, height - 60
    highest = ceiling(max((v for line in shown.lines for _, v in line.points), default=0.0), shown.unit)
    subjects = list(dict.fromkeys(line.subject for line in shown.lines))
    parts = [
        f'<rect x="10" y="{top:.0f}" width="{WIDTH - 20}" height="{height - 8:.0f}" fill="#fff" stroke="#ccc"/>',
        f'<text x="20" y="{top + 20:.0f}" font-size="14" font-weight="bold">{html.escape(shown.title)}</text>',
    ]
    for i in range(5):
        y = plot_top + plot_h * (1 - i / 4)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + PLOT_W}" y2="{y:.1f}" stroke="#eee"/>')
        label = html.escape(formatted(highest * i / 4, shown.unit))
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{label}</text>')
    for s in range(0, int(seconds) + 1, 30):
        x = left + PLOT_W * s / seconds
        parts.append(f'<text x="{x:.1f}" y="{plot_top + plot_h + 14:.1f}" font-size="10" text-anchor="middle">')
        parts.append(f"{s // 60}:{s % 60:02d}</text>")
    for i, line in enumerate(shown.lines):
        colour = COLOURS[subjects.index(line.subject) % len(COLOURS)]
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        for run in segments(line.points):
            xy = " ".join(
                f"{left + PLOT_W * t / seconds:.1f},{plot_top + plot_h * (1 - v / highest):.1f}" for t, v in run
            )
            parts.append(f'<polyline points="{xy}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}/>')
        y = top + 30 + LINE_H * i
        parts.append(f'<line x1="{LEGEND_X}" y1="{y - 4}" x2="{LEGEND_X + 18}" y2="{y - 4}" stroke="{colour}"')
        parts.append(f' stroke-width="2"{dash}/>')
        parts.append(f'<text x="{LEGEND_X + 24}" y="{y}" font-size="11">{html.escape(line.legend)}</text>')
    return parts, height


def svg(plots: list[Plot], seconds: float) -> str:
    parts, top = [], 40.0
    for shown in plots:
        drawn, height = panel_svg(shown, top, seconds)
        parts += drawn
        top += height
    header = (
        f'<text x="20" y="26" font-size="16" font-weight="bold">otel-vgpu dashboard, the demo node '
        f"(otel-vgpu --simulate): the panels' queries over {seconds:.0f} s (minutes:seconds)</text>"
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{top + 10:.0f}" '
        f'font-family="sans-serif" fill="#222">\n'
        "<desc>Made by scripts/dashboard_picture.py: the queries of deploy/grafana/otel-vgpu-dashboard.json's "
        "panels, asked of a real Prometheus that scraped otel-vgpu --simulate; no Grafana ran.</desc>\n"
        f'<rect width="100%" height="100%" fill="#f7f7f7"/>\n{header}\n' + "\n".join(parts) + "\n</svg>\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=150, help="how long Prometheus scrapes the demo agent")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.svg")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="otel-vgpu-dashboard-") as work:
        plots, span = scrape(args.seconds, Path(work))
    empty = [shown.title for shown in plots if not shown.lines]
    assert not empty, f"panels with no series: {empty}"
    args.out.write_text(svg(plots, span))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
