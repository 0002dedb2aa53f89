"""A real OTLP receiver for the tests: rotel's agent (PyPI `rotel`), printing
what it receives to its debug log, and a reader of that log; or, where a test needs what the
log leaves out (an int from a double, a sum's monotonicity), writing each ResourceMetrics as
JSON through a metrics processor of rotel's (testkit/rotel_dump.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from testkit.agent import free_port
from testkit.rotel_dump import DUMP_FILE

_ATTRIBUTE = re.compile(r"^\s+-> (?P<key>[^:]+): (?P<type>\w+)\((?P<value>.*)\)$")
_FIELD = re.compile(r"^\s+-> (?P<key>\w+): (?P<value>.*)$")


@dataclass
class Point:
    attributes: dict[str, str]
    value: float | None = None


@dataclass
class Metric:
    name: str
    unit: str = ""
    description: str = ""
    data_type: str = ""
    points: list[Point] = field(default_factory=list)


@dataclass
class Batch:
    """One ResourceMetrics as received."""

    resource: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, Metric] = field(default_factory=dict)


def parse_debug_log(text: str) -> list[Batch]:
    batches: list[Batch] = []
    batch: Batch | None = None
    metric: Metric | None = None
    section = ""
    for line in text.splitlines():
        if line.startswith("ResourceMetrics #"):
            batch = Batch()
            batches.append(batch)
            metric, section = None, ""
        elif batch is None:
            continue
        elif line.startswith("Resource attributes:"):
            section = "resource"
        elif line.startswith("Descriptor:"):
            section = "descriptor"
        elif line.startswith("Data point attributes:"):
            section = "point"
            if metric is not None:
                metric.points.append(Point({}))
        elif line.startswith("Value: ") and metric is not None and metric.points:
            metric.points[-1].value = float(line.split(": ", 1)[1])
        elif line.startswith(
            ("ScopeMetrics", "Metric #", "NumberDataPoints", "HistogramDataPoints", "Start", "Timestamp")
        ):
            section = "" if not line.startswith("Metric #") else "descriptor"
        else:
            attribute = _ATTRIBUTE.match(line)
            if section == "resource" and attribute:
                batch.resource[attribute["key"]] = attribute["value"]
            elif section == "point" and attribute and metric is not None and metric.points:
                metric.points[-1].attributes[attribute["key"]] = attribute["value"]
            elif section == "descriptor":
                descriptor = _FIELD.match(line)
                if descriptor and descriptor["key"] == "Name":
                    metric = Metric(descriptor["value"])
                    batch.metrics[metric.name] = metric
                elif descriptor and metric is not None:
                    if descriptor["key"] == "Unit":
                        metric.unit = descriptor["value"]
                    elif descriptor["key"] == "Description":
                        metric.description = descriptor["value"]
                    elif descriptor["key"] == "DataType":
                        metric.data_type = descriptor["value"]
    return batches


@dataclass(frozen=True)
class Decoded:
    """One point as received, decoded from OTLP (testkit/rotel_dump.py)."""

    attributes: dict[str, str]
    value: float
    integer: bool
    """Sent as OTLP's as_int, not as_double."""
    start_time_unix_nano: int
    time_unix_nano: int


@dataclass(frozen=True)
class DecodedMetric:
    name: str
    unit: str
    description: str
    kind: str
    """Gauge, Sum or Histogram."""
    monotonic: bool | None
    """A sum's; None for another kind."""
    temporality: str | None
    points: list[Decoded]


@dataclass(frozen=True)
class DecodedResource:
    """One ResourceMetrics as received."""

    attributes: dict[str, str]
    metrics: list[DecodedMetric]


def _decoded(record: dict[str, Any]) -> DecodedResource:
    return DecodedResource(
        dict(record["resource"]),
        [
            DecodedMetric(
                m["name"],
                m["unit"],
                m["description"],
                m["kind"],
                m.get("monotonic"),
                m.get("temporality"),
                [Decoded(**point) for point in m["points"]],
            )
            for m in record["metrics"]
        ],
    )


@dataclass
class Receiver:
    grpc_url: str
    http_url: str
    log: Path
    dump: Path | None = None

    def batches(self) -> list[Batch]:
        return parse_debug_log(self.log.read_text(errors="replace"))

    def decoded(self) -> list[DecodedResource]:
        """Every ResourceMetrics received so far (with `dump` on), decoded."""
        assert self.dump is not None, "running_rotel(dump=True) writes what it receives"
        data = self.dump.read_bytes() if self.dump.exists() else b""
        # Whole lines only: rotel may be writing the last one (testkit/rotel_dump.py), read
        # once its '\n' is there.
        whole = data[: data.rfind(b"\n") + 1]
        return [_decoded(json.loads(line)) for line in whole.splitlines() if line.strip()]

    def wait_for_batches(self, count: int, timeout: float = 20) -> list[Batch]:
        deadline = time.monotonic() + timeout
        while True:
            batches = [b for b in self.batches() if b.metrics]
            if len(batches) >= count:
                return batches
            if time.monotonic() > deadline:
                raise AssertionError(f"rotel received {len(batches)} batches, wanted {count}")
            time.sleep(0.1)


def rotel_binary() -> Path:
    return Path(str(resources.files("rotel").joinpath("rotel-agent")))


@contextmanager
def running_rotel(tmp_path: Path, dump: bool = False) -> Iterator[Receiver]:
    """rotel on free ports, printing what it receives to its debug log; with `dump`, writing it
    as JSON through testkit/rotel_dump.py instead (`Receiver.decoded`)."""
    grpc_port, http_port = free_port(), free_port()
    log = tmp_path / "rotel.log"
    dumped = tmp_path / "rotel-received.jsonl" if dump else None
    shows = (
        ["--otlp-with-metrics-processor", str(Path(__file__).with_name("rotel_dump.py"))]
        if dump
        else ["--debug-log", "metrics", "--debug-log-verbosity", "detailed"]
    )
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(rotel_binary()),
                "start",
                "--otlp-grpc-endpoint",
                f"127.0.0.1:{grpc_port}",
                "--otlp-http-endpoint",
                f"127.0.0.1:{http_port}",
                "--exporter",
                "blackhole",
                *shows,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, DUMP_FILE: str(dumped)} if dumped else None,
        )
    try:
        deadline = time.monotonic() + 10
        while "Starting Rotel" not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("rotel did not start: " + log.read_text(errors="replace"))
            time.sleep(0.05)
        yield Receiver(f"http://127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}", log, dumped)
    finally:
        process.terminate()
        process.wait(timeout=10)
