"""A pytest plugin: in a run that has installed every tool the tests need (scripts/test.sh sets
`NO_SKIPS`), a skipped test fails the run, so that a tool it failed to install, or a test that
no longer runs there, is seen rather than counted as a pass. Elsewhere a test whose tool is
missing skips with the reason, and the run passes. tests/conftest.py registers it."""

from __future__ import annotations

import os

import pytest

NO_SKIPS = "TESTKIT_NO_SKIPS"


def _skipped(config: pytest.Config) -> list[pytest.TestReport]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return list(reporter.stats.get("skipped", ())) if reporter is not None else []


def _refused(config: pytest.Config) -> bool:
    # Under pytest-xdist the controller, which sees every worker's reports, decides.
    return os.environ.get(NO_SKIPS) == "1" and not hasattr(config, "workerinput")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _refused(session.config) and _skipped(session.config) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = _skipped(terminalreporter.config)
    if _refused(terminalreporter.config) and skipped:
        terminalreporter.write_line(
            f"{len(skipped)} skipped where {NO_SKIPS}=1 (scripts/test.sh installs every tool): "
            "the run fails; each reason is in the short test summary",
            red=True,
        )
