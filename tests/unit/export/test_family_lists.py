"""--metric-allowlist and --metric-denylist: which families they keep, what sweeps then read,
the denylist docs/metrics.md gives for the health and GPM families, and how a bad pattern is
answered (the agent's answer: tests/system/test_family_lists_served.py;
the push's side: tests/system/test_otlp.py)."""

from __future__ import annotations

import dataclasses

import pytest

from otel_vgpu.collect.reading import GpuReader, Read, SweepErrors
from otel_vgpu.config import ConfigError, parse_config
from otel_vgpu.export.families import FAMILIES, reads_of, selected
from otel_vgpu.export.figure_families import GPM_FAMILIES, HEALTH_FAMILIES
from otel_vgpu.gpu.device_figures import GPM_TABLE, HEALTH_TABLE
from otel_vgpu.patterns import compile_pattern
from testkit.fake_gpu import FakeBackend, asked
from testkit.scripts import load as load_script

pytestmark = pytest.mark.unit
FAMILY_LISTS = load_script("family_lists.py")

# The memory families, by bytes; and every family of an engine beside SM.
MEMORY_ONLY = "vgpu_(pod|gpu)_memory_.*_bytes"
ENGINE_FAMILIES = "vgpu_(pod|gpu)_(memory_copy|encoder|decoder|jpeg|optical_flow)_.*"


def names(families: object) -> set[str]:
    return {family.prometheus_name for family in families}  # type: ignore[attr-defined]


def test_a_denylist_drops_what_its_patterns_name_whole_and_nothing_else() -> None:
    kept, unmatched = selected(deny=["vgpu_pod_energy.*", r"vgpu\.gpu\.energy"])
    dropped = names(FAMILIES) - names(kept)
    assert dropped == {"vgpu_pod_energy_joules_total", "vgpu_gpu_energy_joules_total"}
    assert unmatched == []
    # Matched against the whole name: a prefix alone names nothing.
    assert selected(deny=["vgpu_pod"])[1] == ["vgpu_pod"]


def test_an_allowlist_keeps_only_what_it_names_and_says_which_patterns_name_nothing() -> None:
    kept, unmatched = selected(allow=["vgpu_gpu_.*", "nothing_at_all"])
    assert names(kept) and all(name.startswith("vgpu_gpu_") for name in names(kept))
    assert unmatched == ["nothing_at_all"]


def test_a_pattern_names_the_families_a_semconv_name_is_pushed_from() -> None:
    # hw.gpu.utilization is the GPU's utilization per task: its SMs' and its engines'.
    kept, unmatched = selected(deny=[r"hw\.gpu\.utilization"])
    dropped = names(FAMILIES) - names(kept)
    assert unmatched == []
    assert {"vgpu_gpu_sm_utilization_ratio", "vgpu_gpu_encoder_utilization_ratio"} <= dropped
    assert all(name.startswith("vgpu_gpu_") and name.endswith("_utilization_ratio") for name in dropped), dropped
    # The pods' share of a GPU is the agent's own name, not the hardware one.
    assert "vgpu_pod_sm_utilization_ratio" not in dropped
    # A convention's namespace keeps the GPU's hardware families and none of the pods'.
    hardware, _ = selected(allow=[r"hw\..*"])
    assert "vgpu_gpu_power_watts" in names(hardware) and "vgpu_gpu_temperature_celsius" in names(hardware)
    assert not any(name.startswith(("vgpu_pod_", "vgpu_agent_")) for name in names(hardware)), names(hardware)
    # The agent's own semconv names name theirs too.
    pods, unmatched = selected(allow=[r"vgpu\.pod\.gpu\.utilization"])
    assert "vgpu_pod_sm_utilization_ratio" in names(pods) and unmatched == []


def test_what_sweeps_read_follows_the_families_kept() -> None:
    assert reads_of(FAMILIES) == frozenset(Read)
    no_energy, _ = selected(deny=[".*energy.*"])
    assert Read.ENERGY not in reads_of(no_energy) and Read.PROCESS_USE in reads_of(no_energy)
    memory_only, _ = selected(allow=[MEMORY_ONLY])
    assert reads_of(memory_only) == frozenset()
    no_engines, _ = selected(deny=[ENGINE_FAMILIES])
    assert reads_of(no_engines) == frozenset(Read) - {Read.ENGINE_SAMPLES}


def test_a_family_turned_off_costs_no_nvml_call_it_alone_needed() -> None:
    backend, clock = FakeBackend(), [0.0]
    memory_only, _ = selected(allow=[MEMORY_ONLY])
    reader = GpuReader(backend, clock=lambda: clock[0], energy_every_s=0.0, reads=reads_of(memory_only))
    for _ in range(3):
        reading = reader.read(0, SweepErrors())
        assert reading is not None and reading.processes and reading.use_by_pid is None
    assert asked(backend, "energy") == asked(backend, "processes") == asked(backend, "gpu") == []


def test_patterns_come_from_the_flag_or_its_twin_and_a_bad_one_is_one_line() -> None:
    config = parse_config(["--metric-denylist", "a.*, b"], {})
    assert config.metric_denylist == ("a.*", "b")
    assert parse_config([], {"OTEL_VGPU_METRIC_ALLOWLIST": "x"}).metric_allowlist == ("x",)
    with pytest.raises(ConfigError, match=r"OTEL_VGPU_METRIC_DENYLIST: invalid pattern '\[': .*regular expressions"):
        parse_config([], {"OTEL_VGPU_METRIC_DENYLIST": "["})
    with pytest.raises(ConfigError, match="mutually exclusive"):
        parse_config(["--metric-allowlist", "a"], {"OTEL_VGPU_METRIC_DENYLIST": "b"})


def test_the_health_and_gpm_denylist_turns_off_exactly_the_families_of_those_reads() -> None:
    # The denylist docs/metrics.md gives and the bench uses, through the agent's own matching.
    kept, unmatched = selected(deny=list(FAMILY_LISTS.health_and_gpm_off()))
    assert unmatched == []
    off = {Read.HEALTH, Read.GPM, Read.XID_EVENTS}
    # Their reads spared, every other read still made, no other family turned off.
    assert reads_of(kept) == frozenset(Read) - off
    assert names(FAMILIES) - names(kept) == {f.prometheus_name for f in FAMILIES if f.reads & off}
    # Every family of the figures the tables declare is among them, per GPU and (GPM) per pod.
    figures = {f.name for f in (*HEALTH_FAMILIES.values(), *GPM_FAMILIES)}
    assert len(figures) > len(HEALTH_TABLE) + len(GPM_TABLE) and not figures & {f.name for f in kept}


def test_the_denylist_names_a_figure_added_to_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # The trial of a new health figure: its family is in the list without an edit of it.
    temperature = next(f for f in FAMILIES if f.name == "vgpu.gpu.temperature")
    added = dataclasses.replace(
        temperature, name="vgpu.gpu.fan.speed", unit="1", prometheus_name="vgpu_gpu_fan_speed_ratio"
    )
    monkeypatch.setattr(FAMILY_LISTS, "FAMILIES", (*FAMILIES, added))
    patterns = FAMILY_LISTS.health_and_gpm_off()
    assert any(compile_pattern(p).names("vgpu_gpu_fan_speed_ratio") for p in patterns)
    assert not any(compile_pattern(p).names("vgpu_gpu_energy_joules_total") for p in patterns)
