"""Every shell command the docs show holds: it parses, names files that exist, calls the
tools the README installs, and, where it needs no GPU and no cluster, it runs.

What runs here, and how:
- the README's first command, as written, in a fresh copy of the repository: the agent
  it starts serves the simulated node's figures;
- `kubectl kustomize ...`, as written: it renders;
- `helm template`, `lint` and `package`, as written, and `helm install` and `upgrade` as
  `helm template` with the same arguments (every install flag is one of template's; an
  upgrade's `--reuse-values` has no release to reuse and is left out), the cluster's custom
  kinds listed: the chart renders with those values and flags; where the block builds and
  pushes an image first, the DaemonSet runs the image pushed;
- `.venv/bin/pytest ...`: its selection, collected (the suite runs the tests themselves), once for
  each command line that several docs show alike, as are the benchmarks below;
- `.venv/bin/python bench/...` of the scripts that need no GPU: as written (those that
  repeat a measurement many times for its figures with fewer repeats and pods, SCALED), except
  those whose full run takes minutes (SLOW_BENCHES), which answer `--help`: that proves
  they start with the packages the README installs; bench/README.md quotes their figures.
The rest (a cluster, a GPU node, an image registry, the suite itself) are checked
without running: testkit/doc_commands.py (an image build: its context and Dockerfile are here,
and its block pushes only what it tagged).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.agent import clean_env, free_port, get, wait_until
from testkit.doc_commands import ROOT, DocCommand, block_commands, commands, doc_files, problems, pushed_image, words
from testkit.helm import CUSTOM_KINDS, helm
from testkit.yamldocs import documents

ALL = [command for doc in doc_files() for command in commands(doc)]
# Benchmarks whose full run is minutes long, or needs what CI does not install.
SLOW_BENCHES = {
    "bench/kube_client_cost.py": "needs the official Kubernetes client in its own venv (docs/kubernetes.md)",
    "bench/wrk_keepalive.py": "loads both servers with wrk for half a minute, one after the other: run by hand",
    "bench/nvml_sampling_stats.py": "tabulates recordings made on a GPU machine, which tests/data/nvml-recordings "
    "does not hold yet (docs/nvml-sampling.md)",
}


# Benchmarks run as written with fewer repeats of their measurement, on a smaller node, for less time: the
# flags appended (argparse takes the last), so that every flag the docs show still runs, and the figures
# the docs quote are printed as the docs quote them.
SCALED = {
    "bench/scrape_profile.py": ["--runs", "3", "--pods", "40"],
    "bench/scrape_bench.py": [
        "--sizes",
        "8",
        "--scrapes",
        "10",
        "--warmup",
        "2",
        "--clients",
        "4",
        "--seconds",
        "1",
        "--idle",
        "10",
    ],
    "bench/sweep_cost.py": ["--seconds", "2", "--intervals", "0", "2", "--scrape-every", "1"],
    "bench/soak.py": ["--pods", "100", "--live", "20", "--processes", "2"],
    "bench/health_families_cost.py": ["--seconds", "120", "--rounds", "1"],
}
# What the docs quote of them is a ratio against a reference of the same run: they print it.
RATIOS = {
    "bench/scrape_bench.py": r"\d\.\d\dx",
    "bench/sweep_cost.py": r"\| 2 s \|.*\| \d+\.\d\dx \|",
    "bench/soak.py": r"RSS \d\.\d+x and open fds \d\.\d+x",
    "bench/health_families_cost.py": r"\d\.\d\dx the reference \([+-]\d\.\d{4} % of a core\)",
}


def how(command: DocCommand) -> str:
    """How a command is held to what it says: run, help, collect, or check (why not run)."""
    first = words(command.text)[0]
    if first[:2] == ["kubectl", "kustomize"] and len(first) > 2:
        return "run"
    if first[0] == "helm" and first[1:2] in (["template"], ["lint"], ["package"], ["install"], ["upgrade"]):
        return "helm"
    if first[0] == ".venv/bin/pytest":
        return "collect"
    if first[0] == ".venv/bin/python" and len(first) > 1 and first[1].startswith("bench/"):
        return "help" if first[1] in SLOW_BENCHES else "bench"
    return "check"


# Options of helm upgrade alone, which read the release a cluster holds: a render has none.
UPGRADE_ONLY = {"--reuse-values", "--reset-values", "--reset-then-reuse-values"}


def test_there_are_commands_to_check() -> None:
    assert {how(c) for c in ALL} == {"run", "helm", "collect", "help", "bench", "check"}
    # The README opens with what the tool is, then its two commands: the demo and the tests.
    readme = [c for c in ALL if c.doc == ROOT / "README.md" and c.block is not None]
    assert [c.text for c in readme[:2]] == [
        "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/otel-vgpu --simulate",
        "./scripts/test.sh",
    ]
    assert all(c.line < 20 for c in readme[:2]), "the README's two commands, near the top"
    # Its first install builds the image and pushes it, then installs with it (rendered below).
    install = next(c for c in readme if c.text.startswith("helm install"))
    assert [words(c)[0][:2] for c in block_commands(install)] == [
        ["docker", "build"],
        ["docker", "push"],
        ["helm", "install"],
    ]


@pytest.mark.parametrize("command", ALL, ids=lambda c: c.where)
def test_every_command_parses_names_files_that_exist_and_uses_the_venv(command: DocCommand) -> None:
    assert problems(command) == [], command.text


def test_broken_commands_are_caught(tmp_path: Path) -> None:
    doc = tmp_path / "broken.md"
    doc.write_text(
        "Run `pytest -s tests/system/test_agent.py` and `python bench/soak.py`.\n\n"
        "```sh\n"
        ".venv/bin/python bench/no_such_script.py   # a script that is not there\n"
        "kubectl kustomize kustomize/overlays/no-such-overlay\n"
        "if then fi\n"
        "```\n\n"
        "```sh\n"
        "docker build -t registry.example.com/a:1 no-such-context\n"
        "podman build -f no.Dockerfile -t registry.example.com/b:1 .\n"
        "docker push registry.example.com/c:1\n"
        "```\n"
    )
    found = {c.text: problems(c, ROOT) for c in commands(doc)}
    assert "bare 'pytest'" in found["pytest -s tests/system/test_agent.py"][0]
    assert "bare 'python'" in found["python bench/soak.py"][0]
    assert any("bench/no_such_script.py" in p for p in found[".venv/bin/python bench/no_such_script.py"])
    assert any("no-such-overlay" in p for p in found["kubectl kustomize kustomize/overlays/no-such-overlay"])
    assert any("does not parse" in p for p in found["if then fi"])
    assert any(
        "'no-such-context', which is no folder" in p
        for p in found["docker build -t registry.example.com/a:1 no-such-context"]
    )
    assert any(
        "no.Dockerfile, which is not" in p for p in found["podman build -f no.Dockerfile -t registry.example.com/b:1 ."]
    )
    assert any("which no build of its block tags" in p for p in found["docker push registry.example.com/c:1"])
    # and one that parses and names what exists, but fails when run
    broken = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert broken.returncode != 0


def scratch_tree(tmp_path: Path) -> Path:
    """A folder that sees the repository's files, where a command's outputs land instead."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git",):
            (tree / entry.name).symlink_to(entry)
    return tree


@pytest.mark.parametrize("command", [c for c in ALL if how(c) == "run"], ids=lambda c: c.where)
def test_kustomize_commands_render_as_written(command: DocCommand, tmp_path: Path) -> None:
    tree = scratch_tree(tmp_path)
    ran = subprocess.run(["bash", "-c", command.text], capture_output=True, text=True, check=False, cwd=tree)
    assert ran.returncode == 0, ran.stderr
    written = [p for p in tree.iterdir() if not p.is_symlink()]
    rendered = written[0].read_text() if written else ran.stdout
    assert "kind: DaemonSet" in rendered


@pytest.mark.parametrize("command", [c for c in ALL if how(c) == "helm"], ids=lambda c: c.where)
def test_helm_commands_render_as_written_without_a_cluster(command: DocCommand, tmp_path: Path) -> None:
    tree = scratch_tree(tmp_path)
    argv = words(command.text)[0]
    if ">" in argv:  # what it writes, it prints here
        argv = argv[: argv.index(">")]
    if argv[1] in ("install", "upgrade"):
        kept = [a for a in argv[2:] if a not in UPGRADE_ONLY]
        argv = ["helm", "template", *kept, *(f"--api-versions={kind}" for kind in CUSTOM_KINDS)]
    if any(a.endswith(".tgz") or a.startswith("oci://") for a in argv[2:]):
        # The archive `helm package` makes, where the docs install it from a file or a
        # registry (none is reachable here: the archive is what a registry would serve).
        packaged = helm("package", "charts/otel-vgpu", cwd=tree)
        assert packaged.returncode == 0, packaged.stderr
        (archive,) = tree.glob("otel-vgpu-*.tgz")
        argv = [archive.name if a.startswith("oci://") else a for a in argv]
        if "--version" in argv:
            del argv[argv.index("--version") : argv.index("--version") + 2]
    ran = helm(*argv[1:], cwd=tree)
    assert ran.returncode == 0, ran.stderr
    if argv[1] == "lint":
        assert "0 chart(s) failed" in ran.stdout
    elif argv[1] == "package":
        assert list(tree.glob("otel-vgpu-*.tgz")), ran.stdout
    else:
        assert "kind: DaemonSet" in ran.stdout
        pushed = [image for c in block_commands(command) for a in words(c) if (image := pushed_image(a))]
        if pushed and argv[1] == "template":  # the block's install runs the image it pushed
            (daemonset,) = [d for d in documents(ran.stdout) if d["kind"] == "DaemonSet"]
            assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] in pushed, pushed


def selection(command: DocCommand) -> list[str]:
    """The pytest command line that collects the selection `command` names."""
    return [a for a in words(command.text)[0] if a != "-s"]


def bench_line(command: DocCommand) -> str:
    """The shell line a benchmark the docs show runs as here: as written, SCALED's flags appended."""
    script = words(command.text)[0][1]
    return command.text.split("#", 1)[0].rstrip() + "".join(f" {flag}" for flag in SCALED.get(script, []))


def once_each(kind: str, line: Callable[[DocCommand], object]) -> list[DocCommand]:
    """The commands held to what they say by running them (`how` gives `kind`), one per command
    line run: where several docs show the same benchmark or selection, one run holds them all
    (each is still parsed and checked where it stands:
    test_every_command_parses_names_files_that_exist_and_uses_the_venv). A benchmark run takes
    seconds of both cores, and three docs show bench/scrape_bench.py as it runs here."""
    first: dict[str, DocCommand] = {}
    for command in ALL:
        if how(command) == kind:
            first.setdefault(repr(line(command)), command)
    return list(first.values())


@pytest.mark.parametrize("command", once_each("collect", selection), ids=lambda c: c.where)
def test_test_selections_the_docs_name_exist(command: DocCommand) -> None:
    argv = selection(command)
    ran = subprocess.run([*argv, "--collect-only", "-q"], capture_output=True, text=True, check=False, cwd=ROOT)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert " tests collected" in ran.stdout or " test collected" in ran.stdout, ran.stdout


@pytest.mark.parametrize("command", [c for c in ALL if how(c) == "help"], ids=lambda c: c.where)
def test_bench_scripts_the_docs_run_start_with_the_venv(command: DocCommand) -> None:
    argv = words(command.text)[0][:2]
    ran = subprocess.run([*argv, "--help"], capture_output=True, text=True, check=False, cwd=ROOT, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("usage:"), ran.stdout


@pytest.mark.parametrize("command", once_each("bench", bench_line), ids=lambda c: c.where)
def test_quick_bench_scripts_the_docs_show_run_as_written(command: DocCommand) -> None:
    script = words(command.text)[0][1]
    text = bench_line(command)
    ran = subprocess.run(["bash", "-c", text], capture_output=True, text=True, check=False, cwd=ROOT, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert re.search(r"\d+(\.\d+)? (ms|s|%|MiB|seconds)\b", ran.stdout), "it prints its figures"
    if script in RATIOS:
        assert re.search(RATIOS[script], ran.stdout), f"it prints the ratio the docs quote: {ran.stdout[-2000:]}"


def test_the_readmes_first_command_runs_the_agent_on_a_fresh_copy(tmp_path: Path) -> None:
    first = next(c for c in ALL if c.doc == ROOT / "README.md" and c.block is not None)
    assert first.text.startswith("python3 -m venv .venv")
    copy = tmp_path / "otel-vgpu"
    tracked = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True, cwd=ROOT).stdout
    for name in tracked.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    port = free_port()
    # As written; the port comes from the environment, the flag's twin, so that it is free here.
    env = {**clean_env(), "OTEL_VGPU_PORT": str(port)}
    process = subprocess.Popen(
        ["bash", "-c", first.text],
        cwd=copy,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:

        def served() -> bytes | None:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                status, body, _ = get(f"http://127.0.0.1:{port}/metrics", timeout=5)
            except OSError:
                return None
            return body if status == 200 and b"vgpu_pod_memory_used_bytes{" in body else None

        body = wait_until(served, timeout=300, what="the agent of the README's first command serving /metrics")
    finally:
        with contextlib.suppress(ProcessLookupError):  # it exited already: its error is the failure
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # pip mid-install may outlast a TERM: the wait's error stands
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate(timeout=30)
    assert b"vgpu_gpu_memory_total_bytes{" in body
