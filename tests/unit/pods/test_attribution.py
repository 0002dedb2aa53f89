"""/proc reading and the (PID, start time) attribution cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_vgpu.pods.attribution import CLOCK_TICKS, Attributor, ProcReader, parse_start_time
from otel_vgpu.pods.cgroups import PodRef

pytestmark = pytest.mark.unit

UID_A = "11111111-2222-3333-4444-555555555555"
UID_B = "66666666-7777-8888-9999-000000000000"
CID = "c" * 64
S = 1_000_000


def write_proc(root: Path, pid: int, start: int, cgroup: str, comm: str = "python3") -> None:
    directory = root / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    fields = ["S", "1"] + ["0"] * 17 + [str(start)] + ["0"] * 30
    (directory / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (directory / "cgroup").write_text(cgroup)


def pod_cgroup(uid: str) -> str:
    return f"0::/kubepods/burstable/pod{uid}/{CID}\n"


def test_start_time_with_awkward_command_names() -> None:
    fields = " ".join(["S", "1"] + ["0"] * 17 + ["4242"] + ["0"] * 30)
    assert parse_start_time(f"7 (a) b (c)) {fields}") == 4242
    assert parse_start_time(f"7 (py thon) {fields}") == 4242


def test_attributes_and_caches(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, 100, pod_cgroup(UID_A))
    write_proc(tmp_path, 11, 100, "0::/system.slice/sshd.service\n")
    attributor = Attributor(ProcReader(tmp_path))
    result = attributor.attribute([10, 11, 10])
    assert result.pods == {10: PodRef(UID_A, CID), 11: None}
    assert result.errors == []

    # A cached process is not reread: changing its cgroup file (which a
    # real process cannot do) shows the cache is used.
    (tmp_path / "10" / "cgroup").write_text(pod_cgroup(UID_B))
    assert attributor.attribute([10]).pods[10] == PodRef(UID_A, CID)


def test_reused_pid_is_attributed_again(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, 100, pod_cgroup(UID_A))
    attributor = Attributor(ProcReader(tmp_path))
    assert attributor.attribute([10]).pods[10] == PodRef(UID_A, CID)
    write_proc(tmp_path, 10, 200, pod_cgroup(UID_B))
    assert attributor.attribute([10]).pods[10] == PodRef(UID_B, CID)


def test_vanished_process_is_unattributed_not_an_error(tmp_path: Path) -> None:
    result = Attributor(ProcReader(tmp_path)).attribute([99])
    assert result.pods == {99: None}
    assert result.errors == []


def test_cache_holds_only_current_pids(tmp_path: Path) -> None:
    for pid in range(10, 20):
        write_proc(tmp_path, pid, 1, pod_cgroup(UID_A))
    attributor = Attributor(ProcReader(tmp_path))
    attributor.attribute(range(10, 20))
    assert attributor.cached == 10
    attributor.attribute([10])
    assert attributor.cached == 1


def test_unreadable_files_are_reported_and_unattributed(tmp_path: Path) -> None:
    # A directory where the file should be: reading it fails with EISDIR,
    # which root cannot bypass.
    (tmp_path / "10" / "stat").mkdir(parents=True)
    result = Attributor(ProcReader(tmp_path)).attribute([10])
    assert result.pods == {10: None}
    assert len(result.errors) == 1 and "10/stat" in result.errors[0]


def test_malformed_stat_is_reported(tmp_path: Path) -> None:
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "stat").write_text("10 (x) S 1\n")
    result = Attributor(ProcReader(tmp_path)).attribute([10])
    assert result.pods == {10: None} and "unexpected format" in result.errors[0]


@pytest.mark.parametrize("size", [300 * 1024, 5 * 1024 * 1024])
def test_huge_or_garbage_cgroup_file_is_read_safely(tmp_path: Path, size: int) -> None:
    junk = (b"\xff\xfe garbage \x00" * (size // 14 + 1))[:size]
    write_proc(tmp_path, 10, 1, "")
    (tmp_path / "10" / "cgroup").write_bytes(pod_cgroup(UID_A).encode() + junk)
    assert Attributor(ProcReader(tmp_path)).attribute([10]).pods[10] == PodRef(UID_A, CID)


def test_start_times_are_on_the_samples_clock_from_the_nodes_uptime(tmp_path: Path) -> None:
    # Up 1,000 s at 5,000 s on the samples' clock: booted at 4,000 s. A process started 250.5 s
    # after boot (25,050 ticks at 100 a second) started at 4,250.5 s.
    (tmp_path / "uptime").write_text("1000.00 3.00\n")
    write_proc(tmp_path, 10, 250 * CLOCK_TICKS + CLOCK_TICKS // 2, pod_cgroup(UID_A))
    attributor = Attributor(ProcReader(tmp_path))
    attributor.begin(5_000 * S)
    assert attributor.started_us([10, 11]) == {10: 4_250 * S + S // 2}  # 11 is gone: left out
    # Read again a little later, the boot time kept: the same start, to the microsecond.
    (tmp_path / "uptime").write_text("1000.01 3.00\n")
    attributor.begin(5_000 * S + 20_000)
    assert attributor.started_us([10]) == {10: 4_250 * S + S // 2}


def test_without_an_uptime_no_start_time_is_given(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, 100, pod_cgroup(UID_A))
    attributor = Attributor(ProcReader(tmp_path))
    attributor.begin(5_000 * S)
    assert attributor.started_us([10]) == {}


def test_a_process_seen_between_sweeps_is_named_with_its_pod_and_a_reused_pid_read_anew(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, 100, pod_cgroup(UID_A))
    attributor = Attributor(ProcReader(tmp_path))
    assert attributor.attribute([10]).pods == {10: PodRef(UID_A, CID)}
    assert attributor.look(10) == (100, None, PodRef(UID_A, CID))  # no boot time read yet
    write_proc(tmp_path, 10, 200, pod_cgroup(UID_B))  # 10 reused by pod B
    assert attributor.look(10) == (200, None, PodRef(UID_B, CID))
    assert attributor.look(11) is None  # gone
    # The sweep's pass is as it was: the cached process of start 100 is still its.
    assert attributor.cached == 1
