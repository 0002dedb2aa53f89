"""A real OTLP receiver for the tests: rotel's agent (PyPI `rotel`), printing
what it receives to its debug log, and a reader of that log."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from testkit.agent import free_port

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


@dataclass
class Receiver:
    grpc_url: str
    http_url: str
    log: Path

    def batches(self) -> list[Batch]:
        return parse_debug_log(self.log.read_text(errors="replace"))

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
def running_rotel(tmp_path: Path) -> Iterator[Receiver]:
    grpc_port, http_port = free_port(), free_port()
    log = tmp_path / "rotel.log"
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
                "--debug-log",
                "metrics",
                "--debug-log-verbosity",
                "detailed",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 10
        while "Starting Rotel" not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("rotel did not start: " + log.read_text(errors="replace"))
            time.sleep(0.05)
        yield Receiver(f"http://127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}", log)
    finally:
        process.terminate()
        process.wait(timeout=10)
