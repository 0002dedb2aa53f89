"""A metrics processor that rotel runs in its own Python (`rotel-agent start
--otlp-with-metrics-processor testkit/rotel_dump.py`, rotel_sdk's API): each ResourceMetrics
it receives, written as one JSON line to the file `ROTEL_DUMP_FILE` names, decoded as OTLP
carries it (each point's value typed, int or double; a sum's monotonicity and temporality),
for testkit/rotel.py to read. Nothing of the repository is imported here: this runs inside
rotel, not in the tests."""

from __future__ import annotations

import json
import os
from typing import Any

DUMP_FILE = "ROTEL_DUMP_FILE"


def _value(any_value: Any) -> Any:
    return None if any_value is None else any_value.value


def _point(point: Any) -> dict[str, Any]:
    value = point.value
    return {
        "attributes": {kv.key: _value(kv.value) for kv in point.attributes},
        "value": None if value is None else value[0],
        # NumberDataPointValue_AsInt or NumberDataPointValue_AsDouble: OTLP's as_int or as_double.
        "integer": value is not None and type(value).__name__.endswith("AsInt"),
        "start_time_unix_nano": point.start_time_unix_nano,
        "time_unix_nano": point.time_unix_nano,
    }


def _metric(metric: Any) -> dict[str, Any]:
    data = metric.data
    # MetricData_Gauge, MetricData_Sum, MetricData_Histogram: the variant holds its data at [0].
    kind = type(data).__name__.removeprefix("MetricData_")
    inner = data[0]
    out: dict[str, Any] = {"name": metric.name, "unit": metric.unit, "description": metric.description, "kind": kind}
    if kind == "Sum":
        out["monotonic"] = inner.is_monotonic
        out["temporality"] = inner.aggregation_temporality.as_str_name()
    out["points"] = [_point(point) for point in inner.data_points] if kind in ("Gauge", "Sum") else []
    return out


def process_metrics(resource_metrics: Any) -> None:
    record = {
        "resource": {kv.key: _value(kv.value) for kv in resource_metrics.resource.attributes},
        "metrics": [_metric(metric) for scope in resource_metrics.scope_metrics for metric in scope.metrics],
    }
    # The whole line in one unbuffered write: a buffered text file wrote a record longer than
    # its buffer in pieces, and a test reading between them found half a record at the end.
    # A reader still leaves out a last line without its '\n' (testkit/rotel.py): the kernel
    # copies a large write into the file a page at a time.
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(os.environ[DUMP_FILE], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while line:
            line = line[os.write(fd, line) :]
    finally:
        os.close(fd)
