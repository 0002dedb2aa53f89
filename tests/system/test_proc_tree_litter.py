"""A simulated node leaves no litter: the proc tree of an agent killed with SIGKILL (which
cannot remove its own) is removed when the next simulated node starts, and no tree whose maker
still runs, nor anything that is not a tree of this user's, is touched."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from otel_vgpu.sim.proc_tree import MAKER_FILE, PROC_TREE_PREFIX, Maker, remove_left_behind, this_process
from testkit.agent import running_agent, swept_per_scrape, wait_until

SHM = Path("/dev/shm")


def trees_of(pid: int, before: set[Path]) -> list[Path]:
    """The proc trees the agent of `pid` made: named after it, and not there before it started
    (an earlier holder of its PID may have left one)."""
    return sorted(tree for tree in SHM.glob(f"{PROC_TREE_PREFIX}{pid}-*") if tree not in before)


def all_trees() -> set[Path]:
    return set(SHM.glob(f"{PROC_TREE_PREFIX}*"))


def test_a_killed_agents_tree_is_removed_by_the_next_and_a_running_ones_stays(
    scenario_file: Path, ratio_file: Path
) -> None:
    args = swept_per_scrape(scenario_file, ratio_file)
    before = all_trees()
    with running_agent(*args) as killed, running_agent(*args) as running:
        [killed_tree] = trees_of(killed.process.pid, before)
        [running_tree] = trees_of(running.process.pid, before)
        # SIGKILL leaves the tree behind (not checked here: any simulated node the session
        # starts meanwhile may remove it first).
        killed.process.kill()
        killed.process.communicate(timeout=10)
        with running_agent(*args) as third:
            wait_until(lambda: not killed_tree.exists(), what="the killed agent's tree removed")
            [third_tree] = trees_of(third.process.pid, before)
            assert third_tree.is_dir()
            # The one whose agent still runs, and was there when the third started, stays.
            assert running_tree.is_dir() and (running_tree / MAKER_FILE).is_file()
            assert running.scrape().series("vgpu_pod_memory_used_bytes")


def make_tree(parent: Path, pid: int, maker: Maker | None, random: str = "abcd_123") -> Path:
    tree = parent / f"{PROC_TREE_PREFIX}{pid}-{random}"
    tree.mkdir()
    (tree / "uptime").write_text("10000.00 0.00\n")
    if maker is not None:
        (tree / MAKER_FILE).write_text(maker.line())
    return tree


def a_gone_pid() -> int:
    """The PID of a process that has ended and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_only_trees_of_makers_gone_from_this_pid_namespace_are_removed(tmp_path: Path) -> None:
    me = this_process()
    assert me is not None, "the tests run with a /proc of their own PID namespace"
    gone = a_gone_pid()
    zombie = subprocess.Popen(["true"])
    wait_until(lambda: Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")
    zombie_started = int(Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("not the tree's\n")
    parent = tmp_path / "shm"
    parent.mkdir()
    try:
        stale = {
            "ended": make_tree(parent, gone, Maker(me.namespace, 1)),
            "its PID now another's": make_tree(parent, os.getpid(), Maker(me.namespace, me.started + 1), "reused__"),
            "a zombie": make_tree(parent, zombie.pid, Maker(me.namespace, zombie_started)),
        }
        # A link inside a stale tree is removed, not followed.
        (stale["ended"] / "link").symlink_to(outside, target_is_directory=True)
        kept = {
            "its maker runs": make_tree(parent, os.getpid(), me),
            "no maker file (being made)": make_tree(parent, gone, None, "nomaker_"),
            "of another PID namespace": make_tree(parent, gone, Maker("pid:[1]", 1), "othersns"),
            "not mkdtemp's name": make_tree(parent, gone, Maker(me.namespace, 1), "short"),
        }
        link = parent / f"{PROC_TREE_PREFIX}{gone}-symlink_"
        link.symlink_to(make_tree(tmp_path, gone, Maker(me.namespace, 1), "linkedto"), target_is_directory=True)
        kept["a link named like a tree"] = link
        plain = parent / f"{PROC_TREE_PREFIX}{gone}-justfile"
        plain.write_text("")
        kept["a file named like a tree"] = plain
        if os.geteuid() == 0:
            theirs = make_tree(parent, gone, Maker(me.namespace, 1), "theirs__")
            os.chown(theirs, 65534, 65534)
            kept["another user's"] = theirs

        removed = remove_left_behind(parent, me)
    finally:
        zombie.wait()
    assert sorted(removed) == sorted(stale.values())
    for what, path in kept.items():
        assert os.path.lexists(path), what
    assert (outside / "kept").is_file() and (link / MAKER_FILE).is_file()
