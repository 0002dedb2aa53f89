"""Reading the exposition format back, for assertions."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Exposition:
    values: dict[str, dict[frozenset[tuple[str, str]], float]]
    help: dict[str, str]
    types: dict[str, str]

    def series(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        return self.values.get(name, {})

    def value(self, name: str) -> float | None:
        """The value of a family of one unlabelled series; None when it is absent."""
        series = self.series(name)
        assert len(series) <= 1, f"{name} has {len(series)} series"
        return next(iter(series.values()), None)

    def by(self, name: str, *labels: str) -> dict[tuple[str, ...], float]:
        """Values of one family keyed by the given labels' values."""
        result = {}
        for key, value in self.series(name).items():
            as_dict = dict(key)
            result[tuple(as_dict.get(label, "") for label in labels)] = value
        return result


def parse(text: str) -> Exposition:
    values: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        helps[family.name] = family.documentation
        types[family.name] = family.type
        for sample in family.samples:
            values.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return Exposition(values, helps, types)
