"""`python -m testkit.launch FLAGS...`: the agent's command line, as a process, with some of
`Config`'s timers and limits set from the environment.

`TESTKIT_CONFIG` holds JSON: `{"limits": {"stall_s": 0.5}, "credentials_check_s": 0.2}`.
The flags stay the user's; what no flag sets (the endpoint's bounds, the backoffs) is
shortened here, so that a test waits out a bound of a second, not of thirty.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

from otel_vgpu.cli import main
from otel_vgpu.config import Backoff, Config
from otel_vgpu.limits import Limits

VARIABLE = "TESTKIT_CONFIG"


def overrides_json(limits: Limits | None = None, **timers: Any) -> str:
    """The value of TESTKIT_CONFIG for these limits and timers (Backoff values included)."""
    fields = {
        name: dataclasses.asdict(value) if isinstance(value, Backoff) else value for name, value in timers.items()
    }
    if limits is not None:
        fields["limits"] = dataclasses.asdict(limits)
    return json.dumps(fields)


def adjusted(config: Config, text: str) -> Config:
    fields: dict[str, Any] = json.loads(text)
    if "limits" in fields:
        fields["limits"] = Limits(**fields["limits"])
    for name, value in list(fields.items()):
        if isinstance(getattr(config, name), Backoff):
            fields[name] = Backoff(**value)
    return dataclasses.replace(config, **fields)


if __name__ == "__main__":
    text = os.environ.get(VARIABLE, "{}")
    sys.exit(main(sys.argv[1:], adjust=lambda config: adjusted(config, text)))
