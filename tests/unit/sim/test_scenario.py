"""Scenario files: the documented format, and located errors."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from otel_vgpu.sim import located
from otel_vgpu.sim.scenario import BUILTIN, ScenarioError, Wave
from otel_vgpu.sim.scenario_file import load_scenario, parse_scenario

from ...conftest import GIB, MIB, STEADY

pytestmark = pytest.mark.unit


def test_builtin_scenario_has_what_the_demo_promises() -> None:
    scenario = load_scenario(BUILTIN)
    assert len(scenario.gpus) >= 2
    assert len(scenario.pods) >= 6
    assert len({pod.namespace for pod in scenario.pods}) >= 2
    assert any(len({p.gpu for p in pod.processes}) >= 2 for pod in scenario.pods), "a pod on two GPUs"
    assert any(len(pod.processes) >= 2 for pod in scenario.pods), "a pod with several processes"
    assert scenario.host_processes, "a process in no pod"
    moving = [p.sm for pod in scenario.pods for p in pod.processes if p.sm.amplitude > 0]
    assert moving, "values that move"
    layouts = {(pod.cgroup.version, pod.cgroup.driver, pod.cgroup.runtime) for pod in scenario.pods}
    assert {1, 2} <= {v for v, _, _ in layouts}
    assert {"systemd", "cgroupfs"} <= {d for _, d, _ in layouts}
    assert {"containerd", "crio", "docker"} <= {r for _, _, r in layouts}


def test_sizes_units_and_defaults() -> None:
    scenario = parse_scenario(STEADY, "steady.yaml")
    assert scenario.gpus[0].memory_total == 80 * GIB
    trainer = scenario.pods[0]
    assert trainer.shares == {0: 2, 1: 1}
    assert trainer.processes[0].memory == Wave(10 * GIB)
    assert scenario.pods[3].processes[0].memory == Wave(256 * MIB)
    assert len(scenario.pods[3].uid) == 32  # static pod: a config hash
    assert scenario.pods[4].uid == "0e886e9a-3879-45f9-b44d-86ef9df03224"


# A process that fills a GPU, its driver reserving nothing: it fits only if its context holds nothing either.
TIGHT = "gpus: [{memory: 1GiB, reserved: 0}]\nhost_processes: [{gpu: 0, memory: 1020MiB, sm: 0, cgroup: '0::/x'}]\n"


def test_a_driver_is_the_h200s_580_by_default_and_the_version_it_states_otherwise() -> None:
    assert parse_scenario("gpus: [{}]\n", "s.yaml").driver.version == "580.159.04"
    assert parse_scenario("gpus: [{}]\ndriver: {version: '550.90.07'}\n", "s.yaml").driver.version == "550.90.07"


def test_a_drivers_contexts_hold_an_h200s_by_default_and_what_it_states_otherwise() -> None:
    assert parse_scenario("gpus: [{}]\n", "s.yaml").driver.context_memory == int(7.1875 * MIB)
    assert parse_scenario("gpus: [{}]\ndriver: {context_memory: 8MiB}\n", "s.yaml").driver.context_memory == 8 * MIB
    # Without contexts, what a GPU holds is its processes' and its reservation alone: 1020 MiB fits in 1 GiB
    # (it is refused with them: test_errors_name_file_line_field_and_what_is_valid).
    assert parse_scenario(TIGHT + "driver: {context_memory: 0}\n", "s.yaml").driver.context_memory == 0


def test_json_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(
        '{"gpus": [{"memory": 2147483648}], "pods": [{"name": "p", "processes": [{"gpu": 0, "memory": "1GB"}]}]}'
    )
    scenario = load_scenario(str(path))
    assert scenario.gpus[0].memory_total == 2 * GIB
    assert scenario.pods[0].processes[0].memory.mean == 1e9


def test_wave_moves_around_its_mean() -> None:
    wave = Wave(mean=0.5, amplitude=0.2, period_s=40)
    assert wave.at(0) == pytest.approx(0.5)
    assert wave.at(10) == pytest.approx(0.7)
    assert wave.at(30) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus: []\n", "bad.yaml:1: gpus: the node needs at least one GPU"),
        ("gpus:\n  - memory: lots\n", "bad.yaml:2: gpus[0].memory: 'lots' is not a size"),
        (
            "gpus:\n  - memory: 1GiB\npods:\n  - name: a\n    processes:\n      - gpu: 3\n",
            "bad.yaml:6: pods[0].processes[0].gpu: 3 is not a GPU index; valid: 0 to 0",
        ),
        ("gpus: [{}]\npods:\n  - name: a\n    colour: red\n", "bad.yaml:4: pods[0]: unknown field 'colour'"),
        (
            "gpus: [{}]\npods:\n  - name: a\n    processes: [{gpu: 0, sm: 1.5}]\n",
            "bad.yaml:4: pods[0].processes[0].sm: 1.5 is not a fraction between 0 and 1",
        ),
        (
            "gpus: [{}]\npods:\n  - name: a\n    cgroup: {runtime: rkt}\n",
            "bad.yaml:4: pods[0].cgroup.runtime: 'rkt'; valid: containerd, crio, docker",
        ),
        ("gpus: [{}]\npods:\n  - name: a\n    shares: {1: 2}\n", "bad.yaml:4: pods[0].shares.1: 1 is not a GPU index"),
        (
            "gpus: [{}]\npods:\n  - name: a\n    uid: not-a-uid\n",
            "bad.yaml:4: pods[0].uid: 'not-a-uid' is not a dashed UUID",
        ),
        ("gpus: [{}]\npods:\n  - {name: a}\n  - {name: a}\n", "bad.yaml:4: pods[1]: default/a is also pods[0]"),
        # What a GPU cannot do is refused: more memory than it has, a pod holding 0 shares of it.
        (
            "gpus: [{memory: 16GiB}]\npods:\n  - name: a\n    processes:\n      - {gpu: 0, memory: 10GiB}\n"
            "      - {gpu: 0, memory: {mean: 5GiB, amplitude: 2GiB}}\n",
            "bad.yaml:1: gpus[0]: the processes on GPU 0 can use up to 17.01 GiB together (14.38 MiB of it for 2 CUDA "
            "contexts); it has 15.4 GiB beside the driver's 0.6006 GiB",
        ),
        (
            "gpus:\n  - memory: 80GiB\n    mig: [{profile: 1g.10gb, memory: 10GiB}]\npods:\n  - name: a\n"
            "    processes: [{gpu: 0, mig: 0, memory: 12GiB}]\n",
            "gpus[0]: the processes on GPU 0's MIG device 0 can use up to 12.01 GiB together (7.188 MiB of it for 1 "
            "CUDA context); it has 10 GiB",
        ),
        (
            "gpus: [{memory: 1GiB}]\nhost_processes: [{gpu: 0, memory: 2GiB, sm: 0, cgroup: '0::/x'}]\n",
            "the processes on GPU 0 can use up to 2.007 GiB together (7.188 MiB of it for 1 CUDA context); it has "
            "0.3994 GiB beside the driver's 0.6006 GiB",
        ),
        # A process's context is memory of the GPU's too: 1020 MiB fits in 1 GiB, not with a context beside it.
        (
            TIGHT,
            "can use up to 1.003 GiB together (7.188 MiB of it for 1 CUDA context); it has 1 GiB beside the "
            "driver's 0 GiB",
        ),
        ("gpus: [{}]\ndriver: {context_memory: -1}\n", "bad.yaml:2: driver.context_memory: -1 is not a size"),
        ("gpus: [{memory: 1GiB, reserved: 1GiB}]\n", "bad.yaml:1: gpus[0].reserved: must be below the GPU's memory"),
        ("gpus: [{reserved: some}]\n", "bad.yaml:1: gpus[0].reserved: 'some' is not a size; valid: bytes"),
        ("gpus: [{}]\ndriver: {memory_info_v2: 1}\n", "bad.yaml:2: driver.memory_info_v2: 1 is not true or false"),
        (
            "gpus: [{}]\ndriver: {one_sample_a_period: 'yes'}\n",
            "bad.yaml:2: driver.one_sample_a_period: 'yes' is not true or false",
        ),
        ("gpus: [{}]\ndriver: {version: 580}\n", "bad.yaml:2: driver.version: 580 must be a version, as 580.159.04"),
        ("gpus: [{}]\ndriver: {draw_seed: -1}\n", "bad.yaml:2: driver.draw_seed: -1 is not a whole number >= 0"),
        ("gpus: [{}]\ndriver: {rhythm_ms: 2000}\n", "bad.yaml:2: driver.rhythm_ms: 2000 must be from 0 to 1000 (ms)"),
        (
            "gpus: [{}]\npods:\n  - name: a\n    processes:\n      - {gpu: 0, dodges_ticks: 1}\n",
            "bad.yaml:5: pods[0].processes[0].dodges_ticks: 1 is not true or false",
        ),
        (
            "gpus: [{}]\npods:\n  - name: a\n    shares: {0: 0}\n",
            "bad.yaml:4: pods[0].shares.0: 0 is not a whole number >= 1 (a GPU the pod holds no share of is left out)",
        ),
        ("ratio: 0\ngpus: [{}]\n", "bad.yaml:1: ratio: 0 is not a ratio; valid: 1 to 1024"),
        ("gpus: [{}]\npods:\n  - name: a\n    period_s: 10\n", "period_s and active_s go together"),
        ("gpus: [{\n", "bad.yaml:2: not valid YAML or JSON"),
        (
            "gpus: [{}]\nfaults:\n  - {call: device, code: GPU_ON_FIRE}\n",
            "bad.yaml:3: faults[0].code: 'GPU_ON_FIRE' is not an NVML error; valid: UNINITIALIZED, INVALID_ARGUMENT",
        ),
        ("- 1\n", "bad.yaml:1: scenario: [1] is not a mapping"),
        (
            "gpus:\n  - mig: [{profile: 1g.10gb, memory: 10GiB}]\npods:\n  - name: a\n    processes: [{gpu: 0}]\n",
            "bad.yaml:5: pods[0].processes[0]: GPU 0 is in MIG mode: say which MIG device (mig: 0 to 0)",
        ),
        (
            "gpus: [{}]\npods:\n  - name: a\n    processes: [{gpu: 0, mig: 0}]\n",
            "pods[0].processes[0].mig: 0 is not a MIG device; valid: none: GPU 0 is not in MIG mode",
        ),
        (
            "gpus:\n  - mig:\n      - {profile: big, memory: 1GiB}\n",
            "bad.yaml:3: gpus[0].mig[0].profile: 'big' is not a MIG profile like 1g.18gb",
        ),
        ("gpus: [{}]\npods:\n  - name: a\n    shares: {0/2: 1}\n", "pods[0].shares.0/2: GPU 0 has no MIG device 2"),
        ("gpus: [{}]\ndevice_plugin: {kind: amd}\n", "bad.yaml:2: device_plugin.kind: 'amd'; valid: nvidia, gke"),
        ("gpus: [{}]\npods:\n  - name: a\n    phase: Done\n", "bad.yaml:4: pods[0].phase: 'Done'; valid: Pending"),
        (
            "gpus: [{}]\npods:\n  - name: a\n    annotations: {hami.io/vgpu-devices-allocated: 'GPU-1,NVIDIA,x,0:;'}\n",
            "bad.yaml:4: pods[0].annotations.hami.io/vgpu-devices-allocated: memory 'x' or cores '0'",
        ),
        ("gpus: [{}]\npods:\n  - name: a\n    claims: [{claim: c}]\n", "pods[0].claims[0].device: None: a DRA device"),
        (
            "gpus: [{}]\npods:\n  - name: a\n    bind_request: {portion: '0.5'}\n",
            "bad.yaml:4: pods[0].bind_request.groups: []: names of GPU groups, at least one for a Fraction",
        ),
        (
            "gpus: [{}]\npods:\n  - name: a\n    bind_request:\n      groups: [g]\n      portion: '1.5'\n",
            "bad.yaml:6: pods[0].bind_request.portion: '1.5' is no portion of a GPU (0-1]",
        ),
        (
            "gpus: [{}]\npods:\n  - name: a\n    bind_request: {type: Shared}\n",
            "bad.yaml:4: pods[0].bind_request.type: 'Shared'; valid: Fraction, Regular",
        ),
        (
            "gpus: [{}]\npods:\n  - name: a\n    labels: {app: 1}\n",
            "pods[0].labels: {'app': 1} is not a mapping of label",
        ),
        # Inputs that once crashed or hung the loader.
        (
            "gpus:\n  - memory: " + "9" * 300 + "GiB\n",
            "bad.yaml:2: gpus[0].memory: '99999999999999999999...(303 characters)' is too large",
        ),
        (
            "gpus:\n  - memory: " + "9" * 400 + "\n",
            "gpus[0].memory: '99999999999999999999...(400 characters)' is too large",
        ),
        (
            # PyYAML raised a bare ValueError past Python's 4,300 digits, with no file or line.
            "gpus:\n  - memory: 1GiB\n    replicas: " + "9" * 100_000 + "\n",
            "bad.yaml:3: '99999999999999999999...(100000 characters)' is too large: a number has at most 4300 digits",
        ),
        ("[" * 100_000, "bad.yaml: nested too deep to be a scenario"),
        (
            # A billion laughs: 521 bytes that would expand to 10^9 values.
            "a: &a [x,x,x,x,x,x,x,x,x,x]\n"
            + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)),
            "bad.yaml: expands to over 1000000 values through its aliases",
        ),
        ("gpus: [{}]\ngpus: [{}]\n", "bad.yaml:2: not valid YAML or JSON ('gpus' appears twice (first on line 1))"),
        (
            "gpus: [{}]\npods:\n  - {name: a, uid: 2c9f8a79-5391-454b-88cb-86190881cb96}\n"
            "  - {name: b, uid: 2c9f8a79-5391-454b-88cb-86190881cb96}\n",
            "pods[1].uid: '2c9f8a79-5391-454b-88cb-86190881cb96' is also pods[0]'s",
        ),
        (
            "gpus: [{}]\nfaults:\n  - {call: device, delay_s: 1.0e+300}\n",
            "faults[0].delay_s: 1e+300 must be from 0 to 60 s",
        ),
        (
            # Accepted, it grew the agent to 1.67 GB in 20 s without a word.
            "gpus: [{}]\nchurn: {pods: 10, lifetime_s: 1,\n        live: 1000000, processes: 100}\n",
            "bad.yaml:3: churn.live: 1000000 pods of 100 processes each are 100000000 processes at once; "
            "valid: live x processes up to 10000",
        ),
        (
            "gpus: [{}]\nchurn: {pods: 10, live: 101, lifetime_s: 1, processes: 100}\n",
            "bad.yaml:2: churn.live: 101 pods of 100 processes each are 10100 processes at once",
        ),
    ],
)
def test_errors_name_file_line_field_and_what_is_valid(text: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, "bad.yaml")
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_churn_of_the_most_processes_at_once_is_accepted() -> None:
    churn = parse_scenario("gpus: [{}]\nchurn: {pods: 10, live: 100, lifetime_s: 1, processes: 100}\n", "s.yaml").churn
    assert churn is not None and churn.live * churn.processes == 10_000


def test_missing_file() -> None:
    with pytest.raises(ScenarioError, match=r"no-such\.yaml: no such scenario file"):
        load_scenario("no-such.yaml")


def test_aliases_that_yaml_dump_writes_for_shared_objects_are_fine() -> None:
    layout = {"version": 2, "driver": "systemd"}
    text = yaml.safe_dump({"gpus": [{}], "pods": [{"name": f"p{i}", "cgroup": layout} for i in range(3)]})
    assert "&id" in text and "*id" in text  # anchors and aliases, as yaml.dump writes them
    assert [pod.cgroup.driver for pod in parse_scenario(text, "dumped.yaml").pods] == ["systemd"] * 3


def test_libyaml_parses_only_where_it_bounds_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    """libyaml before 0.2.6 has no bound on nesting and would recurse on the C stack through a
    deep document: the pure-Python parser, whose recursion ends in a clear error, serves then."""
    binding = importlib.import_module("yaml._yaml")  # PyYAML's wheels carry libyaml
    monkeypatch.setattr(binding, "get_version", lambda: (0, 2, 5))
    assert located._safe_loader() is yaml.SafeLoader
    monkeypatch.setattr(binding, "get_version", lambda: (0, 2, 6))
    assert located._safe_loader() is getattr(yaml, "CSafeLoader")  # noqa: B009 - typed apart from SafeLoader


@pytest.mark.parametrize("parser", ["libyaml", "pure-Python"])
def test_a_control_character_is_refused_naming_the_file(parser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Either parser's reader refuses it (the pure-Python one as the loader is made, before the
    parse): a located error, not a traceback."""
    if parser == "pure-Python":
        monkeypatch.setattr(importlib.import_module("yaml._yaml"), "get_version", lambda: (0, 2, 5))
        # The reader refuses the text before any mapping is built: the base loader stands in.
        monkeypatch.setattr(located, "LineLoader", located._safe_loader())
    with pytest.raises(ScenarioError, match=r"^bad\.yaml(:\d+)?: not valid YAML or JSON \(unacceptable character"):
        parse_scenario('gpus: [{}]\nnode: "a\x01b"\n', "bad.yaml")
