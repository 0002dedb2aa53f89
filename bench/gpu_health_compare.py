"""The health read of this tree against an earlier one's, on a real GPU: the same figures, the
same NVML calls, and the CPU each read costs.

Run on a GPU node from the repository root (no root needed; bench/README.md says what the GPU
scripts need), with `--before` a directory holding the earlier version's `otel_vgpu`:

    python3 bench/gpu_health_compare.py --before DIR [--repeat 300] [--out results.md]

Each version reads every GPU's health `--repeat` times in a process of its own (one package
named `otel_vgpu` at a time), the two alternating in `--rounds` rounds, each read's NVML calls
counted by name and its thread's CPU timed (time.thread_time). The figures must be the same
set; the counters (replays, ECC, remapped rows, violation time) must agree and the gauges
(clocks, temperatures, power) stay within what a GPU moves in a second. Nothing on the GPU is
reconfigured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
# Figures that only count (they move only with an event) against those a GPU moves by itself.
GAUGE_SLACK = {"sm.clock": 0.5, "memory.clock": 0.05, "temperature": 0.1, "memory.temperature": 0.1, "power": 0.5}


def measure(repeat: int) -> dict[str, Any]:
    """In this process: every GPU's health read `repeat` times by the otel_vgpu on sys.path."""
    import pynvml  # noqa: PLC0415

    from otel_vgpu.gpu.nvml import NvmlBackend  # noqa: PLC0415

    calls: Counter[str] = Counter()
    for name in dir(pynvml):
        function = getattr(pynvml, name)
        if name.startswith("nvml") and callable(function):

            def counted(*args: Any, _f: Any = function, _n: str = name, **kwargs: Any) -> Any:
                calls[_n] += 1
                return _f(*args, **kwargs)

            counted.__name__ = name
            setattr(pynvml, name, counted)
    backend = NvmlBackend(pynvml)
    gpus = backend.device_count()
    for index in range(gpus):
        backend.device(index)
        _figures(backend.health(index))  # the session's once-only calls (the ECC mode) outside the count
    calls.clear()
    spent, figures = 0.0, {}
    for _ in range(repeat):
        for index in range(gpus):
            started = time.thread_time()
            reading = backend.health(index)
            spent += time.thread_time() - started
            figures[index] = _figures(reading)
    backend.close()
    return {
        "gpus": gpus,
        "figures": figures,
        "calls_per_read": {name: count / (repeat * gpus) for name, count in sorted(calls.items())},
        "cpu_ms_per_read": 1000 * spent / (repeat * gpus),
    }


def _figures(reading: Any) -> dict[str, float]:
    """A reading's figures: a dict before issue 48, a HealthReading after it."""
    return dict(getattr(reading, "figures", reading))


def run(code: Path, repeat: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, __file__, "--measure", str(repeat)], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def compare(before: dict[str, Any], now: dict[str, Any]) -> list[tuple[bool, str]]:
    checks = []
    for index, then in before["figures"].items():
        figures = now["figures"][index]
        checks.append((set(then) == set(figures), f"GPU {index}: the same {len(figures)} figures"))
        for name, value in figures.items():
            slack = GAUGE_SLACK.get(name, 0.0)
            near = abs(value - then[name]) <= slack * max(abs(then[name]), 1.0) if name in then else False
            checks.append((near, f"GPU {index}: {name} {value:g} against {then.get(name)} (slack {slack:g})"))
    same_calls = before["calls_per_read"] == now["calls_per_read"]
    checks.append((same_calls, f"the same NVML calls a read: {now['calls_per_read']}"))
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="a directory holding the earlier version's otel_vgpu")
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure)))
        return 0
    from testkit.cuda_workloads import require_gpu  # noqa: PLC0415
    from testkit.report import publish  # noqa: PLC0415

    require_gpu()
    cpu: dict[str, list[float]] = {"before": [], "now": []}
    results: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):
        for label, code in (("before", args.before), ("now", ROOT)):
            results[label] = run(code, args.repeat)
            cpu[label].append(results[label]["cpu_ms_per_read"])
    checks = compare(results["before"], results["now"])
    ratio = sum(cpu["now"]) / sum(cpu["before"])
    lines = [
        f"{results['now']['gpus']} GPU(s); {args.repeat} reads of each, {args.rounds} rounds alternating",
        "",
        "| check | |",
        "|---|---|",
        *(f"| {what} | {'ok' if ok else 'FAILED'} |" for ok, what in checks),
        "",
        f"CPU per health read (ms, each round): before {', '.join(f'{c:.3f}' for c in cpu['before'])}; "
        f"now {', '.join(f'{c:.3f}' for c in cpu['now'])}; now / before {ratio:.2f}",
    ]
    publish("The health read, before and now, on a real GPU", lines, args.out)
    return 0 if all(ok for ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
