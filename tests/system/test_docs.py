"""The documentation says what the code does: the generated tables and lists are current where
they live, a shipped release's notes stay as they shipped, the design is in the repository,
the image a user deploys is named with how to build it, every doc is in the index, the README
is a door with figures that hold, and the benchmarks say what they need and how to read them."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from otel_vgpu import __version__
from otel_vgpu.config import FLAGS
from otel_vgpu.export.families import FAMILIES, families_markdown
from otel_vgpu.flag_table import flags_markdown
from testkit.agent import ROOT, agent_in_process, clean_env, wait_for
from testkit.doc_commands import doc_files
from testkit.helm import chart_daemonset
from testkit.otlp_names import prometheus_name
from testkit.promtext import Exposition, parse
from testkit.scripts import load as load_script

README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
BLOCKS = load_script("doc_blocks.py")


def generated(name: str) -> list[tuple[Path, str]]:
    """Block `name` of every doc that holds it, as scripts/doc_blocks.py says where it lives."""
    return [(doc, BLOCKS.block(doc.read_text(), name, str(doc))) for doc in BLOCKS.BLOCKS[name]]


def test_the_metric_tables_are_the_contracts() -> None:
    # Every family, with its help text, in docs/metrics.md: made from the table, never by hand.
    for doc, held in generated("metric tables"):
        assert held == families_markdown(), f"{doc}: regenerate it: .venv/bin/python scripts/gen-metric-tables.py"
    for family in FAMILIES:
        assert f"`{family.prometheus_name}" in families_markdown(), family.name


def test_the_metric_lists_are_the_declarations() -> None:
    # The health and GPM denylist, the families each read is made for, the stages: made, never by hand.
    lists = load_script("family_lists.py")
    for name, markdown in lists.BLOCKS.items():
        for doc, held in generated(name):
            assert held == markdown(), f"{doc}: regenerate it: .venv/bin/python scripts/gen-metric-tables.py"
    assert "|  |" not in lists.reads_markdown(), "every read says what it is (its docstring in collect/reading.py)"


# Each section of a shipped release's notes, by its SHA-256 as it shipped: pinned here when the
# release ships (its CHANGELOG section and its upgrade steps), never rewritten after, by hand or
# by a generator. A note that must name what grows (a family list, a pattern) links to a doc
# that a generator keeps current.
SHIPPED_NOTES = {
    ("CHANGELOG.md", "## 0.2.0"): "55bce9dd3ea0d818a963f399d72ec2bd2ccf9c33eb0983cf6c3e5356d0600eed",
    ("CHANGELOG.md", "## 0.1.0"): "16bff465a6dc1b027033b62389a591d4504056e1d3eb143fe058c333ae9564a7",
    ("docs/upgrading.md", "## From 0.1.0 to 0.2.0"): "fa54a9235cdb5b85e3b594461a47fb577d7a4322043a4ea2a63095831e636bc0",
}
# The heading of a shipped release's section in each: its version; the two versions it goes between.
SHIPPED_HEADINGS = {"CHANGELOG.md": r"## \d+\.\d+\.\d+", "docs/upgrading.md": r"## From \S+ to \S+"}


def shipped_sections(text: str, heading: str) -> dict[str, str]:
    """Each `## ` section of `text` whose heading line is `heading`, by that line: up to the next."""
    sections = re.split(r"(?m)^(?=## )", text)
    return {s.splitlines()[0]: s for s in sections if re.fullmatch(heading, s.splitlines()[0])}


def test_a_shipped_releases_notes_stay_as_they_shipped() -> None:
    found = {}
    for doc, heading in SHIPPED_HEADINGS.items():
        text = (ROOT / doc).read_text()
        assert BLOCKS.names_in(text) == set(), f"{doc}: no generator writes into the release notes"
        for title, section in shipped_sections(text, heading).items():
            found[(doc, title)] = hashlib.sha256(section.encode()).hexdigest()
    assert found.keys() == SHIPPED_NOTES.keys(), "a release that ships pins its sections in SHIPPED_NOTES"
    for where, digest in found.items():
        assert digest == SHIPPED_NOTES[where], f"{where}: changed since it shipped; restore it as it shipped"
    coming = "# U\n\n## From 0.3.0 (unreleased)\n\na\n\n## From 0.2.0 to 0.3.0\n\nb\n### c\n"
    assert shipped_sections(coming, SHIPPED_HEADINGS["docs/upgrading.md"]) == {
        "## From 0.2.0 to 0.3.0": "## From 0.2.0 to 0.3.0\n\nb\n### c\n"
    }


def test_the_flag_table_is_what_help_says() -> None:
    for doc, held in generated("flag table"):
        assert held == flags_markdown(), f"{doc}: regenerate it: .venv/bin/python scripts/gen-flag-table.py"
    shown = subprocess.run(
        [sys.executable, "-m", "otel_vgpu", "--help"], capture_output=True, text=True, check=True
    ).stdout
    flat = " ".join(shown.split())
    table_flags = set(re.findall(r"^\| `(-[-\w]+)", flags_markdown(), re.MULTILINE))
    usage_flags = set(re.findall(r"\[(--[a-z][-a-z]*)", shown.split("options:")[0]))
    # Every flag of the usage line is in the table, and nothing else.
    assert table_flags - {"-h"} == usage_flags
    assert {flag.name for flag in FLAGS} | {"--version"} <= table_flags
    for flag in FLAGS:
        # What the table says of each flag, --help says: its description, variable and default.
        assert " ".join(flag.help_text().split()) in flat, flag.name
    # and the two flags argparse makes, in the same words
    assert "-h, --help print this list and exit" in flat and "--version print the version and exit" in flat
    assert "| `--otlp-protocol {grpc,http/protobuf}` |" in flags_markdown()


def test_every_generated_block_is_where_its_generator_writes_it_and_nowhere_else() -> None:
    # A block left behind in a doc it moved out of would go stale unchecked.
    held = {(name, doc) for doc in doc_files() for name in BLOCKS.names_in(doc.read_text())}
    written = {(name, doc) for name, docs in BLOCKS.BLOCKS.items() for doc in docs}
    assert held == written
    assert ("flag table", ROOT / "README.md") not in held


def test_a_generator_refuses_a_doc_without_its_block() -> None:
    with pytest.raises(ValueError, match=re.escape("docs/x.md has no block <!-- begin flag table -->")):
        BLOCKS.rewritten("# x\n", "flag table", "| row |\n", "docs/x.md")
    text = "a\n<!-- begin t -->\nold\n<!-- end t -->\nb\n"
    assert BLOCKS.block(BLOCKS.rewritten(text, "t", "new\n"), "t") == "new\n"


def test_the_design_is_in_the_repository() -> None:
    assert "../shared" not in README
    for doc in (ROOT / "docs").glob("*.md"):
        assert "../shared" not in doc.read_text(), doc.name
    assert "](docs/design.md)" in README
    design = (ROOT / "docs" / "design.md").read_text()
    for topic in ("## One collection", "## What each figure is sampled over", "## The ratio file", "## Faults"):
        assert topic in design


def test_the_image_the_manifests_run_is_named_with_how_to_build_it() -> None:
    kustomization = yaml.safe_load((ROOT / "kustomize" / "base" / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    reference = f"{image['newName']}:{image['newTag']}"
    assert image["newTag"] == __version__  # the tag is the package's version
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"ARG VERSION={__version__}" in dockerfile
    install = (DOCS / "install.md").read_text()
    assert f"`{reference}`" in install
    assert "docker build" in install and "docker push" in install
    # The chart's defaults run the image a release publishes, as the README names it.
    assert chart_daemonset()["spec"]["template"]["spec"]["containers"][0]["image"] == reference
    assert reference.replace(__version__, "<version>") == "ghcr.io/otel-vgpu/otel-vgpu:<version>"
    for published in ("`ghcr.io/otel-vgpu/otel-vgpu:<version>`", "`oci://ghcr.io/otel-vgpu/charts/otel-vgpu`"):
        assert published in README and published in install, published
    # Until a release publishes it, the README's first install builds and pushes it.
    assert "Until the project's first release no registry serves the image" in README


def test_the_own_registry_overlay_renders(tmp_path: Path) -> None:
    block = re.search(r"```yaml\n(# my-cluster/kustomization.yaml.*?)```", (DOCS / "install.md").read_text(), re.DOTALL)
    assert block, "docs/install.md's overlay for one's own registry"
    (tmp_path / "kustomize").symlink_to(ROOT / "kustomize")
    (tmp_path / "my-cluster").mkdir()
    (tmp_path / "my-cluster" / "kustomization.yaml").write_text(block.group(1))
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path / "my-cluster")],
        capture_output=True,
        text=True,
        check=True,
        env={"KUBECONFIG": "/dev/null", "PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent)},
    ).stdout
    images = re.findall(r"image: (\S+)", rendered)
    assert images and set(images) == {f"registry.example.com/otel-vgpu:{__version__}"}


def test_the_alerts_doc_names_every_shipped_rule_and_no_other() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "otel-vgpu-rules.yaml").read_text())["groups"]
    shipped = {rule.get("alert") or rule["record"] for group in rules for rule in group["rules"]}
    doc = (DOCS / "alerts.md").read_text()
    alerts = set(re.findall(r"^\| `(VGPU\w+)` \|", doc, re.MULTILINE))
    records = set(re.findall(r"`(\w+:\w+:\w+)`", doc))
    assert alerts | records == shipped


def test_the_benchmarks_say_what_they_need_and_how_to_read_them() -> None:
    bench = (ROOT / "bench" / "README.md").read_text()
    for need in ("PyTorch with CUDA", "root", "cgroup v2", "nvidia-ml-py", "util-linux"):
        assert need in bench, need
    assert "Absolute times vary by machine" in bench and "compare the ratios" in bench


def _text_block_after(marker: str) -> str:
    return README.split(marker, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]


def test_the_readmes_excerpt_and_log_are_what_the_builtin_node_serves_and_says() -> None:
    # Every series of the excerpt is one the built-in node serves, with the same labels;
    # the figures that do not move (allocation, capacity, ratio, GPU 0's unattributed) read
    # the same; and the two lines it quotes are the agent's first two, but for address and path.
    excerpt = parse(_text_block_after("GPU 0's rows, from one scrape:"))
    assert len(excerpt.values) >= 8, "an excerpt of pod and GPU families"
    # as the README's first command runs it, in the repository: its gpu_allocation.txt
    wanted = {(name, labels) for name in excerpt.values for labels in excerpt.series(name)}

    def serves_the_excerpts_series(exposition: Exposition) -> bool:
        return all(labels in exposition.series(name) for name, labels in wanted)

    with agent_in_process("--simulate", env=clean_env()) as agent:
        # A pod's SM series waits for its GPU's periods to settle after the start
        # (docs/metrics.md), a sweep or two, later on a loaded machine: scraped until served.
        served = wait_for(agent, serves_the_excerpts_series, timeout=30)
        logged = [line.split(" ", 2)[2] for line in agent.logged().splitlines()[:2]]  # after the time
    steady = {
        "vgpu_pod_memory_allocated_bytes",
        "vgpu_gpu_memory_total_bytes",
        "vgpu_gpu_vgpus",
        "vgpu_gpu_memory_unattributed_bytes",
        "vgpu_gpu_memory_reserved_bytes",
        "vgpu_gpu_memory_unlisted_bytes",
    }
    for name in excerpt.values:
        for labels, value in excerpt.series(name).items():
            assert labels in served.series(name), (name, dict(labels))
            if name in steady:
                assert served.series(name)[labels] == pytest.approx(value, rel=1e-3), name
    quoted = _text_block_after("Its first two lines (after the time) say what it serves:").splitlines()
    assert len(quoted) == len(logged) == 2
    for line, said in zip(quoted, logged, strict=True):
        pattern = re.escape(line).replace(re.escape("0.0.0.0:8080"), r"[\d.]+:\d+").replace(re.escape("…"), r"\S+")
        assert re.fullmatch(pattern, said), (line, said)
    # The counts the prose gives are the scenario's.
    assert "4 GPUs, 8 pods" in logged[0] and "four A100 80 GB GPUs, eight pods" in README


def test_every_doc_is_in_the_index_once() -> None:
    index = (DOCS / "README.md").read_text()
    lines = index.splitlines()
    for doc in sorted(DOCS.rglob("*.md")):
        if doc == DOCS / "README.md":
            continue
        link = f"]({doc.relative_to(DOCS)})"
        holding = [line for line in lines if link in line]
        assert len(holding) == 1, f"docs/README.md: {doc.relative_to(ROOT)} on {len(holding)} lines, not one"
    assert "](docs/README.md)" in README


def test_the_readme_is_a_door() -> None:
    # What it is, the two commands, then a heading each for what an evaluator looks for;
    # the reference is in docs/, and no figure of one machine on one day.
    lines = README.splitlines()
    assert len(lines) <= 300, f"{len(lines)} lines: move the reference to docs/"
    assert lines[0] == "# otel-vgpu" and lines[2].startswith("otel-vgpu is ")
    headings = [line for line in lines if line.startswith("## ")]
    for wanted in (
        "## What the demo shows",
        "## Install on a cluster",
        "## Chargeback",
        "## Moving off dcgm-exporter",
        "## OTLP",
    ):
        assert wanted in headings, wanted
    assert headings.index("## What the demo shows") < headings.index("## Install on a cluster")
    for term in ("**vGPU**", "**ratio**", "**share**"):
        assert term in README.split("## Install on a cluster", 1)[0], f"the demo's reading defines {term}"
    dated = re.findall(r"\b20\d\d-\d\d-\d\d\b|\b\d+ tests\b|\b\d+:\d\d on\b", README)
    assert dated == [], "a figure of one machine and day belongs in the doc that measured it"
    for moved in ("<!-- begin", "## Flags", "## Upgrading", "## Faults", "## Performance"):
        assert moved not in README, moved


def test_the_architecture_picture_is_made_from_its_committed_source() -> None:
    # docs/architecture.svg carries the digest of the .dot it was rendered from
    # (scripts/gen-architecture.sh); and the source renders with Graphviz.
    source = ROOT / "docs" / "architecture.dot"
    image = (ROOT / "docs" / "architecture.svg").read_text()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    assert f"sha256:{digest}" in image, "the picture is stale: run ./scripts/gen-architecture.sh"
    assert shutil.which("dot"), "Graphviz's dot (Debian package graphviz, installed by ./scripts/test.sh)"
    rendered = subprocess.run(["dot", "-Tsvg", str(source)], capture_output=True, text=True, check=True).stdout
    assert "<svg" in rendered and "Prometheus" in rendered and "Prometheus" in image
    assert "](docs/architecture.svg)" in README


def test_every_relative_link_of_the_docs_resolves() -> None:
    # A section moved to docs/ must not leave a link behind that leads nowhere.
    broken = []
    for doc in doc_files():
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            linked = doc if not path else doc.parent / path
            if not linked.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"(?m)^#+ (.*)$", linked.read_text())
                slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
                if anchor not in slugs:
                    broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_semconv_docs_examples_of_prometheus_names_follow_otlptranslator() -> None:
    # Each "`name` (`unit`, kind) → `prometheus_name`" of docs/otlp-semconv.md, by the rules
    # testkit/otlp_names.py writes out (the table of every family is generated, in metrics.md).
    doc = (DOCS / "otlp-semconv.md").read_text()
    examples = re.findall(r"`([\w.]+)` \(`([^`]*)`, (gauge|counter|updowncounter)\) → `(\w+)`", doc)
    assert len(examples) >= 5, "the rules are shown on the pushed names"
    kinds = {"gauge": ("Gauge", True), "counter": ("Sum", True), "updowncounter": ("Sum", False)}
    for name, unit, kind, shown in examples:
        data_type, monotonic = kinds[kind]
        assert prometheus_name(name, unit, data_type, monotonic) == shown, (name, unit, kind)
