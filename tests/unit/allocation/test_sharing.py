"""Every way of sharing a GPU, end to end: the agent on a simulated node per
setup (tests/data/sharing/), scraped. The simulated node answers as the
kubelet and NVML do for that setup; the agent's own rules count it.

Expected figures are worked out by hand from each scenario file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from testkit.agent import ROOT, agent_in_process, clean_env
from testkit.promtext import Exposition

from ...conftest import GIB, MIB

SCENARIOS = ROOT / "tests" / "data" / "sharing"


@contextmanager
def scraped(scenario: str | Path, ratio: str, tmp_path: Path, *extra: str) -> Iterator[tuple[Exposition, str]]:
    """The second scrape of the agent on a sharing scenario (a name in SCENARIOS, or a file), and its log."""
    ratio_file = tmp_path / "gpu_allocation.txt"
    ratio_file.write_text(ratio + "\n")
    args = ["--simulate", str(SCENARIOS / scenario), "--allocation-file", str(ratio_file), "--sweep-interval", "0.2"]
    # Engine windows close at every sweep after the first: a scrape after two more has them.
    with agent_in_process(*args, "--no-kubernetes", *extra, env=clean_env(), engine_every_s=0.0) as agent:
        agent.scrape()
        agent.wait_sweeps(2)
        exposition = agent.scrape()  # what holds once the agent runs
        yield exposition, agent.logged()


@pytest.mark.parametrize("mode", ["exclusive_process", "default"])
def test_mps_leaves_pod_sm_out_and_credits_nobody_with_the_clients_work(tmp_path: Path, mode: str) -> None:
    # The device plugin sets EXCLUSIVE_PROCESS, where the one context beside the clients is the
    # server's; in the default mode (a daemon started by hand, as on the H200 of
    # bench/results/h200-mps.md) the server is the process so named in the GPU stack's namespace.
    scenario = tmp_path / "mps.yaml"
    scenario.write_text((SCENARIOS / "mps.yaml").read_text().replace("exclusive_process", mode))
    with scraped(scenario, "auto", tmp_path) as (exposition, log):
        pass
    sm = exposition.by("vgpu_pod_sm_utilization_ratio", "pod", "gpu_id")
    # No pod on the MPS GPU has an SM figure, the server's pod included; GPU 1 is unaffected.
    assert sm == {("alone", "1"): pytest.approx(0.5)}
    assert not [key for key in exposition.by("vgpu_pod_vgpu_utilization_ratio", "gpu_id") if key == ("0",)]
    assert exposition.by("vgpu_gpu_sm_utilization_ratio", "gpu_id")[("0",)] == pytest.approx(0.75)
    assert exposition.by("vgpu_gpu_mps_servers", "gpu_id") == {("0",): 1, ("1",): 0}
    # The video engines likewise: no pod on the MPS GPU has a figure; the GPU's own stay.
    assert set(exposition.by("vgpu_pod_decoder_utilization_ratio", "pod", "gpu_id")) == {("alone", "1")}
    assert set(exposition.by("vgpu_pod_decoder_busy_seconds_total", "pod", "gpu_id")) == {("alone", "1")}
    decoders = exposition.by("vgpu_gpu_decoder_utilization_ratio", "gpu_id")
    assert decoders == {("0",): pytest.approx(0.3), ("1",): pytest.approx(0.2)}  # a client decodes on GPU 0
    assert set(exposition.by("vgpu_gpu_memory_copy_utilization_ratio", "gpu_id")) == {("0",), ("1",)}
    memory = exposition.by("vgpu_pod_memory_used_bytes", "pod", "gpu_id")
    assert memory[("client-busy-a", "0")] == 10 * GIB
    assert memory[("client-idle", "0")] == 2 * GIB
    assert memory[("nvidia-device-plugin-mps-control-daemon-x7k2p", "0")] == 300 * MIB
    # auto: 3 replicas of GPU 0 (the device plugin's MPS limit is memory / replicas), 1 of GPU 1.
    assert exposition.by("vgpu_gpu_vgpus", "gpu_id") == {("0",): 3, ("1",): 1}
    assert exposition.by("vgpu_pod_memory_allocated_bytes", "pod")[("client-busy-a",)] == pytest.approx(
        140 * GIB / 3, abs=1
    )
    assert exposition.by("vgpu_agent_collection_errors_total", "stage")[("ratio",)] == 0
    assert "Traceback" not in log
    said = [line for line in log.splitlines() if "runs MPS" in line]
    assert len(said) == 1 and "GPU 0" in said[0], log


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_mig_devices_are_their_own_allocation_with_no_sm(strategy: str, tmp_path: Path) -> None:
    with scraped(f"mig-{strategy}.yaml", "auto", tmp_path) as (exposition, _):
        pass
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id", "mig_profile", "mig_uuid")
    mig = "MIG-0a1b2c3d-0000-4000-8000-0000000c000"
    assert allocated == {
        ("trainer", "0", "3g.40gb", f"{mig}1"): 40 * GIB,  # the MIG device's own memory
        ("small-a", "0", "1g.10gb", f"{mig}2"): 5 * GIB,  # a MIG device time-sliced in 2
        ("small-b", "0", "1g.10gb", f"{mig}2"): 5 * GIB,
        ("idle-mig", "0", "1g.10gb", f"{mig}3"): 10 * GIB,  # idle allocation of a MIG device
        ("whole", "1", "", ""): 80 * GIB,  # a whole GPU: no MIG labels
    }
    used = exposition.by("vgpu_pod_memory_used_bytes", "pod", "mig_uuid")
    assert (used[("small-a", f"{mig}2")], used[("idle-mig", f"{mig}3")]) == (3 * GIB, 0)
    # NVML has no per-process SM under MIG, nor device utilization for a GPU in MIG mode.
    assert exposition.by("vgpu_pod_sm_utilization_ratio", "pod") == {("whole",): pytest.approx(0.3)}
    assert set(exposition.by("vgpu_gpu_sm_utilization_ratio", "gpu_id")) == {("1",)}
    # Nor any engine figure, the pods' or the GPU's, on a GPU in MIG mode.
    for engine in ("memory_copy", "decoder", "jpeg"):
        assert set(exposition.by(f"vgpu_gpu_{engine}_utilization_ratio", "gpu_id")) == {("1",)}, engine
    assert set(exposition.by("vgpu_pod_decoder_utilization_ratio", "pod")) == {("whole",)}
    assert exposition.by("vgpu_gpu_memory_total_bytes", "gpu_id")[("0",)] == 80 * GIB


def test_hami_allocation_is_its_annotation(tmp_path: Path) -> None:
    with scraped("hami.yaml", "auto", tmp_path) as (exposition, _):
        pass
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod")
    assert allocated == {("infer-small",): 12000 * MIB, ("infer-unlimited",): 8000 * MIB}
    vgpu = exposition.by("vgpu_pod_vgpu_utilization_ratio", "pod")
    # SM, to NVML's whole percent, against its 30 % core limit; with no limit, the whole GPU.
    assert vgpu[("infer-small",)] == pytest.approx(0.15 / 0.30, abs=0.01 / 0.30)
    assert vgpu[("infer-unlimited",)] == pytest.approx(0.2, abs=0.01)


def test_kai_fractions_are_what_its_bind_requests_grant_on_the_reserved_gpu(tmp_path: Path) -> None:
    with scraped("kai.yaml", "auto", tmp_path) as (exposition, log):
        pass
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "namespace", "pod", "gpu_id")
    # Half, a quarter and 0.20 (16000 MiB of 81900) of GPU 0's 80 GiB, in two namespaces; GPU 1 whole;
    # the reservation pod holds none of its own; the pod that wrote gpu-fraction "1" itself, nothing.
    assert allocated == {
        ("team-a", "notebook-a", "0"): 40 * GIB,
        ("team-b", "infer-b", "0"): 20 * GIB,
        ("team-b", "embed-c", "0"): int(0.2 * 80 * GIB),
        ("team-c", "trainer-d", "1"): 80 * GIB,
        ("team-c", "forged-e", "0"): 0,
    }
    # No compute share from KAI: no vGPU utilization for a fraction, the GPU's SMs for the whole one.
    assert exposition.by("vgpu_pod_vgpu_utilization_ratio", "pod") == {("trainer-d",): pytest.approx(0.6, abs=0.01)}
    refusals = exposition.by("vgpu_agent_refusals_total", "reason")
    assert (refusals[("kai_fraction",)], refusals[("kai_reservation",)]) == (1, 1)
    assert "pod team-c/forged-e carries KAI's gpu-fraction" in log


def test_dra_claims_map_minor_numbers_and_share_a_claim(tmp_path: Path) -> None:
    with scraped("dra.yaml", "auto", tmp_path) as (exposition, _):
        pass
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id")
    assert allocated == {
        ("trainer", "0"): 80 * GIB,  # gpu-4 is minor 4, NVML index 0
        ("shared-a", "1"): 40 * GIB,  # gpu-2, one claim used by two pods
        ("shared-b", "1"): 40 * GIB,
    }
    ratio = exposition.by("vgpu_pod_vgpu_utilization_ratio", "pod")[("shared-a",)]
    assert ratio == pytest.approx(0.2 / 0.5, abs=0.01 / 0.5)  # NVML's whole percents


def test_ended_pods_hold_no_share(tmp_path: Path) -> None:
    with scraped("ended.yaml", "auto", tmp_path) as (exposition, _):
        pass
    for family in ("vgpu_pod_memory_allocated_bytes", "vgpu_pod_memory_used_bytes", "vgpu_pod_processes"):
        assert {pod for (pod,) in exposition.by(family, "pod")} == {"job-running"}, family
    # The replica the finished Job still holds in the kubelet's answer counts once, for the running pod.
    assert exposition.by("vgpu_pod_memory_allocated_bytes", "pod")[("job-running",)] == 40 * GIB


def test_renamed_replicas_count_and_auto_gives_each_gpu_its_ratio(tmp_path: Path) -> None:
    with scraped("renamed.yaml", "auto", tmp_path) as (exposition, _):
        pass
    assert exposition.by("vgpu_gpu_vgpus", "gpu_id") == {("0",): 4, ("1",): 2}
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod")
    assert allocated == {("double",): 2 * 80 * GIB / 4, ("single",): 80 * GIB / 2}
    assert exposition.by("vgpu_pod_vgpu_utilization_ratio", "pod")[("double",)] == pytest.approx(0.25 * 4 / 2)


def test_a_number_that_disagrees_with_the_kubelet_is_logged_once_and_counted(tmp_path: Path) -> None:
    ratio_file = tmp_path / "gpu_allocation.txt"
    ratio_file.write_text("2\n")
    args = ["--simulate", str(SCENARIOS / "renamed.yaml"), "--allocation-file", str(ratio_file)]
    with agent_in_process(*args, "--sweep-interval", "0.2", "--no-kubernetes", env=clean_env()) as agent:
        agent.scrape()
        agent.wait_sweeps(2)
        exposition = agent.scrape()
        log = agent.logged()
    # The number stays in force; GPU 0 (4 replicas) disagrees, GPU 1 (2) agrees.
    assert exposition.by("vgpu_gpu_vgpus", "gpu_id") == {("0",): 2, ("1",): 2}
    assert exposition.by("vgpu_agent_collection_errors_total", "stage")[("ratio",)] >= 2
    mismatch = [line for line in log.splitlines() if "the kubelet advertises 4 replicas of GPU 0" in line]
    assert len(mismatch) == 1, log


def test_gke_names_are_minor_numbers_and_gpu_instances(tmp_path: Path) -> None:
    with scraped("gke.yaml", "auto", tmp_path) as (exposition, _):
        pass
    allocated = exposition.by("vgpu_pod_memory_allocated_bytes", "pod", "gpu_id", "mig_uuid")
    assert allocated == {
        ("shared-0", "0", ""): 8 * GIB,  # nvidia1/vgpu0: minor 1 is NVML index 0, 3 replicas
        ("whole-1", "1", ""): 24 * GIB,  # nvidia0: minor 0 is index 1
        ("mig-b", "2", "MIG-9a8b7c6d-0000-4000-8000-0000000c0a02"): 20 * GIB,  # nvidia2/gi1
    }
    assert exposition.by("vgpu_gpu_vgpus", "gpu_id") == {("0",): 3, ("1",): 1, ("2",): 1}
