"""Scenario files as located values: YAML (or JSON) loaded with the line of every key, and
typed fields read from it whose errors name the file, the line, the field, the value and what
would be valid."""

from __future__ import annotations

import math
import re
import sys
from typing import Any

import yaml

from otel_vgpu.sim.scenario import ScenarioError, Wave

MAX_SCENARIO_NODES = 1_000_000
# Sizes above a pebibyte are mistakes, not scenarios.
MAX_SIZE_BYTES = 2**50
_SIZE = re.compile(r"^\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[KMGT]i?B?|B)?\s*$")
_UNITS = {"": 1, "B": 1}
for _i, _prefix in enumerate("KMGT", start=1):
    _UNITS[f"{_prefix}i"] = _UNITS[f"{_prefix}iB"] = 1024**_i
    _UNITS[_prefix] = _UNITS[f"{_prefix}B"] = 1000**_i


class LineDict(dict[Any, Any]):
    """A mapping that remembers the line of each key (and its own)."""

    line: int = 0
    key_lines: dict[str, int]


# libyaml's nesting bound (1,000 levels) came with 0.2.6: an older one recurses on the C stack
# through a deeply nested document, where the pure-Python parser raises RecursionError.
LIBYAML_BOUNDED = (0, 2, 6)


def _safe_loader() -> type[yaml.SafeLoader]:
    """libyaml's parser where PyYAML was built with one that bounds nesting (its wheels are): the
    same nodes, marks and errors' lines, in about a quarter of the pure-Python parser's time
    (every --simulate start parses one); the pure-Python parser otherwise."""
    loader = getattr(yaml, "CSafeLoader", None)
    binding = getattr(yaml, "_yaml", None)
    version = tuple(binding.get_version()) if binding is not None else ()
    return loader if loader is not None and version >= LIBYAML_BOUNDED else yaml.SafeLoader


_SAFE_LOADER = _safe_loader()


class LineLoader(_SAFE_LOADER):  # type: ignore[valid-type,misc]
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key, _ in node.value:
            if key.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key.value!r} appears twice (first on line {seen[key.value]})", key.start_mark
                )
            seen[key.value] = key.start_mark.line + 1
        mapping = LineDict(super().construct_mapping(node, deep=True))
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {str(key.value): key.start_mark.line + 1 for key, _ in node.value}
        return mapping


LineLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    LineLoader.construct_mapping,
)


def load_document(text: str, source: str) -> Any:
    """The document in `text`, its mappings `LineDict`s; `source` names it in errors."""
    try:
        # The pure-Python reader checks the characters here, libyaml's as it parses.
        loader = LineLoader(text)
    except yaml.YAMLError as error:
        raise _not_yaml(source, error) from None
    try:
        node = loader.get_single_node()
        # Anchors and aliases are fine (yaml.dump writes them for shared
        # objects), but not a "billion laughs": a few hundred bytes whose
        # aliases expand to more than any scenario holds.
        if node is not None and expanded_size(node, {}) > MAX_SCENARIO_NODES:
            raise ScenarioError(f"{source}: expands to over {MAX_SCENARIO_NODES} values through its aliases")
        if node is not None and (long := too_long_number(node, set())) is not None:
            raise ScenarioError(
                f"{source}:{long.start_mark.line + 1}: '{long.value[:20]}...({len(long.value)} characters)' is too "
                f"large: a number has at most {sys.get_int_max_str_digits()} digits"
            )
        document = loader.construct_document(node) if node is not None else None
    except RecursionError:
        raise ScenarioError(f"{source}: nested too deep to be a scenario") from None
    except yaml.YAMLError as error:
        raise _not_yaml(source, error) from None
    finally:
        loader.dispose()
    return document


def _not_yaml(source: str, error: yaml.YAMLError) -> ScenarioError:
    """The error a scenario file that YAML cannot read gets: its file, its line where the
    parser gives one, and the parser's problem."""
    if "maximum nesting depth" in str(getattr(error, "problem", "")):
        # libyaml's own bound on nesting, where the pure-Python parser recurses.
        return ScenarioError(f"{source}: nested too deep to be a scenario")
    mark = getattr(error, "problem_mark", None)
    where = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None) or str(error)
    return ScenarioError(f"{source}{where}: not valid YAML or JSON ({problem})")


def too_long_number(node: yaml.Node, seen: set[int]) -> yaml.ScalarNode | None:
    """The first whole number with more digits than Python converts (PyYAML raises a bare
    ValueError there, with no line), if any."""
    if id(node) in seen:
        return None
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        limit = sys.get_int_max_str_digits()
        return node if node.tag.endswith(":int") and limit and len(node.value) > limit else None
    children = node.value if isinstance(node, yaml.SequenceNode) else []
    if isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    for child in children:
        if (found := too_long_number(child, seen)) is not None:
            return found
    return None


def expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many values a node stands for once its aliases are expanded (capped just past the bound)."""
    seen = memo.get(id(node))
    if seen is not None:
        return seen
    size = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            size += expanded_size(child, memo)
            if size > MAX_SCENARIO_NODES:
                break
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            size += expanded_size(key, memo) + expanded_size(value, memo)
            if size > MAX_SCENARIO_NODES:
                break
    memo[id(node)] = size = min(size, MAX_SCENARIO_NODES + 1)
    return size


class Fields:
    """Typed fields of a loaded document, each error located."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, line: int, message: str) -> ScenarioError:
        location = f"{self.source}:{line}" if line else self.source
        return ScenarioError(f"{location}: {where}: {message}")

    def mapping(self, value: Any, where: str, line: int, allowed: set[str]) -> LineDict:
        if not isinstance(value, dict):
            raise self.fail(where, line, f"{value!r} is not a mapping")
        mapping = value if isinstance(value, LineDict) else LineDict(value)
        if not hasattr(mapping, "key_lines"):
            mapping.key_lines = {}
        for key in mapping:
            if key not in allowed:
                raise self.fail(
                    where, line_of(mapping, key), f"unknown field {key!r}; valid: {', '.join(sorted(allowed))}"
                )
        return mapping

    def sequence(self, value: Any, where: str, line: int) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(where, line, f"{value!r} is not a list")
        return value

    def whole(self, raw: Any, where: str, line: int, low: int) -> int:
        if not isinstance(raw, int) or isinstance(raw, bool) or raw < low:
            raise self.fail(where, line, f"{raw!r} is not a whole number >= {low}")
        return raw

    def size(self, raw: Any, where: str, line: int) -> int:
        valid = "valid: bytes, or a number with B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB), up to 1 PiB"
        if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
            value = float(raw) if raw <= MAX_SIZE_BYTES else math.inf
        else:
            match = _SIZE.match(raw) if isinstance(raw, str) else None
            if match is None:
                raise self.fail(where, line, f"{raw!r} is not a size; {valid}")
            value = float(match.group("number")) * _UNITS[match.group("unit") or ""]
        if not value <= MAX_SIZE_BYTES:  # inf and nan too
            shown = raw if len(str(raw)) < 40 else f"{str(raw)[:20]}...({len(str(raw))} characters)"
            raise self.fail(where, line, f"{shown!r} is too large; {valid}")
        return int(value)

    def number(self, raw: Any, where: str, line: int) -> float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            raise self.fail(where, line, f"{raw!r} is not a number")
        return float(raw)

    def number_or_none(self, raw: Any, where: str, line: int) -> float | None:
        if raw is None:
            return None
        number = self.number(raw, where, line)
        if number <= 0:
            raise self.fail(where, line, f"{raw!r} must be above 0")
        return number

    def boolean(self, raw: Any, where: str, line: int) -> bool:
        if not isinstance(raw, bool):
            raise self.fail(where, line, f"{raw!r} is not true or false")
        return raw

    def wave(self, raw: Any, where: str, line: int, size: bool) -> Wave:
        def value(v: Any, at: str) -> float:
            if size:
                return float(self.size(v, at, line))
            number = self.number(v, at, line)
            if not 0.0 <= number <= 1.0:
                raise self.fail(at, line, f"{v!r} is not a fraction between 0 and 1")
            return number

        if isinstance(raw, dict):
            spec = self.mapping(raw, where, line, {"mean", "amplitude", "period_s", "phase", "on_s"})
            period = self.number(spec.get("period_s", 60), f"{where}.period_s", line)
            if period <= 0:
                raise self.fail(f"{where}.period_s", line, f"{period} must be above 0")
            on = spec.get("on_s")
            if on is not None:
                on = self.number(on, f"{where}.on_s", line)
                if not 0 < on <= period:
                    raise self.fail(f"{where}.on_s", line, f"{on} must be above 0 and at most period_s ({period})")
            return Wave(
                mean=value(spec.get("mean", 0), f"{where}.mean"),
                amplitude=value(spec.get("amplitude", 0), f"{where}.amplitude"),
                period_s=period,
                phase=self.number(spec.get("phase", 0), f"{where}.phase", line),
                on_s=on,
            )
        return Wave(mean=value(raw, where))


def line_of(mapping: Any, key: Any) -> int:
    lines = getattr(mapping, "key_lines", None) or {}
    return int(lines.get(str(key), getattr(mapping, "line", 0)))


def item_line(item: Any) -> int:
    """The line an item of a sequence starts on, where the loader knows it."""
    return int(getattr(item, "line", 0))
