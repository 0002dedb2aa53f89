"""One flag of the agent's table (config.py's FLAGS), declared: its name, environment twin,
parser, default and help, and how its value is read from the environment.

Apart from the table itself, so that config.py holds the flags and `Config` and nothing else.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from otel_vgpu.flag_values import FALSE_WORDS, TRUE_WORDS


class Action(str, Enum):
    """How a flag takes its value on the command line."""

    STORE = "store"
    """`--flag VALUE`."""
    SWITCH = "switch"
    """`--flag`, on; in the environment true or false."""
    APPEND = "append"
    """`--flag VALUE`, repeatable; in the environment comma-separated."""
    OPTIONAL = "optional"
    """`--flag [VALUE]`: bare, `const`."""


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag: its name, environment twin, parser, default, the Config field it fills, and help.
    This table is the only place each of them is said (`Config`'s defaults come from it)."""

    name: str
    help: str
    env: str | None = None
    """The OTEL_VGPU_* twin; None where the SDK's standard OTEL_* variables serve instead (`sdk_env`)."""
    parse: Callable[[str], Any] = str
    """A value's text to its value (each item's, for APPEND); argparse.ArgumentTypeError for a bad one."""
    default: Any = None
    """The value when neither the flag nor its twin is given; None: unset."""
    action: Action = Action.STORE
    field: str | None = None
    """The Config field it fills; None: its name's (`--log-level`: `log_level`)."""
    choices: tuple[str, ...] | None = None
    const: str | None = None
    """OPTIONAL: the value of the bare flag."""
    fallback_env: str | None = None
    """A variable read when neither the flag nor its twin is given (the Downward API's NODE_NAME)."""
    metavar: str | None = None
    shown_default: str | None = None
    """The default as --help says it, where the value itself would mislead."""
    sdk_env: tuple[str, ...] = ()
    """The SDK's variables that stand for it, the winner first: read by the SDK or export/otlp.py, not here."""
    renamed_from: str | None = None
    """A former name of `env`, still read, with a warning (`RenamedVariable`)."""

    @property
    def dest(self) -> str:
        return self.field or self.name.removeprefix("--").replace("-", "_")

    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.action is Action.SWITCH:
            return "off"
        if self.default is None:
            return "unset"
        if isinstance(self.default, tuple):
            return ",".join(str(item) for item in self.default)
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    def variables(self) -> tuple[str, ...]:
        """The variables that stand for it, as --help and docs/flags.md name them."""
        return (self.env,) if self.env else self.sdk_env

    def help_text(self) -> str:
        named = ("the SDK's " if self.sdk_env else "") + " or ".join(self.variables())
        twin = f"{named}; " if named else ""
        shown = self.default_text()
        written = f"default {shown}" if shown not in ("off", "unset") else shown
        return f"{self.help} ({twin}{written})"

    def from_text(self, raw: str, variable: str | None = None) -> Any:
        """The value `variable` (its twin by default) spells; ConfigError names the variable."""
        variable = variable or self.env or self.fallback_env
        if self.action is Action.SWITCH:
            text = raw.strip().lower()
            if text not in TRUE_WORDS | FALSE_WORDS:
                raise ConfigError(f"{variable}={raw!r}: expected true or false")
            return text in TRUE_WORDS
        try:
            if self.action is Action.APPEND:
                return tuple(self.parse(item) for item in raw.split(",") if item.strip())
            return self.parse(raw)
        except argparse.ArgumentTypeError as error:
            raise ConfigError(f"{variable}: {error}") from None


class ConfigError(ValueError):
    """A flag or environment value that cannot be used; the message is one line."""
