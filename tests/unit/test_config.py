"""The flag table: flags, environment twins and defaults into a Config, and
the flag table of docs/flags.md kept in step with it; the log lines the
format flag names."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from otel_vgpu.config import FLAG_KEY, FLAGS, Config, ConfigError, build_parser, parse_config
from otel_vgpu.flag_values import RenamedVariable
from otel_vgpu.logs import JsonFormatter, LogfmtFormatter
from testkit.agent import ROOT
from testkit.logfmt import parse_logfmt

pytestmark = pytest.mark.unit


def test_flag_wins_over_its_twin_which_wins_over_the_default() -> None:
    assert parse_config([], {}).port == Config().port == 8080
    assert parse_config([], {"OTEL_VGPU_PORT": "7070"}).port == 7070
    assert parse_config(["--port", "9090"], {"OTEL_VGPU_PORT": "7070"}).port == 9090


def test_switches_lists_paths_and_the_node_name_fallback() -> None:
    config = parse_config(
        ["--by-container"],
        {
            "OTEL_VGPU_SEED_METRICS": "yes",
            "OTEL_VGPU_GPU_RESOURCE": "nvidia.com/gpu, nvidia.com/gpu.shared",
            "OTEL_VGPU_KUBECONFIG": "/etc/kube/config",
            "NODE_NAME": "gpu-7",
        },
    )
    assert config.by_container and config.seed_metrics and not config.no_kubernetes
    assert config.gpu_resources == ("nvidia.com/gpu", "nvidia.com/gpu.shared")
    assert config.kubeconfig == Path("/etc/kube/config")
    assert config.node_name == "gpu-7"
    assert parse_config(["--node-name", "a"], {"NODE_NAME": "b"}).node_name == "a"
    assert parse_config(["--gpu-resource", "x", "--gpu-resource", "y"], {}).gpu_resources == ("x", "y")
    assert parse_config([], {"OTEL_VGPU_SIMULATE": "true"}).simulate == "builtin"
    assert parse_config([], {"OTEL_VGPU_SIMULATE": "false"}).simulate is None
    assert parse_config(["--simulate"], {}).simulate == "builtin"


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [
        ({"OTEL_VGPU_PORT": "http"}, "OTEL_VGPU_PORT: invalid port 'http': expected a whole number from 1 to 65535"),
        ({"OTEL_VGPU_BY_CONTAINER": "maybe"}, "OTEL_VGPU_BY_CONTAINER='maybe': expected true or false"),
        ({"OTEL_VGPU_MIN_INTERVAL": "-1"}, "expected a number from 0 to 3600"),
    ],
)
def test_a_bad_environment_value_names_the_variable_and_what_is_valid(environ: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        parse_config([], environ)


def test_a_number_past_its_ceiling_says_the_ceiling(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--otlp-interval", "100000"], {})
    assert "expected a number of seconds from 0.1 to 86400" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag,env,off",
    [
        ("--sweep-interval", "OTEL_VGPU_SWEEP_INTERVAL", "0 (sweep only when collected) or "),
        ("--watch-interval", "OTEL_VGPU_WATCH_INTERVAL", "0 (no watch) or "),
        ("--pod-resources-interval", "OTEL_VGPU_POD_RESOURCES_INTERVAL", ""),
        ("--otlp-interval", None, ""),
    ],
)
def test_every_interval_is_bounded_below_naming_the_range(
    capsys: pytest.CaptureFixture[str], flag: str, env: str | None, off: str
) -> None:
    # 1e-9 s between sweeps was accepted and burnt 96 % of a core.
    with pytest.raises(SystemExit) as stopped:
        parse_config([flag, "1e-9"], {})
    assert stopped.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and flag in said[0] and f"expected {off}a number of seconds from 0.1 to" in said[0]
    if env is not None:
        with pytest.raises(ConfigError, match=f"{env}: invalid interval '1e-9'"):
            parse_config([], {env: "1e-9"})
        assert getattr(parse_config([flag, "0.1"], {}), flag[2:].replace("-", "_")) == 0.1


def test_help_is_the_table() -> None:
    text = build_parser().format_help()
    for flag in FLAGS:
        assert flag.name in text, flag.name
        # Every flag has a variable, named in its help: its own, or the SDK's.
        assert flag.variables(), flag.name
        for variable in flag.variables():
            assert variable in text, variable
    # The OTLP flags' are the SDK's, and --help says so.
    flat = " ".join(text.split())
    assert "(the SDK's OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT; unset)" in flat
    assert "(the SDK's OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL; default grpc)" in flat
    assert "(the SDK's OTEL_METRIC_EXPORT_INTERVAL; default 60)" in flat
    # Each OTEL_VGPU_ variable is named after its flag: --gpu-resource's is singular, as the flag is.
    for flag in FLAGS:
        if flag.env:
            assert flag.env == "OTEL_VGPU_" + flag.name[2:].upper().replace("-", "_"), flag.name


def test_the_plural_resource_variable_still_works_and_asks_for_the_singular() -> None:
    old, new = "OTEL_VGPU_GPU_RESOURCES", "OTEL_VGPU_GPU_RESOURCE"
    config = parse_config([], {old: "nvidia.com/gpu,example.com/vgpu"})
    assert config.gpu_resources == ("nvidia.com/gpu", "example.com/vgpu")
    assert config.spelled("gpu_resources") == f"{old}=nvidia.com/gpu,example.com/vgpu"
    assert config.renamed == (RenamedVariable(old, new),)
    assert config.renamed[0].warning() == f"{old} is deprecated: rename it {new} (until then it is read as {new})"
    # The new name, or the flag, wins; the old one is then said to be ignored.
    both = parse_config([], {old: "a", new: "b"})
    assert both.gpu_resources == ("b",) and both.renamed == (RenamedVariable(old, new, new),)
    assert both.renamed[0].warning() == f"{old} is deprecated, and ignored as {new} is given: remove it"
    flagged = parse_config(["--gpu-resource", "c"], {old: "a"})
    assert flagged.gpu_resources == ("c",) and flagged.renamed == (RenamedVariable(old, new, "--gpu-resource"),)
    # A bad value names the variable it was read from.
    with pytest.raises(ConfigError, match=f"^{old}: nvidia.com/gpumem: a quantity"):
        parse_config([], {old: "nvidia.com/gpumem"})
    assert parse_config([], {new: "a"}).renamed == ()


@pytest.mark.parametrize(
    ("text", "level"),
    [("WARN", "warning"), ("Warning", "warning"), ("warn", "warning"), ("DEBUG", "debug"), (" Info ", "info")],
)
def test_the_log_level_is_taken_in_any_case_warn_included(text: str, level: str) -> None:
    assert parse_config(["--log-level", text], {}).log_level == level
    assert parse_config([], {"OTEL_VGPU_LOG_LEVEL": text}).log_level == level
    assert isinstance(logging.getLevelName(level.upper()), int)  # a level logging knows


def test_a_bad_log_level_or_format_names_the_flag_or_variable_and_what_is_valid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ConfigError, match=re.escape("OTEL_VGPU_LOG_LEVEL: invalid log level 'loud': expected one of")):
        parse_config([], {"OTEL_VGPU_LOG_LEVEL": "loud"})
    with pytest.raises(ConfigError) as error:
        parse_config([], {"OTEL_VGPU_LOG_FORMAT": "yaml"})
    assert str(error.value) == "OTEL_VGPU_LOG_FORMAT: invalid log format 'yaml': expected one of text, json, logfmt"
    with pytest.raises(SystemExit) as stopped:
        parse_config(["--log-format", "xml"], {})
    assert stopped.value.code == 2
    said = capsys.readouterr().err
    assert "argument --log-format: invalid log format 'xml': expected one of text, json, logfmt" in said
    assert parse_config([], {}).log_format == "text"
    assert parse_config([], {"OTEL_VGPU_LOG_FORMAT": "JSON"}).log_format == "json"
    assert parse_config(["--log-format", "logfmt"], {"OTEL_VGPU_LOG_FORMAT": "json"}).log_format == "logfmt"


def a_record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    """A warning of logger `otel_vgpu.test`, with the exception being handled, if any."""
    logger = logging.getLogger("otel_vgpu.test")
    return logger.makeRecord(logger.name, logging.WARNING, __file__, 1, message, args, sys.exc_info(), extra=extra)


RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def test_a_json_line_is_one_object_with_the_fields_and_the_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = a_record("export to %s failed", "http://c:4317", reason="HTTP 404 Not Found", attempts=3, time="x")
    line = JsonFormatter().format(record)
    assert "\n" not in line
    fields = json.loads(line)
    assert RFC3339_UTC.fullmatch(fields["time"]), fields["time"]
    assert abs(datetime.fromisoformat(fields["time"]).timestamp() - record.created) < 0.001
    assert fields["level"] == "warning" and fields["logger"] == "otel_vgpu.test"
    assert fields["message"] == "export to http://c:4317 failed"
    assert fields["reason"] == "HTTP 404 Not Found" and fields["attempts"] == 3
    assert fields["time_"] == "x"  # a field named like one of the line's own keeps its value, renamed
    assert fields["exception"].startswith("Traceback") and fields["exception"].endswith("ValueError: boom")
    assert list(fields)[:4] == ["time", "level", "logger", "message"]


def test_a_logfmt_line_reads_back_to_its_fields() -> None:
    message = 'a "quoted" word, key=value, a back\\slash, été\nand a second line'
    try:
        raise KeyError("gone")
    except KeyError:
        record = a_record("%s", message, endpoint="http://c:4317/v1", empty="", ok=True, none=None, ratio=0.5)
    line = LogfmtFormatter().format(record)
    assert "\n" not in line
    pairs = parse_logfmt(line)
    assert list(pairs)[:4] == ["time", "level", "logger", "msg"]
    assert RFC3339_UTC.fullmatch(pairs["time"]) and pairs["level"] == "warning" and pairs["logger"] == "otel_vgpu.test"
    assert pairs["msg"] == message
    assert pairs["endpoint"] == "http://c:4317/v1" and "endpoint=http://c:4317/v1 " in line  # bare where it can be
    assert pairs["empty"] == "" and pairs["ok"] == "true" and pairs["none"] == "" and pairs["ratio"] == "0.5"
    assert pairs["exception"].startswith("Traceback") and pairs["exception"].endswith("KeyError: 'gone'")
    assert time.time() - datetime.fromisoformat(pairs["time"]).timestamp() < 60


def doc_flag_rows() -> list[str]:
    section = (ROOT / "docs" / "flags.md").read_text().split("## Flags", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `--")]


def test_the_docs_flag_table_matches_the_flags() -> None:
    rows = doc_flag_rows()
    documented = {name for row in rows for name in re.findall(r"`(--[a-z-]+)", row.split("|")[1])}
    assert documented == {flag.name for flag in FLAGS} | {"--version"}
    for flag in FLAGS:
        row = next(r for r in rows if f"`{flag.name}" in r.split("|")[1])
        if flag.env:
            assert f"`{flag.env}`" in row, (flag.name, row)


def test_every_flag_fills_a_config_field_whose_default_is_the_flags() -> None:
    fields = Config.__dataclass_fields__
    for flag in FLAGS:
        assert flag.dest in fields, flag.name
        assert fields[flag.dest].default == flag.default, flag.name
    # Each field a flag fills takes its default from the table (its metadata names the flag),
    # and each field so fed is its own flag's: a default written again in Config, a field
    # without its flag or a flag without its field fails here. The others are timers.
    fed = {item.name: item.metadata[FLAG_KEY] for item in dataclasses.fields(Config) if FLAG_KEY in item.metadata}
    assert fed == {flag.dest: flag.name for flag in FLAGS}
    # Nothing given: the defaults, and the help says each as the table does.
    assert parse_config([], {}) == Config()
    help_text = " ".join(build_parser().format_help().split())
    assert "1.2 times this plus 5 s" in help_text  # from Config's kube_watch_grace_s


def test_each_value_is_spelled_as_it_was_given_for_messages() -> None:
    # A message names what the operator wrote: the flag, else the variable, else the flag of the default.
    config = parse_config(
        ["--simulate", "/x.yaml", "--metric-allowlist", "a,b"],
        {"OTEL_VGPU_BASIC_AUTH_FILE": "/etc/users", "OTEL_VGPU_SIMULATE": "/ignored.yaml", "NODE_NAME": "gpu-7"},
    )
    assert config.spelled("simulate") == "--simulate /x.yaml"
    assert config.spelled("basic_auth_file") == "OTEL_VGPU_BASIC_AUTH_FILE=/etc/users"
    assert config.spelled("node_name") == "NODE_NAME=gpu-7"
    assert config.spelled("allocation_file") == "--allocation-file gpu_allocation.txt"
    assert config.spelled("metric_allowlist") == "--metric-allowlist a,b"
    assert "allocation_file" not in config.given
    # Where the values came from is no part of what the agent runs with.
    assert config == parse_config(
        [
            "--basic-auth-file",
            "/etc/users",
            "--simulate",
            "/x.yaml",
            "--metric-allowlist",
            "a,b",
            "--node-name",
            "gpu-7",
        ],
        {},
    )
