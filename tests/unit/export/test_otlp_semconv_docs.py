"""docs/otlp-semconv.md says what the code declares: its two tables of names, the GPU families'
and the per-pod families', row by row against each family's `semconv` form (the declarations
export/semconv.py pushes) and against the convention files it cites (tests/data/semconv/,
v1.44.0); the names its prose and its queries use are the push's; and the README's OTLP section
leads to it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
import yaml
from opentelemetry.sdk.metrics.export import Gauge, Metric, MetricsData, NumberDataPoint, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_vgpu.export.families import FAMILIES, Family, Feature
from otel_vgpu.export.semconv import AGENT_POD, forms, translate
from testkit.agent import ROOT
from testkit.otlp_names import prometheus_label, prometheus_name
from testkit.scripts import load as load_script
from testkit.semconv_model import MODEL
from testkit.semconv_model import metrics as conventions

DOC = ROOT / "docs" / "otlp-semconv.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"
# Each table: the heading of its section, and the family names its rows are made from.
TABLES = {"gpu": "## The GPU families", "pod": "## The per-pod families"}
_BY_NAME: dict[str, Family[Any]] = {family.name: family for family in FAMILIES}


@dataclass(frozen=True)
class Row:
    """One row of a table: a name of the semconv push as the doc describes it."""

    table: str
    name: str
    instrument: str
    unit: str
    key: str | None
    """The attribute that tells its families apart; None: one family, or one made of two."""
    values: tuple[str, ...]
    """The key's value of each family of `sources`, in their order."""
    sources: tuple[str, ...]
    convention: str
    """The cell that cites the convention (the GPU table) or names the nearest ones (the pods')."""


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().removeprefix("|").removesuffix("|").split("|")]


def _code(cell: str) -> str:
    found = re.fullmatch(r"`([^`]+)`", cell)
    assert found, f"one name in backticks: {cell!r}"
    return found.group(1)


def rows(text: str) -> list[Row]:
    """The rows of both tables of `text`, each table the first after its section's heading."""
    out = []
    for table, heading in TABLES.items():
        assert heading in text, heading
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        lines = [line for line in section.splitlines() if line.startswith("|")]
        assert len(lines) > 2 and set(lines[1]) <= set("|-"), f"{heading}: a table"
        assert _cells(lines[0])[:5] == ["name", "instrument", "unit", "its own attributes", "from"], heading
        for line in lines[2:]:
            name, instrument, unit, attributes, sources, convention = _cells(line)
            key, values = None, ()
            if attributes:
                told = re.fullmatch(r"`([\w.]+)`: (`\w+`(?:, `\w+`)*)", attributes)
                assert told, f"{name}: `key`: `value`, ... in {attributes!r}"
                key, values = told.group(1), tuple(re.findall(r"`(\w+)`", told.group(2)))
            out.append(
                Row(
                    table,
                    _code(name),
                    instrument,
                    _code(unit),
                    key,
                    values,
                    tuple(re.findall(r"`(vgpu\.[\w.]+)`", sources)),
                    convention,
                )
            )
    return out


def disagreements(found: list[Row]) -> list[str]:
    """Where the rows say other than the declarations: each name once, every name of the push
    in a table; each row its form's instrument and unit, made from its form's families, and each
    family's fixed attribute the value the row gives it."""
    declared = {form.name: (form, families) for form, families in forms()}
    out = []
    names = [row.name for row in found]
    if sorted(names) != sorted(declared):
        out.append(f"the tables name {sorted(names)}, the code declares {sorted(declared)}")
    for row in found:
        if row.name not in declared:
            continue
        form, families = declared[row.name]
        if (row.instrument, row.unit) != (form.kind.value, form.unit):
            out.append(f"{row.name}: {row.instrument} {row.unit}, declared {form.kind.value} {form.unit}")
        made_from = [family.name for family in families]
        if sorted(row.sources) != sorted(made_from):
            out.append(f"{row.name}: from {list(row.sources)}, declared from {made_from}")
            continue
        per_pod = {"pod_uid" in _BY_NAME[source].labels for source in row.sources}
        if per_pod != {row.table == "pod"}:
            out.append(f"{row.name}: in the {row.table} table, made from other families")
        if row.values and len(row.values) != len(row.sources):
            out.append(f"{row.name}: {len(row.values)} values of {row.key} for {len(row.sources)} families")
            continue
        for index, source in enumerate(row.sources):
            semconv = _BY_NAME[source].semconv
            # A family this name is made from but is not the form of (hw.gpu.memory.utilization's two) has none.
            fixed = semconv.fixed if semconv is not None and semconv.name == row.name else {}
            said = {row.key: row.values[index]} if row.key else {}
            if said != fixed:
                out.append(f"{row.name} from {source}: {said}, declared {dict(fixed)}")
    return out


def test_the_tables_are_the_declarations() -> None:
    found = rows(DOC.read_text())
    assert {row.table for row in found} == set(TABLES)
    assert disagreements(found) == []


def _changed(of: str, **fields: Any) -> Callable[[Row], Row]:
    """A change to the row of name `of`: the doc drifting from the code."""
    return lambda row: replace(row, **fields) if row.name == of else row


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_changed("hw.energy", unit="s"), "hw.energy: counter s"),
        (_changed("hw.errors", instrument="gauge"), "hw.errors: gauge"),
        (
            _changed("hw.temperature", values=("gpu", "gpu")),
            "hw.temperature from vgpu.gpu.memory.temperature: {'hw.sensor_location': 'gpu'}",
        ),
        (_changed("hw.gpu.io", sources=("vgpu.gpu.pcie.transmit.bytes",)), "hw.gpu.io: from"),
        (_changed("hw.power", name="hw.gpu.power"), "the tables name"),
        (_changed("vgpu.pod.gpu.time", table="gpu"), "vgpu.pod.gpu.time: in the gpu table"),
    ],
    ids=["unit", "instrument", "attribute", "families", "name", "table"],
)
def test_the_comparison_sees_a_row_that_drifts(change: Callable[[Row], Row], said: str) -> None:
    problems = disagreements([change(row) for row in rows(DOC.read_text())])
    assert len(problems) == 1 and problems[0].startswith(said), problems


def test_a_row_that_is_not_a_row_is_refused() -> None:
    text = DOC.read_text().replace("| `hw.power` | gauge | `W` | |", "| `hw.power` | gauge | `W` | `hw.type` |")
    with pytest.raises(AssertionError, match=r"hw\.power"):
        rows(text)


def _upstream_lines(file: str) -> list[str]:
    """A hardware convention file as upstream numbers it: the copy's first line is ours."""
    text = (MODEL / "hardware" / file).read_text()
    assert "verbatim copy of the whole file" in text.splitlines()[0], file
    return text.splitlines()[1:]


def test_each_gpu_row_cites_its_convention_and_has_its_unit_and_instrument() -> None:
    convention = conventions()
    for row in rows(DOC.read_text()):
        if row.table != "gpu":
            continue
        rules = convention[row.name]
        assert (row.instrument, row.unit) == (rules.instrument, rules.unit), row.name
        cited = re.findall(r"`([\w-]+\.yaml)` l\.(\d+)(?:-(\d+))?", row.convention)
        assert cited and len(cited) == row.convention.count("l."), f"{row.name}: `file.yaml` l.N each"
        for file, first, last in cited:
            lines = _upstream_lines(file)[int(first) - 1 : int(last or first)]
            naming = re.compile(rf"\s*-?\s*(name|ref): {re.escape(row.name)}")
            assert any(naming.fullmatch(line) for line in lines), f"{row.name}: {file} l.{first}: {lines}"


def _k8s_metrics() -> dict[str, tuple[str, str]]:
    """The excerpt of model/k8s/metrics.yaml (the old `groups:` schema): instrument and unit by name."""
    groups = yaml.safe_load((MODEL / "k8s" / "metrics.yaml").read_text())["groups"]
    return {g["metric_name"]: (g["instrument"], g["unit"]) for g in groups if g.get("type") == "metric"}


def test_each_per_pod_row_has_its_nearest_conventions_unit_and_instrument() -> None:
    # "Units and instruments are the nearest convention's."
    nearest = {name: (m.instrument, m.unit) for name, m in conventions().items()} | _k8s_metrics()
    named = 0
    for row in rows(DOC.read_text()):
        if row.table != "pod":
            continue
        assert row.name.startswith("vgpu.pod.gpu."), row.name
        for name in re.findall(r"`([\w.]+)`", row.convention):
            assert nearest[name] == (row.instrument, row.unit), (row.name, name)
            named += 1
    assert named >= 5


def test_every_agent_name_the_doc_gives_is_a_family_a_form_or_an_attribute() -> None:
    # vgpu.gpu.xid.errors "stays"; vgpu.xid is the xid label; a name that does not exist misleads.
    # A pod's labels beside its subject's: with --by-container, and on a MIG device (export/subjects.py).
    labels = {label for family in FAMILIES for label in family.labels} | {"container", "mig_uuid", "mig_profile"}
    attributes = {"vgpu." + label.replace("_", ".") for label in labels}
    known = set(_BY_NAME) | {form.name for form, _ in forms()} | attributes
    named = set(re.findall(r"`(vgpu\.[a-z][\w.]*)`", DOC.read_text()))
    assert len(named) > 20 and named <= known, sorted(named - known)
    kept = {"vgpu.gpu.xid.errors", "vgpu.gpu.memory_copy.utilization", "vgpu.pod.vgpu.utilization"}
    assert all(_BY_NAME[name].semconv is None for name in kept), "the doc says these keep their names"


def _promql(text: str) -> str:
    return "\n".join(re.findall(r"```promql\n(.*?)```", text, re.DOTALL))


def test_the_queries_use_the_names_metrics_md_gives_the_push_in_prometheus() -> None:
    # The "in Prometheus" column of docs/metrics.md's names of the push, generated from the declarations.
    block = load_script("doc_blocks.py").block(METRICS_DOC.read_text(), "semconv names", str(METRICS_DOC))
    in_prometheus = {_code(_cells(line)[4]) for line in block.splitlines()[2:]}
    assert len(in_prometheus) == len(forms())
    # A label: an attribute of a point (the conventions') or of a Resource the push sets.
    resource = {*AGENT_POD, "k8s.node.name", "k8s.cluster.name"}
    labels = {prometheus_label(a) for m in conventions().values() for a in m.attributes} | {
        prometheus_label(a) for a in resource
    }
    queries = _promql(DOC.read_text())
    # What `by (...)`, `on (...)` and `{...}` hold are labels; the rest of hw_* and vgpu_* are metrics.
    grouped = re.findall(r"\b(?:by|on|without|group_left|group_right) \(([^)]*)\)", queries)
    matched = re.findall(r"\{([^}]*)\}", queries)
    used = {label.strip() for group in grouped for label in group.split(",") if label.strip()}
    used |= {re.split(r"[=!~]", m)[0].strip() for matcher in matched for m in matcher.split(",")}
    assert used and used <= labels, sorted(used - labels)
    bare = re.sub(r"\b(?:by|on|without|group_left|group_right) \([^)]*\)|\{[^}]*\}|#.*", "", queries)
    metrics = set(re.findall(r"\b(?:hw|vgpu)_\w+", bare))
    assert len(metrics) >= 5 and metrics <= in_prometheus, sorted(metrics - in_prometheus)


def test_metrics_md_gives_every_family_both_names_and_each_its_name_in_prometheus() -> None:
    # What docs/otlp-semconv.md says metrics.md holds, and the two lead to each other.
    assert "](metrics.md#with---otlp-names-semconv)" in DOC.read_text()
    text = METRICS_DOC.read_text()
    section = text.split("\n### With `--otlp-names semconv`\n", 1)[1].split("\n## ", 1)[0]
    assert "](otlp-semconv.md)" in section
    table_rows = {
        _cells(line)[0].split("{")[0].strip("`"): _cells(line) for line in text.splitlines() if line.startswith("| `")
    }
    for family in FAMILIES:
        if family.needs is Feature.SEED_METRICS:
            continue  # not pushed, as its row says
        semconv = table_rows[family.prometheus_name][2]
        assert semconv.startswith(f"`{family.semconv.name if family.semconv else family.name}"), family.name
        if family.semconv is None:
            # Its name in Prometheus is the scrape's: the same name, unit and instrument as the default push.
            kind = "Sum" if family.instrument.value == "counter" else family.instrument.value.capitalize()
            assert prometheus_name(family.name, family.unit, kind) == family.prometheus_name, family.name


def test_the_promotion_the_doc_gives_keeps_every_attribute_of_a_pods_resource() -> None:
    # Without one of them promoted, two pods' series on one GPU collide in Prometheus.
    block = re.search(r"```yaml\n(otlp:\n.*?)```", DOC.read_text(), re.DOTALL)
    assert block, "the promotion, as Prometheus' configuration"
    promoted = set(yaml.safe_load(block.group(1))["otlp"]["promote_resource_attributes"])
    node = Resource({"service.name": "otel-vgpu", "k8s.node.name": "gpu-node-1", "k8s.cluster.name": "east"})
    pod = {"namespace": "ml", "pod": "trainer", "pod_uid": "u-1", "gpu_id": "0", "gpu_uuid": "GPU-1"}
    # With --by-container: a container the API named, and one known by its runtime ID alone.
    points = [NumberDataPoint({**pod, "container": c}, None, 1, 1.0) for c in ("main", "0f" * 32)]  # type: ignore[arg-type]
    metric = Metric("vgpu.pod.memory.used", "", "By", Gauge(points))
    collection = MetricsData(
        [ResourceMetrics(node, [ScopeMetrics(InstrumentationScope("otel_vgpu"), [metric], "")], "")]
    )
    pushed = translate(collection, 1).resource_metrics
    added = {key for r in pushed for key in r.resource.attributes} - set(node.attributes)
    assert {"k8s.pod.uid", "k8s.container.name", "container.id"} <= added
    assert added | {"k8s.node.name", "k8s.cluster.name"} <= promoted, sorted(added - promoted)


def test_the_readmes_otlp_section_leads_to_the_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## OTLP\n", 1)[1].split("\n## ", 1)[0]
    assert "`--otlp-names semconv`" in section and "](docs/otlp-semconv.md)" in section
    assert len(section.split()) < 200, "a door: the reference is the doc's"
