"""The agent as a process on the simulated node: scrapes, probes, reload, errors."""

from __future__ import annotations

import contextlib
import ctypes
import gzip
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from otel_vgpu.collect.estimator import SLACK
from otel_vgpu.logs import rfc3339
from otel_vgpu.sim.proc_tree import PROC_TREE_PREFIX
from testkit.agent import (
    PORT_BLOCK,
    ROOT,
    agent_in_process,
    clean_env,
    command,
    free_port,
    get,
    run_to_exit,
    running_agent,
    swept_per_scrape,
    wait_for,
    wait_until,
)

from ..conftest import GIB, MIB, STEADY

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
UNKNOWN_UID = "0e886e9a-3879-45f9-b44d-86ef9df03224"


def agent_args(scenario_file: Path, ratio_file: Path, *extra: str) -> list[str]:
    return swept_per_scrape(scenario_file, ratio_file, *extra)


def test_scrape_matches_the_scenario(scenario_file: Path, ratio_file: Path) -> None:
    # Expected figures worked out by hand from STEADY at ratio 2; the SM figures once a window
    # settled (at the recorded cadence, after each process's next sample: collect/ledger.py).
    with running_agent(*agent_args(scenario_file, ratio_file)) as agent:
        exposition = wait_for(
            agent,
            lambda e: all(
                e.by("vgpu_pod_sm_utilization_ratio", "pod", "gpu_id").get(("trainer", gpu), 0) > 0 for gpu in "01"
            ),
        )
        code, err = agent.stop()
    assert code == 0, err

    memory = exposition.by("vgpu_pod_memory_used_bytes", "namespace", "pod", "gpu_id")
    assert memory == {
        ("ml", "trainer", "0"): 12 * GIB,
        ("ml", "trainer", "1"): 4 * GIB,
        ("web", "api", "1"): 3 * GIB,
        ("web", "idle", "0"): 0,
        ("kube-system", "probe", "0"): 256 * MIB,
        ("", UNKNOWN_UID, "1"): 1 * GIB,
    }
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id")
    assert allocated[("trainer", "0")] == 2 * 80 * GIB / 2
    assert allocated[("trainer", "1")] == 40 * GIB
    # The kubelet lists api and probe without a device: they use GPUs without an allocation.
    assert allocated[("api", "1")] == 0 and allocated[("probe", "0")] == 0
    # A pod the API (here the simulated node's) does not know holds no share: none is known to be its.
    assert allocated[(UNKNOWN_UID, "1")] == 0
    assert allocated[("idle", "0")] == 40 * GIB
    # NVML gives a process's figure in whole percent: each is known to one percent. On GPU 0 the
    # probe's 0.02 has a sample one period in thirty at the recorded cadence (one process a
    # period, drawn by use): the trainer, alone with figures, may take `SLACK` over its own.
    sm = exposition.by("vgpu_pod_sm_utilization_ratio", "pod", "gpu_id")
    assert 0.6 - 0.01 <= sm[("trainer", "0")] <= 0.6 * (1 + SLACK) + 0.01
    assert sm[("trainer", "1")] == pytest.approx(0.25, abs=0.01)
    assert sm[("api", "1")] == 0 and sm[("idle", "0")] == 0
    vgpu = exposition.by("vgpu_pod_vgpu_utilization_ratio", "pod", "gpu_id")
    assert vgpu[("trainer", "0")] == pytest.approx(sm[("trainer", "0")] * 2 / 2)
    assert vgpu[("trainer", "1")] == pytest.approx(0.25 * 2 / 1, abs=0.01 * 2 / 1)
    assert ("probe", "0") not in vgpu  # SM against no share: no figure
    processes = exposition.by("vgpu_pod_processes", "pod", "gpu_id")
    assert processes[("trainer", "0")] == 2 and processes[("idle", "0")] == 0

    uuids = {dict(labels)["gpu_id"]: dict(labels)["gpu_uuid"] for labels in exposition.series("vgpu_pod_processes")}
    assert uuids == {"0": GPU0, "1": GPU1}
    assert exposition.by("vgpu_gpu_memory_total_bytes", "gpu_id") == {("0",): 80 * GIB, ("1",): 80 * GIB}
    assert exposition.by("vgpu_gpu_vgpus", "gpu_id") == {("0",): 2, ("1",): 2}
    unattributed = exposition.by("vgpu_gpu_memory_unattributed_bytes", "gpu_id")
    assert unattributed == {("0",): 512 * MIB, ("1",): 0}
    models = {dict(labels)["gpu_model"] for labels in exposition.series("vgpu_gpu_vgpus")}
    assert models == {"NVIDIA H100 80GB HBM3"}

    # Per GPU, pods plus unattributed account for every process's memory.
    document = yaml.safe_load(STEADY)
    for gpu in ("0", "1"):
        processes_total = sum(
            _size(p["memory"]) for pod in document["pods"] for p in pod.get("processes", []) if str(p["gpu"]) == gpu
        ) + sum(_size(p["memory"]) for p in document["host_processes"] if str(p["gpu"]) == gpu)
        pods_total = sum(v for (_, _, g), v in memory.items() if g == gpu)
        assert pods_total + unattributed[(gpu,)] == processes_total


def _size(text: str) -> int:
    number, unit = text[:-3], text[-3:]
    return int(number) * {"GiB": GIB, "MiB": MIB}[unit]


def test_probes_and_paths(scenario_file: Path, ratio_file: Path) -> None:
    with running_agent(*agent_args(scenario_file, ratio_file)) as agent:
        assert get(f"{agent.url}/healthz")[0] == 200
        status, body, _ = get(f"{agent.url}/readyz")
        assert (status, body) == (200, b"ready: 2 GPUs\n")
        assert get(f"{agent.url}/nope")[0] == 404
        status, body, headers = get(
            f"{agent.url}/metrics", {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"}
        )
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert gzip.decompress(body).rstrip().endswith(b"# EOF")
        agent.stop()


def test_promtool_finds_nothing_to_fix(scenario_file: Path, ratio_file: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by scripts/test.sh (Debian package prometheus)"
    with running_agent(*agent_args(scenario_file, ratio_file, "--seed-metrics")) as agent:
        body = get(f"{agent.url}/metrics")[1]
        agent.stop()
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, check=False)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_ratio_file_is_reloaded_and_bad_change_keeps_last_good(scenario_file: Path, ratio_file: Path) -> None:
    with running_agent(*agent_args(scenario_file, ratio_file)) as agent:
        assert agent.scrape().by("vgpu_gpu_vgpus", "gpu_id")[("0",)] == 2
        ratio_file.write_text("# four per GPU\n4\n")
        exposition = agent.scrape()
        assert exposition.by("vgpu_gpu_vgpus", "gpu_id")[("0",)] == 4
        assert exposition.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id")[("trainer", "0")] == 2 * 80 * GIB / 4

        ratio_file.write_text("0\n")
        # Changed longer ago than the settling time a write in place gets (allocation/ratio.py SETTLE_S).
        os.utime(ratio_file, (time.time() - 10, time.time() - 10))
        first = agent.scrape()
        second = agent.scrape()
        code, err = agent.stop()
    assert first.by("vgpu_gpu_vgpus", "gpu_id")[("0",)] == 4
    errors = [e.by("vgpu_agent_collection_errors_total", "stage")[("allocation_file",)] for e in (first, second)]
    assert errors[0] >= 1 and errors[1] > errors[0]
    assert code == 0
    assert err.count("'0' is below 1") == 1, err


def test_ended_pod_disappears_at_the_next_collection(tmp_path: Path, ratio_file: Path) -> None:
    scenario = tmp_path / "blink.yaml"
    scenario.write_text(
        "gpus: [{memory: 16GiB}]\n"
        "pods:\n"
        "  - {name: steady, processes: [{gpu: 0, memory: 1GiB}]}\n"
        "  - {name: blink, period_s: 1.0, active_s: 0.5, shares: {0: 1}, processes: [{gpu: 0, memory: 2GiB}]}\n"
    )
    seen: set[bool] = set()
    with running_agent(*swept_per_scrape(scenario, ratio_file)) as agent:
        deadline = time.monotonic() + 10
        while seen != {True, False} and time.monotonic() < deadline:
            exposition = agent.scrape()
            pods = {pod for (pod,) in exposition.by("vgpu_pod_memory_allocated_bytes", "pod")}
            assert "steady" in pods
            seen.add("blink" in pods)
            # no zero-filled leftovers: an absent pod is absent from every family
            for family in ("vgpu_pod_memory_used_bytes", "vgpu_pod_processes", "vgpu_pod_sm_utilization_ratio"):
                assert ("blink" in {p for (p,) in exposition.by(family, "pod")}) == ("blink" in pods)
            time.sleep(0.1)
        agent.stop()
    assert seen == {True, False}


def test_sigterm_exits_cleanly_and_removes_the_proc_tree(scenario_file: Path, ratio_file: Path) -> None:
    with running_agent(*agent_args(scenario_file, ratio_file)) as agent:
        agent.scrape()
        started = time.monotonic()
        code, err = agent.stop()
    assert code == 0
    assert time.monotonic() - started < 5
    proc_tree = err.split("proc tree in ")[1].split()[0]
    assert not Path(proc_tree).exists()


def test_sigterm_taken_by_another_thread_stops_the_agent(scenario_file: Path, ratio_file: Path) -> None:
    # The kernel may note a process's signal on any of its threads (or on the main one just before
    # it sleeps), and Python runs the handler on the main thread only, once it runs again: the
    # agent waiting in Event.wait() without a timeout outlived such a SIGTERM. Here the signal
    # goes to the server's thread alone (tgkill), as the kernel sometimes sends it.
    with running_agent(*agent_args(scenario_file, ratio_file)) as agent:
        pid = agent.process.pid
        server = wait_until(lambda: http_thread_of(pid), what="the server's thread")
        assert ctypes.CDLL(None, use_errno=True).tgkill(pid, server, signal.SIGTERM) == 0
        started = time.monotonic()
        _, err = agent.process.communicate(timeout=10)
    assert agent.process.returncode == 0
    assert time.monotonic() - started < 5
    assert "received SIGTERM, shutting down" in err


def test_builtin_scenario_and_environment_twins(ratio_file: Path) -> None:
    env = clean_env(OTEL_VGPU_SIMULATE="true", OTEL_VGPU_ALLOCATION_FILE=str(ratio_file), OTEL_VGPU_SEED_METRICS="1")
    with running_agent(env=env) as agent:
        exposition = agent.scrape()
        agent.stop()
    namespaces = {ns for (ns,) in exposition.by("vgpu_pod_memory_used_bytes", "namespace")}
    assert len(namespaces) >= 2
    assert exposition.series("pod_gpu_memory_used")
    target = dict(next(iter(exposition.series("target_info"))))
    assert target["k8s_node_name"] == "sim-gpu-node-1"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "no such file"),
        ("", "no value"),
        ("abc\n", ":1: 'abc' is not a number"),
        ("# ratio\n0\n", ":2: '0' is below 1"),
        ("-3", ":1: '-3' is not a number"),
        ("NaN", ":1: 'NaN' is not a number"),
        ("inf", ":1: 'inf' is not a number"),
        ("0.5", ":1: '0.5' is not a whole number"),
    ],
)
def test_bad_ratio_file_at_start_exits_2_with_one_line(tmp_path: Path, content: str | None, fragment: str) -> None:
    path = tmp_path / "gpu_allocation.txt"
    if content is not None:
        path.write_text(content)
    result = run_to_exit(["--simulate", "--allocation-file", str(path), "--port", str(free_port())])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0] and fragment in lines[0]


def test_port_in_use_exits_2_with_one_line(scenario_file: Path, ratio_file: Path) -> None:
    with running_agent(*agent_args(scenario_file, ratio_file)) as agent:
        port = agent.url.rsplit(":", 1)[1]
        result = run_to_exit([*agent_args(scenario_file, ratio_file), "--address", "127.0.0.1", "--port", port])
        agent.stop()
    assert result.returncode == 2
    # One line, nothing before it (the simulated node is described only once serving), and the fix.
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in lines[0]
    assert "choose another port with --port or OTEL_VGPU_PORT" in lines[0]


def test_a_missing_ratio_file_names_the_flag_and_its_variable(tmp_path: Path) -> None:
    missing = tmp_path / "gpu_allocation.txt"
    for args in (["--allocation-file", str(missing)], ["--simulate", "--allocation-file", str(missing)]):
        result = run_to_exit([*args, "--port", str(free_port())])
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert f"{missing}: no such file" in lines[0]
        assert "--allocation-file or OTEL_VGPU_ALLOCATION_FILE" in lines[0]


def test_simulate_from_elsewhere_uses_the_scenarios_ratio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no gpu_allocation.txt here
    with agent_in_process("--simulate", env=clean_env()) as agent:
        vgpus = agent.scrape().by("vgpu_gpu_vgpus", "gpu_id")
        log = agent.logged()
    assert set(vgpus.values()) == {2.0}  # what the built-in scenario states
    assert "(ratio 2 from the simulated node (no gpu_allocation.txt)" in log
    scenario = tmp_path / "node.yaml"
    scenario.write_text("ratio: 4\ngpus: [{memory: 80GiB}]\n")
    with agent_in_process("--simulate", str(scenario), env=clean_env()) as agent:
        assert set(agent.scrape().by("vgpu_gpu_vgpus", "gpu_id").values()) == {4.0}


def proc_trees() -> set[Path]:
    return set(Path("/dev/shm").glob(f"{PROC_TREE_PREFIX}*"))


def proc_trees_of(pid: int, before: set[Path]) -> list[Path]:
    """The simulated proc trees an agent made: each is named after the PID that made it, so one
    test's check is not upset by the agents other workers start and stop meanwhile; those there
    `before` it started are an earlier holder's of its PID (an agent killed with SIGKILL leaves
    its tree), not its own."""
    return sorted(tree for tree in Path("/dev/shm").glob(f"{PROC_TREE_PREFIX}{pid}-*") if tree not in before)


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        (["--port", "99999"], {}, "invalid port '99999'"),
        (["--min-interval", "-1"], {}, "invalid interval '-1'"),
        (["--log-level", "loud"], {}, "invalid log level 'loud'"),
        ([], {"OTEL_VGPU_LOG_LEVEL": "loud"}, "OTEL_VGPU_LOG_LEVEL: invalid log level 'loud': expected one of"),
        (["--log-format", "xml"], {}, "--log-format: invalid log format 'xml': expected one of text, json, logfmt"),
        ([], {"OTEL_VGPU_LOG_FORMAT": "yaml"}, "OTEL_VGPU_LOG_FORMAT: invalid log format 'yaml': expected one of"),
        ([], {"OTEL_VGPU_PORT": "http"}, "invalid port 'http'"),
        ([], {"OTEL_VGPU_SEED_METRICS": "maybe"}, "OTEL_VGPU_SEED_METRICS='maybe'"),
        (["--no-such-flag"], {}, "unrecognized arguments"),
        # OTLP settings, each checked whole at start (no spinning or dead push thread later).
        (["--otlp-endpoint", "http://c:4317"], {"OTEL_METRIC_EXPORT_INTERVAL": "nan"}, "milliseconds from 100 to"),
        (["--otlp-endpoint", "http://c:4317"], {"OTEL_METRIC_EXPORT_INTERVAL": "inf"}, "milliseconds from 100 to"),
        (["--otlp-endpoint", "http://c:4317"], {"OTEL_METRIC_EXPORT_INTERVAL": "1e20"}, "milliseconds from 100 to"),
        (["--otlp-endpoint", "http://c:4317"], {"OTEL_METRIC_EXPORT_INTERVAL": "1"}, "milliseconds from 100 to"),
        (["--otlp-endpoint", "http://c:4317"], {"OTEL_METRIC_EXPORT_TIMEOUT": "nan"}, "OTEL_METRIC_EXPORT_TIMEOUT"),
        (["--otlp-endpoint", "http://[::1"], {}, "--otlp-endpoint='http://[::1': not a URL"),
        (["--otlp-endpoint", "collector:4317"], {}, "expected an http:// or https:// URL"),
        (["--otlp-endpoint", "notaurl"], {}, "--otlp-endpoint='notaurl': expected an http:// or https:// URL"),
        (
            ["--otlp-endpoint", "http://c:4317"],
            {"OTEL_EXPORTER_OTLP_COMPRESSION": "garbage"},
            "OTEL_EXPORTER_OTLP_COMPRESSION='garbage': expected one of gzip, deflate, none",
        ),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], env: dict[str, str], fragment: str) -> None:
    before = proc_trees()
    process = subprocess.Popen(
        command("--simulate", *args),
        env=clean_env(**env),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 2
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert fragment in stderr
    assert proc_trees_of(process.pid, before) == [], "the simulated proc tree is left behind"


def test_a_session_without_workers_is_given_no_port_a_worker_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # scripts/test.sh runs the hostile-client tests beside the xdist workers: a port both
    # sessions were given went to whichever server bound it first, and the other's tests
    # scraped it.
    def block_of(worker: str | None) -> int:
        if worker is None:
            monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
        else:
            monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        return free_port() // PORT_BLOCK

    alone = block_of(None)
    workers = {block_of(f"gw{n}") for n in range(16)}
    assert alone not in workers, (alone, workers)
    assert max(workers | {alone}) * PORT_BLOCK + PORT_BLOCK <= 32768, "below Linux's ephemeral ports"


def test_each_thread_has_its_name_in_the_kernel(scenario_file: Path, ratio_file: Path) -> None:
    # What top and ps show, and what bench/gpu_thread_cpu.py tells the threads' CPU apart by.
    with running_agent(*agent_args(scenario_file, ratio_file, "--sweep-interval", "2")) as agent:
        agent.scrape()
        tasks = Path(f"/proc/{agent.process.pid}/task")
        names = {(task / "comm").read_text().strip() for task in tasks.iterdir()}
        code, err = agent.stop()
    assert code == 0, err
    assert {"http", "http-worker_0", "sweeper", "process-watch", "xid-events"} <= names, names


@pytest.mark.parametrize("name", ["SIGHUP", "SIGUSR1", "SIGUSR2"])
def test_other_signals_neither_kill_the_agent_nor_leave_anything_behind(
    name: str, scenario_file: Path, ratio_file: Path
) -> None:
    with running_agent("--simulate", str(scenario_file), "--allocation-file", str(ratio_file)) as agent:
        agent.process.send_signal(getattr(signal, name))
        # Still serving, after the signal was handled.
        assert wait_until(lambda: agent.scrape().series("vgpu_pod_memory_used_bytes"), what="a scrape after it")
        assert agent.process.poll() is None
        code, err = agent.stop()
    assert code == 0 and f"received {name}: ignored" in err


def test_bad_scenario_exits_2_naming_the_line(tmp_path: Path, ratio_file: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("gpus:\n  - memory: 80GiB\npods:\n  - name: a\n    processes: [{gpu: 5}]\n")
    result = run_to_exit(["--simulate", str(path), "--allocation-file", str(ratio_file)])
    assert result.returncode == 2
    assert f"{path}:5: pods[0].processes[0].gpu: 5 is not a GPU index" in result.stderr


def nvml_loads() -> bool:
    """Whether this machine has an NVIDIA driver's NVML to load."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(nvml_loads(), reason="needs a machine without an NVIDIA driver: here NVML loads")
def test_without_a_gpu_and_without_simulate_it_refuses(ratio_file: Path) -> None:
    result = run_to_exit(["--allocation-file", str(ratio_file), "--port", str(free_port())])
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "NVML" in lines[0] and "--simulate" in lines[0]


def test_help_lists_every_flag_with_its_environment_twin() -> None:
    result = run_to_exit(["--help"])
    assert result.returncode == 0
    for flag, variable in [
        ("--port", "OTEL_VGPU_PORT"),
        ("--address", "OTEL_VGPU_ADDRESS"),
        ("--allocation-file", "OTEL_VGPU_ALLOCATION_FILE"),
        ("--proc-root", "OTEL_VGPU_PROC_ROOT"),
        ("--node-name", "OTEL_VGPU_NODE_NAME"),
        ("--simulate", "OTEL_VGPU_SIMULATE"),
        ("--min-interval", "OTEL_VGPU_MIN_INTERVAL"),
        ("--seed-metrics", "OTEL_VGPU_SEED_METRICS"),
        ("--gpu-resource", "OTEL_VGPU_GPU_RESOURCE"),
        ("--otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT"),
        ("--otlp-protocol", "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ("--otlp-interval", "OTEL_METRIC_EXPORT_INTERVAL"),
        ("--log-level", "OTEL_VGPU_LOG_LEVEL"),
        ("--log-format", "OTEL_VGPU_LOG_FORMAT"),
    ]:
        assert flag in result.stdout and variable in result.stdout, flag
    assert "OTEL_VGPU_GPU_RESOURCES" not in result.stdout  # the former name, read but not taught


def test_json_logs_are_one_object_a_line_and_the_plural_variable_warns_once(
    scenario_file: Path, ratio_file: Path
) -> None:
    env = clean_env(OTEL_VGPU_LOG_FORMAT="json", OTEL_VGPU_GPU_RESOURCES="nvidia.com/gpu")
    started = rfc3339(time.time() - 1)
    with running_agent(*agent_args(scenario_file, ratio_file), env=env) as agent:
        agent.scrape()
        code, err = agent.stop()
    assert code == 0, err
    lines = [json.loads(line) for line in err.splitlines()]  # every line is one JSON object
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line), line
        # RFC 3339 in UTC, to the millisecond: as strings, in time order.
        assert line["time"].endswith("Z") and len(line["time"]) == len("2026-01-01T00:00:00.000Z")
        assert started <= line["time"] <= rfc3339(time.time()), line
    messages = [line["message"] for line in lines]
    assert any(message.startswith("serving http://127.0.0.1:") for message in messages), messages
    assert "received SIGTERM, shutting down" in messages
    renamed = [line for line in lines if "OTEL_VGPU_GPU_RESOURCES" in line["message"]]
    assert len(renamed) == 1, renamed
    assert renamed[0]["level"] == "warning" and renamed[0]["logger"] == "otel_vgpu"
    assert "rename it OTEL_VGPU_GPU_RESOURCE " in renamed[0]["message"]
    assert renamed[0]["variable"] == "OTEL_VGPU_GPU_RESOURCES"
    assert renamed[0]["replacement"] == "OTEL_VGPU_GPU_RESOURCE"


def http_thread_of(pid: int) -> int | None:
    """The agent's server thread, by name. Each thread's name is read on its own: one
    that ends between the listing and the read (a sweep's helper) must not fail the look."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() == "http":
                return int(tid)
    return None
