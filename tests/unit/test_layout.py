"""The package's layout follows the flow: no module imports from a layer above its own."""

from __future__ import annotations

import ast
import re
import socket
import subprocess
from pathlib import Path

import pytest

from testkit.agent import ROOT

from ..conftest import LONGEST_FIRST, NotAUnitTest

pytestmark = pytest.mark.unit

PACKAGE = ROOT / "otel_vgpu"
# Lower layers first. A module may import from lower layers and from its own
# package; never from a layer above, nor from a sibling package of its layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "otel_vgpu",
        "otel_vgpu.conventions",
        "otel_vgpu.files",
        "otel_vgpu.logs",
        "otel_vgpu.memory",
        "otel_vgpu.patterns",
        "otel_vgpu.threads",
        "otel_vgpu.wording",
    ),
    ("otel_vgpu.flag_values", "otel_vgpu.limits"),
    ("otel_vgpu.flag_spec",),
    ("otel_vgpu.config", "otel_vgpu.agent_health"),
    ("otel_vgpu.gpu", "otel_vgpu.pods"),
    ("otel_vgpu.allocation",),
    ("otel_vgpu.kubernetes", "otel_vgpu.sim"),
    ("otel_vgpu.collect",),
    ("otel_vgpu.export",),
    ("otel_vgpu.endpoint",),
    ("otel_vgpu.agent",),
    ("otel_vgpu.cli", "otel_vgpu.flag_table"),
    ("otel_vgpu.__main__",),
)


def unit_of(module: str) -> str | None:
    """The layer entry a module belongs to: itself or its package, named in LAYERS; None for a
    module no entry names. The bare package, `otel_vgpu`, is its own `__init__` alone: were it
    a fallback, a new top-level module would land in the lowest layer unnoticed."""
    parts = module.split(".")
    candidates = [".".join(parts[:i]) for i in range(len(parts), 1, -1)] + ([module] if len(parts) == 1 else [])
    every = {name for layer in LAYERS for name in layer}
    return next((c for c in candidates if c in every), None)


def rank(unit: str | None) -> int:
    assert unit is not None, "a module in no layer has no rank"
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(ROOT).with_suffix("")
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        found[".".join(parts)] = path
    return found


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("otel_vgpu"):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names if alias.name.startswith("otel_vgpu")}
    return names


def test_every_module_has_a_layer() -> None:
    unplaced = [module for module in modules() if unit_of(module) is None]
    assert unplaced == [], f"modules in no layer of LAYERS: {unplaced}"
    # A module or package that LAYERS does not name has none, whatever its parent.
    assert unit_of("otel_vgpu.nowhere") is None and unit_of("otel_vgpu.gpu.nowhere") == "otel_vgpu.gpu"


# A module past this does more than one job (docs/layout.md): split it by job.
MOST_LINES = 600


def test_no_module_of_the_agent_or_the_testkit_is_over_the_bound() -> None:
    modules = [*PACKAGE.rglob("*.py"), *(ROOT / "testkit").rglob("*.py")]
    sizes = {path: len(path.read_text().splitlines()) for path in modules}
    over = {str(path.relative_to(ROOT)): lines for path, lines in sizes.items() if lines > MOST_LINES}
    assert sizes and not over, f"over {MOST_LINES} lines: {over}"


def test_no_module_imports_upward() -> None:
    upward = []
    for module, path in modules().items():
        if "_pb2" in module:
            continue  # generated
        own = unit_of(module)
        assert own is not None, module  # test_every_module_has_a_layer says which
        for imported in imports_of(path):
            other = unit_of(imported)
            assert other is not None, f"{module} imports {imported}, in no layer"
            if other != own and rank(other) >= rank(own) and other != "otel_vgpu":
                upward.append(f"{module} imports {imported}")
    assert upward == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from otel_vgpu.collect.sampler import Sampler\n")
    assert imports_of(bad) == {"otel_vgpu.collect.sampler"}
    assert rank(unit_of("otel_vgpu.collect.sampler")) > rank(unit_of("otel_vgpu.gpu.nvml"))


# The endpoint serves the metrics without knowing any: the server and its bounds import nothing
# of export/, and what each path answers (paths.py) takes the telemetry's render and the
# exposition's formats, never a family's declaration.
ENDPOINT_USES_OF_EXPORT = {"otel_vgpu.endpoint.paths": {"otel_vgpu.export.exposition", "otel_vgpu.export.telemetry"}}


def test_the_endpoint_imports_no_family() -> None:
    endpoint = {module: path for module, path in modules().items() if unit_of(module) == "otel_vgpu.endpoint"}
    assert ENDPOINT_USES_OF_EXPORT.keys() <= endpoint.keys() and "otel_vgpu.endpoint.server" in endpoint
    beyond = []
    for module, path in endpoint.items():
        used = {imported for imported in imports_of(path) if unit_of(imported) == "otel_vgpu.export"}
        beyond += [f"{module} imports {imported}" for imported in used - ENDPOINT_USES_OF_EXPORT.get(module, set())]
    assert beyond == []


# Two modules of one basename read as one in a traceback, a log line, or a doc that names the
# file alone. A pair that must stay shared is listed here with its reason; a pair no longer
# shared leaves the list.
SHARED_BASENAMES: dict[tuple[str, ...], str] = {}


def shared_basenames(paths: list[Path]) -> set[tuple[str, ...]]:
    """The groups of `paths` (relative to the repository) that share a file name; a package's
    `__init__.py` and the generated modules are not counted."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        if path.name != "__init__.py" and "_pb2" not in path.name:
            by_name.setdefault(path.name, []).append(str(path))
    return {tuple(sorted(group)) for group in by_name.values() if len(group) > 1}


def test_no_two_modules_share_a_basename() -> None:
    shared = shared_basenames([path.relative_to(ROOT) for path in PACKAGE.rglob("*.py")])
    assert sorted(shared - SHARED_BASENAMES.keys()) == [], "modules of one basename: rename one by what it is"
    assert sorted(SHARED_BASENAMES.keys() - shared) == [], "no longer shared: take them off SHARED_BASENAMES"
    assert all(SHARED_BASENAMES.values()), "each pair left shared says why"


def test_the_basename_check_sees_a_shared_name() -> None:
    paths = [Path("otel_vgpu/a/read.py"), Path("otel_vgpu/b/read.py"), Path("otel_vgpu/a/__init__.py")]
    paths += [Path("otel_vgpu/b/__init__.py"), Path("otel_vgpu/c/x_pb2.py"), Path("otel_vgpu/d/x_pb2.py")]
    assert shared_basenames(paths) == {("otel_vgpu/a/read.py", "otel_vgpu/b/read.py")}


def top_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
    return names


def test_tests_and_benchmarks_share_testkit_and_never_import_each_other() -> None:
    # One kit: what two scripts share lives in testkit/, so no bench script imports another.
    crossing = []
    for folder, forbidden in (("tests", {"bench"}), ("bench", {"tests", "bench"}), ("testkit", {"tests", "bench"})):
        for path in (ROOT / folder).rglob("*.py"):
            if top_imports(path) & forbidden:
                crossing.append(str(path.relative_to(ROOT)))
    assert crossing == []


def named_modules(text: str) -> set[str]:
    """The module paths a layout document names in backticks."""
    return set(re.findall(r"`((?:otel_vgpu|testkit)/[\w/]+\.py)`", text))


def test_the_layout_names_every_module_and_only_those() -> None:
    layout = (ROOT / "docs" / "layout.md").read_text()
    modules_here = {
        str(path.relative_to(ROOT))
        for folder in ("otel_vgpu", "testkit")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "__init__.py" and "_pb2" not in path.name
    }
    named = named_modules(layout)
    assert sorted(modules_here - named) == [], "modules docs/layout.md does not name"
    assert sorted(named - modules_here) == [], "names in docs/layout.md that are no module"


def test_the_layout_check_sees_a_missing_module() -> None:
    assert named_modules("| `otel_vgpu/a.py` | x |\n`testkit/b/c.py` and otel_vgpu/d.py") == {
        "otel_vgpu/a.py",
        "testkit/b/c.py",
    }


def test_no_test_module_imports_another() -> None:
    # Helpers two test files need live in testkit/; a test module imports only tests/conftest.py.
    crossing = []
    for path in TESTS.rglob("*.py"):
        name = path.relative_to(TESTS)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > 0 and node.module != "conftest":
                crossing.append(f"{name} imports {'.' * node.level}{node.module}")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tests"):
                crossing.append(f"{name} imports {node.module}")
    assert crossing == []


# The tests are laid out as the code is (docs/layout.md, "Tests"): tests/unit/ mirrors the
# package's folders, a module's tests in the folder of its package (tests of a top-level module,
# of the scripts and of the shipped files in tests/unit/ itself), and what starts a process (the
# agent, Prometheus, rotel, wrk, podman, helm, kubectl, promtool) lives in tests/system/.
TESTS = ROOT / "tests"
TEST_FOLDERS = ("unit", "system")


def misplaced_tests(tests: Path, package: Path) -> list[str]:
    """What of the tree `tests` breaks the layout, against the package folder `package`: a test
    module outside tests/unit/ and tests/system/, a folder of tests/unit/ that is no package's,
    a folder of tests without its `__init__.py` (a test module is imported by its package's
    name, so two of one basename in two folders are two modules), and a module marked `unit`
    outside tests/unit/."""
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        relative = path.relative_to(tests)
        if relative.parts[0] not in TEST_FOLDERS or len(relative.parts) > (3 if relative.parts[0] == "unit" else 2):
            found.append(f"{relative}: not in tests/unit/ or tests/unit/<package>/ or tests/system/")
        elif relative.parts[0] != "unit" and re.search(r"(?m)^pytestmark = .*pytest\.mark\.unit\b", path.read_text()):
            found.append(f"{relative}: marked unit, outside tests/unit/")
    for folder in sorted(tests.glob("unit/*/")):
        if folder.name != "__pycache__" and not (package / folder.name / "__init__.py").exists():
            found.append(f"unit/{folder.name}/: no otel_vgpu/{folder.name}/")
    for folder in sorted({path.parent for path in tests.rglob("test_*.py")}):
        if not (folder / "__init__.py").exists():
            found.append(f"{folder.relative_to(tests)}/: no __init__.py")
    return found


def test_the_tests_are_laid_out_as_the_code_is() -> None:
    assert misplaced_tests(TESTS, PACKAGE) == []
    # Every folder of tests/unit/ is a package's; each holds tests.
    assert sorted(path.parent.name for path in TESTS.glob("unit/*/test_*.py")), "tests/unit/ has no package folder"


def test_the_test_layout_check_sees_a_misplaced_module(tmp_path: Path) -> None:
    package = tmp_path / "otel_vgpu"
    (package / "collect").mkdir(parents=True)
    (package / "collect" / "__init__.py").write_text("")
    tests = tmp_path / "tests"
    for folder in ("", "unit", "unit/collect", "unit/nowhere", "system", "loose"):
        (tests / folder).mkdir(parents=True)
        (tests / folder / "__init__.py").write_text("")
    marked = "import pytest\n\npytestmark = pytest.mark.unit\n"
    (tests / "test_flat.py").write_text("")
    (tests / "loose" / "test_loose.py").write_text("")
    (tests / "unit" / "collect" / "test_fine.py").write_text(marked)
    (tests / "unit" / "nowhere" / "test_x.py").write_text("")
    (tests / "system" / "test_marked.py").write_text(marked)
    (tests / "system" / "test_started.py").write_text("")
    (tests / "unit" / "collect" / "deeper").mkdir()
    (tests / "unit" / "collect" / "deeper" / "test_deep.py").write_text("")
    assert misplaced_tests(tests, package) == [
        "loose/test_loose.py: not in tests/unit/ or tests/unit/<package>/ or tests/system/",
        "system/test_marked.py: marked unit, outside tests/unit/",
        "test_flat.py: not in tests/unit/ or tests/unit/<package>/ or tests/system/",
        "unit/collect/deeper/test_deep.py: not in tests/unit/ or tests/unit/<package>/ or tests/system/",
        "unit/nowhere/: no otel_vgpu/nowhere/",
        "unit/collect/deeper/: no __init__.py",
    ]


# Where the docs, the code's comments and the scripts say a proof lives, it does.
CITING: tuple[str, ...] = ("README.md", "docs", "bench", "testkit", "scripts", "otel_vgpu", "charts", "kustomize")
CITING += ("collector-config", "deploy", "tests", "pyproject.toml", "Dockerfile", ".github")


def cited_test_paths(text: str) -> set[str]:
    """The test modules a text names by path."""
    return set(re.findall(r"\btests/(?:[\w-]+/)*test_\w+\.py\b", text))


def test_every_test_module_a_file_cites_exists() -> None:
    missing = []
    for name in CITING:
        top = ROOT / name
        for path in [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()):
            if "__pycache__" in path.parts or path.suffix in {".gz", ".svg", ".png"}:
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            missing += [
                f"{path.relative_to(ROOT)}: {cited}" for cited in cited_test_paths(text) if not (ROOT / cited).exists()
            ]
    assert missing == []


def test_the_files_sent_first_are_test_modules_that_exist() -> None:
    # A name in the order the suite is sent out in that no longer names a test module (renamed,
    # moved) would quietly go to the back: the order holds only for modules that are there.
    modules = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    assert [name for name in LONGEST_FIRST if name not in modules] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_the_citation_check_sees_a_test_module() -> None:
    text = (
        "(tests/system/test_chart.py holds them alike), `tests/unit/collect/test_usage.py::test_x`, tests/data/a.json"
    )
    assert cited_test_paths(text) == {"tests/system/test_chart.py", "tests/unit/collect/test_usage.py"}


def test_a_unit_test_that_starts_a_process_or_opens_a_socket_fails() -> None:
    # tests/conftest.py enforces the mark: `pytest -m unit` is fast because nothing it runs waits.
    with pytest.raises(NotAUnitTest, match="a process started"):
        subprocess.run(["true"], check=False)
    with socket.socket() as sock, pytest.raises(NotAUnitTest, match="a socket bound"):
        sock.bind(("127.0.0.1", 0))
