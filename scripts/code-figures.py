"""The package's ten largest modules (lines) and ten longest functions (lines, decorators
aside): what the house issue's closing note quotes before and after a refactoring.

    python3 scripts/code-figures.py [otel_vgpu]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def figures(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    modules, functions = [], []
    for path in sorted(root.rglob("*.py")):
        if "_pb2" in path.name:
            continue  # generated
        text = path.read_text()
        modules.append((len(text.splitlines()), str(path)))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                functions.append((node.end_lineno - node.lineno + 1, f"{path}:{node.name}"))
    return sorted(modules, reverse=True)[:10], sorted(functions, reverse=True)[:10]


def main() -> None:
    modules, functions = figures(Path(sys.argv[1] if len(sys.argv) > 1 else "otel_vgpu"))
    print("| lines | module |\n|---|---|")
    print("\n".join(f"| {n} | `{name}` |" for n, name in modules))
    print("\n| lines | function |\n|---|---|")
    print("\n".join(f"| {n} | `{name}` |" for n, name in functions))


if __name__ == "__main__":
    main()
