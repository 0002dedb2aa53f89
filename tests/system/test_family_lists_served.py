"""--metric-allowlist and --metric-denylist as the agent answers them: a bad pattern stops it
with one line, a denied family leaves the scrape and a pattern naming none is said once (the
lists' rules alone: tests/unit/export/test_family_lists.py)."""

from __future__ import annotations

from pathlib import Path

from testkit.agent import run_to_exit, running_agent, wait_for


def test_a_bad_pattern_stops_the_agent_with_one_line() -> None:
    result = run_to_exit(["--simulate", "--metric-allowlist", "vgpu_(pod"])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "otel-vgpu: error: argument --metric-allowlist: invalid pattern 'vgpu_(pod': missing ): vgpu_(pod; expected "
        "comma-separated RE2 regular expressions over family names, as Prometheus writes them (no lookarounds or "
        "backreferences), e.g. vgpu_pod_energy.* (see --help)"
    ]


def test_a_pattern_that_backtracks_in_python_re_starts_the_agent_at_once(scenario_file: Path, ratio_file: Path) -> None:
    # Python's re took 0.6 s to match this against a 22-character name, doubling with each
    # character: the start hung on the families' names (17-52 characters). RE2 never backtracks.
    args = ["--simulate", str(scenario_file), "--allocation-file", str(ratio_file)]
    backtracking = "(\\w|\\w)*!"
    with running_agent(*args, "--metric-denylist", f"{backtracking},vgpu_pod_energy.*") as agent:
        served = agent.scrape()
        code, log = agent.stop()
    assert code == 0
    assert served.series("vgpu_pod_memory_used_bytes") and not served.series("vgpu_pod_energy_joules_total")
    assert f"--metric-denylist pattern {backtracking!r} names no family" in log, log


def test_the_scrape_leaves_out_the_denied_families_and_a_pattern_naming_none_is_said_once(
    scenario_file: Path, ratio_file: Path
) -> None:
    args = ["--simulate", str(scenario_file), "--allocation-file", str(ratio_file)]
    with running_agent(*args, "--metric-denylist", "vgpu_pod_energy.*,vgpu_gpu_energy.*,vgpu_typo.*") as agent:
        served = agent.scrape()
        code, log = agent.stop()
    assert code == 0
    assert not {name for name in served.types if "energy" in name}
    assert served.series("vgpu_pod_memory_used_bytes") and served.series("vgpu_pod_sm_utilization_ratio")
    warned = [line for line in log.splitlines() if "names no family" in line]
    assert len(warned) == 1 and "--metric-denylist pattern 'vgpu_typo.*'" in warned[0], log


def test_a_semconv_name_turns_off_the_families_it_is_pushed_from(scenario_file: Path, ratio_file: Path) -> None:
    # hw.power is the GPU's power draw on the semconv push; on the scrape it is vgpu_gpu_power_watts.
    args = ["--simulate", str(scenario_file), "--allocation-file", str(ratio_file)]
    with running_agent(*args, "--metric-denylist", r"hw\.power") as agent:
        served = wait_for(agent, lambda exposition: bool(exposition.series("vgpu_gpu_temperature_celsius")))
        code, log = agent.stop()
    assert code == 0
    assert "vgpu_gpu_power_watts" not in served.types and "vgpu_gpu_power_limit_watts" in served.types
    assert "names no family" not in log, log
