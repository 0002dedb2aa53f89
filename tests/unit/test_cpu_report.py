"""testkit/cpu_report.py: the suite's CPU added up by test file, across workers' files."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.cpu_report import by_file

pytestmark = pytest.mark.unit


def test_each_file_s_tests_are_added_up_across_workers_the_dearest_first(tmp_path: Path) -> None:
    (tmp_path / "101.tsv").write_text("tests/a.py::one\t1.0\t2.0\t5.0\ntests/b.py::one\t0.5\t0.0\t0.6\n")
    (tmp_path / "102.tsv").write_text("tests/a.py::two[x]\t0.25\t0.25\t1.0\ntests/c.py::one\t4.0\t0.0\t4.0\n")
    assert by_file(tmp_path) == [
        ("tests/c.py", 4.0, 4.0, 1),
        ("tests/a.py", 3.5, 6.0, 2),
        ("tests/b.py", 0.5, 0.6, 1),
    ]
