"""--metric-allowlist and --metric-denylist: which families they keep, what sweeps then read,
and how a bad pattern is answered (the agent's answer: tests/test_family_lists_served.py;
the push's side: tests/test_otlp.py)."""

from __future__ import annotations

import re

import pytest

from otel_vgpu.collect.reading import GpuReader, Read, SweepErrors
from otel_vgpu.config import ConfigError, parse_config
from otel_vgpu.export.families import FAMILIES, reads_of, selected
from testkit.agent import ROOT
from testkit.fake_gpu import FakeBackend, asked

pytestmark = pytest.mark.unit

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


def coming_release_steps(upgrading: str) -> str:
    """The steps of docs/upgrading.md for the release not yet shipped: its `## From ...
    (unreleased)` section, or nothing while no change awaits a release. A shipped release's
    steps are frozen as it shipped them, so no test holds them to today's families."""
    sections = re.split(r"(?m)^(?=## )", upgrading)
    coming = [s for s in sections if s.startswith("## From ") and "(unreleased)" in s.splitlines()[0]]
    if len(coming) > 1:
        raise ValueError("two sections of unreleased steps: one release comes next")
    return coming[0] if coming else ""


def test_only_the_coming_releases_steps_are_held_to_todays_families() -> None:
    upgrading = (
        "# Upgrading\n\n## From 0.2.0 (unreleased)\n\nnew\n\n### Chart\n\nmore\n\n## From 0.1.0 to 0.2.0\n\nold\n"
    )
    assert coming_release_steps(upgrading) == "## From 0.2.0 (unreleased)\n\nnew\n\n### Chart\n\nmore\n\n"
    assert coming_release_steps("# Upgrading\n\n## From 0.1.0 to 0.2.0\n\nold\n") == ""
    with pytest.raises(ValueError, match="one release comes next"):
        coming_release_steps("## From 0.2.0 (unreleased)\n\na\n## From 0.3.0 (unreleased)\n\nb\n")


# The denylist the coming release's steps give to keep a node's cardinality as it was before the
# health and GPM families, while they give one: a shipped release's stays as it shipped.
HEALTH_PATTERNS = re.findall(
    r"--metric-denylist '(vgpu_gpu_\(sm_clock[^']+)'",
    coming_release_steps((ROOT / "docs" / "upgrading.md").read_text()),
)


@pytest.mark.parametrize("pattern", HEALTH_PATTERNS)
def test_the_upgrade_steps_pattern_turns_off_exactly_the_health_and_gpm_families(pattern: str) -> None:
    kept, unmatched = selected(deny=pattern.split(","))
    dropped = {f.name for f in FAMILIES} - {f.name for f in kept}
    new = {f.name for f in FAMILIES if f.reads & {Read.HEALTH, Read.GPM, Read.XID_EVENTS}}
    assert unmatched == [] and dropped == new
