"""The repository's scripts (scripts/*.py), imported as modules: the tests check that what a
generator makes is what the repository holds, calling the generator's own functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load(file_name: str) -> ModuleType:
    """scripts/`file_name` as a module (their names have dashes, so no import statement reaches them)."""
    path = SCRIPTS / file_name
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
