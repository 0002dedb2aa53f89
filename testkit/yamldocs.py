"""YAML documents as the tests read them: rendered kustomize targets and charts."""

from __future__ import annotations

from typing import Any

import yaml

# libyaml's parser, which PyYAML's wheels bundle: the suite reads megabytes of rendered
# manifests, and the pure-Python parser was most of the CPU of the chart and kustomize
# tests (26 s of their 50 under a profiler). The same documents, the same safe tags.
LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def documents(text: str) -> list[dict[str, Any]]:
    """The non-empty documents of a multi-document YAML stream."""
    return [doc for doc in yaml.load_all(text, Loader=LOADER) if doc]
