"""gpu_allocation.txt: the seed format, and a clear error for every bad file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from otel_vgpu.allocation.ratio import MAX_FILE_BYTES, SETTLE_S, RatioFileError, RatioSource, parse_ratio, read_ratio

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "ratio"),
    [
        ("2", 2.0),
        ("2\n", 2.0),
        ("  4  \n", 4.0),
        ("# vGPUs per GPU\n\n3\n", 3.0),
        ("3 # inline comment\n", 3.0),
        ("2.0\n", 2.0),
        ("1", 1.0),
        ("\n# a\n 8 \n# b\n", 8.0),
    ],
)
def test_valid(text: str, ratio: float) -> None:
    assert parse_ratio(text) == ratio


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("", None, "no value"),
        ("# only a comment\n\n", None, "no value"),
        ("two\n", 1, "'two' is not a number"),
        ("# c\n0\n", 2, "'0' is below 1"),
        ("-2", 1, "'-2' is not a number"),
        ("0.5", 1, "'0.5' is not a whole number"),
        ("nan", 1, "'nan' is not a number"),
        ("inf", 1, "'inf' is not a number"),
        ("2\n3\n", 2, "second value '3'"),
        ("2 3", 1, "'2 3' is not a number"),
    ],
)
def test_invalid_names_file_line_value_and_what_is_valid(text: str, line: int | None, fragment: str) -> None:
    with pytest.raises(RatioFileError) as caught:
        parse_ratio(text, "cfg/gpu_allocation.txt")
    message = str(caught.value)
    prefix = "cfg/gpu_allocation.txt" + (f":{line}:" if line else ":")
    assert message.startswith(prefix)
    assert fragment in message
    assert "expected one whole number from 1 to 1024" in message
    assert "\n" not in message


def test_missing_directory_huge_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(RatioFileError, match="no such file"):
        read_ratio(tmp_path / "absent.txt")
    with pytest.raises(RatioFileError, match="is a directory"):
        read_ratio(tmp_path)
    huge = tmp_path / "huge.txt"
    huge.write_text("2\n" + "#" * MAX_FILE_BYTES)
    with pytest.raises(RatioFileError, match="larger than"):
        read_ratio(huge)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"# ok\n\xff\xfe2\n")
    with pytest.raises(RatioFileError, match=r"binary.txt:2: not UTF-8"):
        read_ratio(binary)


def test_unreadable_path(tmp_path: Path) -> None:
    # Root reads any file whatever its mode, so the read error here comes
    # from a path through a regular file.
    (tmp_path / "file").write_text("2")
    with pytest.raises(RatioFileError, match=r"cannot be read \(Not a directory\)"):
        read_ratio(tmp_path / "file" / "gpu_allocation.txt")


def settled(path: Path) -> None:
    """The file as it is when its last change is older than SETTLE_S."""
    past = time.time() - SETTLE_S - 1
    os.utime(path, (past, past))


def test_a_file_written_in_place_is_not_reported_while_it_settles(tmp_path: Path) -> None:
    # `echo 4 > gpu_allocation.txt` truncates, then writes: a refresh between the two
    # sees an empty file. Within SETTLE_S of its change that is a write in progress.
    path = tmp_path / "gpu_allocation.txt"
    path.write_text("2\n")
    settled(path)
    source = RatioSource(path)
    with path.open("w") as handle:  # truncated, the new value not written yet
        handle.flush()
        source.refresh()
        assert (source.ratio, source.error) == (2.0, None), "not a failure yet"
        handle.write("4\n")
    source.refresh()
    assert (source.ratio, source.error) == (4.0, None)
    # Left empty: reported once it has been so for SETTLE_S, and the last good ratio kept.
    path.write_text("")
    source.refresh()
    assert source.error is None
    settled(path)
    source.refresh()
    assert source.ratio == 4.0 and source.error is not None and "no value" in str(source.error)


def test_reload_keeps_last_good_ratio_and_recovers(tmp_path: Path) -> None:
    path = tmp_path / "gpu_allocation.txt"
    path.write_text("2\n")
    source = RatioSource(path)
    assert source.ratio == 2.0
    source.refresh()
    assert source.error is None

    path.write_text("4\n")
    source.refresh()
    assert (source.ratio, source.error) == (4.0, None)

    path.write_text("zero\n")
    settled(path)
    source.refresh()
    assert source.ratio == 4.0
    assert source.error is not None and "'zero' is not a number" in str(source.error)

    path.unlink()
    source.refresh()
    assert source.ratio == 4.0 and "no such file" in str(source.error)

    path.write_text("3\n")
    source.refresh()
    assert (source.ratio, source.error) == (3.0, None)


def test_configmap_symlink_swap_is_seen(tmp_path: Path) -> None:
    # Kubernetes mounts a ConfigMap as <dir>/key -> ..data/key, with
    # ..data -> ..<timestamp>; an update writes a new timestamped directory
    # and renames a new ..data link over the old one.
    def version(name: str, value: str) -> None:
        (tmp_path / name).mkdir()
        (tmp_path / name / "gpu_allocation.txt").write_text(value)

    version("..2026_11_29_10_00_00.1", "2\n")
    (tmp_path / "..data").symlink_to("..2026_11_29_10_00_00.1")
    (tmp_path / "gpu_allocation.txt").symlink_to("..data/gpu_allocation.txt")
    source = RatioSource(tmp_path / "gpu_allocation.txt")
    assert source.ratio == 2.0

    version("..2026_11_29_10_05_00.2", "4\n")
    (tmp_path / "..data_tmp").symlink_to("..2026_11_29_10_05_00.2")
    os.rename(tmp_path / "..data_tmp", tmp_path / "..data")
    source.refresh()
    assert source.ratio == 4.0


@pytest.mark.parametrize(
    "value",
    ["\uff13", "\u0663", "1_000", "+2", "1e308", "2e0", "nan", "inf", "0x10", "2.", ".5", "1025", "2 4", "2.5", "1.5"],
)
def test_only_plain_decimal_ratios_from_1_to_1024(value: str) -> None:
    with pytest.raises(RatioFileError) as caught:
        parse_ratio(f"{value}\n", "gpu_allocation.txt")
    assert caught.value.args[0].startswith("gpu_allocation.txt:1:")
    assert "whole number from 1 to 1024 in ASCII digits" in str(caught.value)


def test_the_largest_ratio_is_accepted() -> None:
    assert parse_ratio("1024\n") == 1024.0


def test_a_fraction_is_named_as_such() -> None:
    with pytest.raises(RatioFileError) as caught:
        parse_ratio("# vGPUs\n2.5\n", "/etc/otel-vgpu/gpu_allocation.txt")
    assert str(caught.value).startswith("/etc/otel-vgpu/gpu_allocation.txt:2: '2.5' is not a whole number;")


def test_a_fifo_in_place_of_the_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "gpu_allocation.txt"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(RatioFileError, match="not a regular file"):
        read_ratio(fifo)
    assert time.monotonic() - started < 5  # no writer ever comes: a blocking open would never return
