"""Messages that point at the fix, and probes that mean what they say."""

from __future__ import annotations

import time
from pathlib import Path

from otel_vgpu.wording import counted, host_in_url
from testkit.agent import agent_in_process, clean_env, get, wait_until


def scenario(tmp_path: Path, text: str) -> str:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return str(path)


def test_counts_and_ipv6_addresses_are_written_right() -> None:
    assert (counted(1, "GPU"), counted(2, "GPU"), counted(0, "pod")) == ("1 GPU", "2 GPUs", "0 pods")
    assert (host_in_url("::1"), host_in_url("[::1]"), host_in_url("10.0.0.1")) == ("[::1]", "[::1]", "10.0.0.1")


def test_the_start_lines_name_the_address_and_count_right(tmp_path: Path, ratio_file: Path) -> None:
    node = scenario(tmp_path, "gpus: [{memory: 80GiB}]\n")
    with agent_in_process("--simulate", node, "--allocation-file", str(ratio_file), env=clean_env()) as agent:
        log = agent.logged()
    # The harness listens on 127.0.0.1; an IPv6 address goes through host_in_url the same way.
    assert "serving http://127.0.0.1:" in log
    assert "simulated GPU node" in log and "1 GPU, 0 pods;" in log


def test_ready_means_at_least_one_gpu_is_reported(tmp_path: Path, ratio_file: Path) -> None:
    node = scenario(
        tmp_path,
        "gpus: [{memory: 80GiB}]\nfaults: [{call: device, gpu: 0, code: GPU_IS_LOST}]\n",
    )
    with agent_in_process("--simulate", node, "--allocation-file", str(ratio_file), env=clean_env()) as agent:
        status, body, _ = get(f"{agent.url}/readyz")
    assert status == 503
    assert body.decode().startswith("not ready: no GPU reported: GPU 0: ")
    assert "GPU_IS_LOST" in body.decode() or "GPU is lost" in body.decode()


def test_ready_names_its_gpus(tmp_path: Path, ratio_file: Path) -> None:
    node = scenario(tmp_path, "gpus: [{memory: 80GiB}]\n")
    with agent_in_process("--simulate", node, "--allocation-file", str(ratio_file), env=clean_env()) as agent:
        assert get(f"{agent.url}/readyz")[:2] == (200, b"ready: 1 GPU\n")


def test_a_gpu_that_could_not_report_utilization_is_asked_again(tmp_path: Path, ratio_file: Path) -> None:
    """NOT_SUPPORTED for a while: the SM families are left out, the GPU is asked again after
    `ask_again_s`, and "recovered" is said only once they are back."""
    node = scenario(
        tmp_path,
        """
gpus: [{memory: 80GiB}]
pods: [{name: busy, shares: {0: 1}, processes: [{gpu: 0, memory: 1GiB, sm: 0.5}]}]
faults: [{call: utilization_samples, gpu: 0, code: NOT_SUPPORTED, to_s: 4.0}]
""",
    )
    args = ("--simulate", node, "--allocation-file", str(ratio_file), "--min-interval", "0")
    # The fault lasts 4 s of the node's clock: long past the agent's start and first scrape
    # on a loaded machine, so that the first scrape falls inside it.
    with agent_in_process(*args, env=clean_env(), ask_again_s=0.5) as agent:
        first = agent.scrape()
        assert not first.series("vgpu_pod_sm_utilization_ratio")
        started = time.monotonic()
        seen: list[tuple[bool, bool]] = []

        def back() -> bool:
            # The scrape first: it serves a sweep that has ended, and a sweep that read the
            # pods' use again has said "recovered" before it ended.
            has_sm = bool(agent.scrape().series("vgpu_pod_sm_utilization_ratio"))
            recovered = "process_utilization recovered" in agent.logged()
            seen.append((has_sm, recovered))
            return has_sm

        wait_until(back, timeout=15, what="the SM families to come back")
        log = agent.logged()
    assert time.monotonic() - started >= 0.5  # the fault's window, then the next ask
    assert "cannot report per-process utilization; SM families omitted, asking again every 0.5 s" in log
    assert log.count("cannot report per-process utilization") == 1
    # No SM figure is served before the log says "recovered"; they follow it once the GPU's
    # first periods after it have settled (collect/aggregate.py, PodRow.settled).
    assert not any(has_sm and not recovered for has_sm, recovered in seen)
    assert "process_utilization recovered" in log


def test_a_gpu_asked_for_more_than_its_sms_is_said_once(tmp_path: Path, ratio_file: Path) -> None:
    node = scenario(
        tmp_path,
        """
gpus: [{memory: 80GiB}, {memory: 80GiB}]
pods:
  - {name: a, processes: [{gpu: 1, memory: 1GiB, sm: 0.9}]}
  - {name: b, processes: [{gpu: 1, memory: 1GiB, sm: {mean: 0.5, amplitude: 0.1}}]}
  - {name: c, processes: [{gpu: 0, memory: 1GiB, sm: 0.5}]}
""",
    )
    with agent_in_process("--simulate", node, "--allocation-file", str(ratio_file), env=clean_env()) as agent:
        agent.scrape()
        log = agent.logged()
    asked = [line for line in log.splitlines() if "ask for up to" in line]
    assert len(asked) == 1 and "simulated GPU 1: its processes ask for up to 1.50 of its SMs together" in asked[0]
