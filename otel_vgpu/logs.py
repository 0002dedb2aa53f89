"""The agent's log lines, in the format `--log-format` names.

`text` is the line the agent has always written, for a person reading `kubectl logs`.
`json` (one object a line) and `logfmt` (`key=value` pairs) are for log pipelines (Loki,
Vector, Fluent Bit, Elasticsearch), which take such a line apart without a pattern written
for it: each carries the time (RFC 3339, UTC), the level, the logger, the message, every
field a call gave with `extra=`, and the exception's traceback, all on one line.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What every record has, whoever logs it (taskName: Python 3.12); any other attribute of a
# record came from `extra=` and is one of the line's fields.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


def rfc3339(created: float) -> str:
    """A record's time as RFC 3339 in UTC, to the millisecond: 2026-05-01T12:00:00.123Z."""
    moment = datetime.fromtimestamp(created, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _plain(value: Any) -> Any:
    """A field's value as JSON carries it: JSON's own scalars as they are, anything else (and a
    NaN or an infinity, which JSON has no word for) as its text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    return str(value)


def _put(fields: dict[str, Any], key: str, value: Any) -> None:
    """Add a field; one named like a field already there (`extra={"time": ...}`) is suffixed `_`."""
    while key in fields:
        key += "_"
    fields[key] = _plain(value)


def line_fields(record: logging.LogRecord, formatter: logging.Formatter, message_key: str) -> dict[str, Any]:
    """A record's fields, in the order a line gives them: time, level, logger, the message
    (under `message_key`), the `extra=` fields, then the exception and the stack if any."""
    fields: dict[str, Any] = {
        "time": rfc3339(record.created),
        "level": record.levelname.lower(),
        "logger": record.name,
        message_key: record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
            _put(fields, key, value)
    if record.exc_info and not record.exc_text:
        # As logging.Formatter.format does: the text is kept on the record for other handlers.
        record.exc_text = formatter.formatException(record.exc_info)
    if record.exc_text:
        _put(fields, "exception", record.exc_text)
    if record.stack_info:
        _put(fields, "stack", formatter.formatStack(record.stack_info))
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object a line: {"time", "level", "logger", "message", fields..., "exception"}."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(line_fields(record, self, "message"), ensure_ascii=False)


# A logfmt value written bare: printable ASCII but space, '"', '=' and '\'; any other is quoted.
_BARE = re.compile(r"[!#-<>-\[\]-~]+")
_NOT_IN_KEY = re.compile(r"[^!#-<>-\[\]-~]")


def logfmt_value(value: Any) -> str:
    """A value as logfmt writes it: bare where it can be, else in double quotes with `\\"`,
    `\\\\`, `\\n`, `\\t` and `\\uXXXX` escapes (JSON's, which go-logfmt and Loki read back)."""
    text = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return text if _BARE.fullmatch(text) else json.dumps(text, ensure_ascii=False)


def logfmt_key(key: str) -> str:
    """A key as logfmt allows it: no space, '"', '=' or '\\' (each such character becomes _)."""
    return _NOT_IN_KEY.sub("_", key) or "_"


class LogfmtFormatter(logging.Formatter):
    """One logfmt line: time=... level=... logger=... msg="..." fields... exception="..."."""

    def format(self, record: logging.LogRecord) -> str:
        fields = line_fields(record, self, "msg")
        return " ".join(f"{logfmt_key(key)}={logfmt_value(value)}" for key, value in fields.items())


FORMATTERS: dict[str, Callable[[], logging.Formatter]] = {
    "text": lambda: logging.Formatter(TEXT_FORMAT),
    "json": JsonFormatter,
    "logfmt": LogfmtFormatter,
}
FORMATS = tuple(FORMATTERS)
"""The values of --log-format."""


def configure(level: str, log_format: str, stream: TextIO | None = None) -> None:
    """The root logger's one handler: records from `level` up, to `stream` (stderr), in `log_format`."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(FORMATTERS[log_format]())
    logging.basicConfig(level=level.upper(), handlers=[handler])


# How long a key's line goes unsaid after it was logged, while it lasts: a collector down for an
# hour writes 60 lines of one reason, not 1,800 (one a push).
LOG_EVERY_S = 60.0
# Keys remembered: keys that change at every line (a port in an error) are bounded.
MOST_KEYS = 64


@dataclass
class LogLimit:
    """When each key (a failure's reason, an error's kind) was last logged; `due` says whether to
    log it now: when new, then at most once every `every_s`. Thread-safe: threads may fail at once."""

    every_s: float = LOG_EVERY_S
    clock: Callable[[], float] = time.monotonic
    _logged: OrderedDict[str, float] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def due(self, key: str) -> bool:
        """Whether `key` is new, or was last logged `every_s` ago or more; if so, it is logged now."""
        now = self.clock()
        with self._lock:
            last = self._logged.get(key)
            if last is not None and now - last < self.every_s:
                return False
            self._logged[key] = now
            self._logged.move_to_end(key)
            while len(self._logged) > MOST_KEYS:
                self._logged.popitem(last=False)
        return True
