"""py-spy for the benchmarks that profile the agent (bench/flamegraph.py on the replayed node,
bench/gpu_thread_cpu.py through the pod harness on a GPU): where to find it, and what its raw
stacks say of self time."""

from __future__ import annotations

import collections
import os
import re
import shutil
import sys
from pathlib import Path


def py_spy() -> str:
    """py-spy: on PATH, beside this Python, or in the `bin/` of a PYTHONPATH entry (the lent GPU
    machines install the agent's wheels with pip --target, py-spy's with them)."""
    places = [Path(sys.executable).parent]
    places += [Path(entry) / "bin" for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    found = shutil.which("py-spy") or next((str(p / "py-spy") for p in places if (p / "py-spy").exists()), None)
    if found is None:
        raise SystemExit("py-spy not found: install the profile extra, .venv/bin/uv pip install -e '.[profile]'")
    return found


def top_functions(raw: Path, most: int, waiting: frozenset[str] = frozenset()) -> list[tuple[str, int, float]]:
    """The frames that were on top of the most samples (self time), with their share; those of
    a function in `waiting` (a thread that waits, which py-spy may sample) left out."""
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        # py-spy names each frame `Class.function (file:line)`: summed over the function's lines.
        frame = stack.split(";")[-1]
        if frame.split(" (", 1)[0].rsplit(".", 1)[-1] in waiting:
            continue
        own[re.sub(r":\d+\)$", ")", frame)] += int(count)
        total += int(count)
    return [(frame, n, 100 * n / total) for frame, n in own.most_common(most)]
