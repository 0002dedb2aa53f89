"""The ledger alone (collect/ledger.py and the estimator under it): the calls a sweep makes of it
on the replayed node, captured once, then replayed through a tree's ledger, timed and digested.

The sweep's figure in bench/agent_cost.py moves by a tenth from run to run on a shared machine;
the ledger's calls replayed alone move by far less, and their digest (every window's figures,
means and refusals, as `repr` writes them) tells whether two trees bill alike to the last digit:

    .venv/bin/python bench/agent_cost.py --gpus 8 --seconds 120 --keep /tmp/ac --record-only
    .venv/bin/python bench/ledger_replay.py capture /tmp/ac/8-gpus /tmp/calls.pkl
    .venv/bin/python bench/ledger_replay.py replay /tmp/calls.pkl [--vary] [--tree OTHER-CHECKOUT]

`capture` runs the row of bench/agent_cost.py (15 s scrapes) in this process, and keeps every
call that changes a GPU's ledger, in order: the process watch's listings and confirmations, and
each sweep's listing, samples, accounting records, processes of unknown use and closing of the
GPU's periods (`means` is replayed on each window closed). `--vary` replays them with the samples' other
figures made up (memory copy, encoder, JPEG; some over 100 %), 3 % of the GPU's periods
without a figure and the GPU's figures swung by up to half: the steady node leaves those paths
idle. Each GPU's ledger begins empty, as the agent's does. `--tree DIR` replays them through
another checkout's otel_vgpu/ (a worktree of the commit before a change), as
bench/bill_evaluation.py's does.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import pickle
import random
import runpy
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

Call = tuple[str, int, tuple[Any, ...], dict[str, Any]]
"""One call of the ledger: the function's name, which GPU's ledger (by first use), its other
arguments."""

CALLED = ("listed", "confirmed", "sampled", "accounted", "unknown", "close")
"""The ledger's functions that change a GPU's ledger, each captured in the order made."""


def capture(row: Path, out: Path, scrape_every: float, seconds: float) -> int:
    """The ledger's calls of bench/agent_cost.py's row on the recording `row`, pickled to `out`:
    the sweeps' and the process watch's, in their order."""
    # The ledger is pure (no clock): imported ahead of the row's simulated clock, it binds none.
    from otel_vgpu.collect import ledger  # noqa: PLC0415

    calls: list[Call] = []
    books: dict[int, int] = {}

    def kept(name: str, call: Any) -> Any:
        def wrapper(book: ledger.GpuLedger, *args: Any, **kwargs: Any) -> Any:
            calls.append((name, books.setdefault(id(book), len(books)), args, kwargs))
            return call(book, *args, **kwargs)

        return wrapper

    for name in CALLED:
        setattr(ledger, name, kept(name, getattr(ledger, name)))
    every = ["--scrape-every", f"{scrape_every:g}", "--seconds", f"{seconds:g}"]
    sys.argv = [str(ROOT / "bench/agent_cost.py"), "--row", str(row), *every]
    # Run as its own script (bench scripts never import each other): it sets its simulated clock
    # before it imports the agent's modules.
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as done:
        if done.code:
            raise
    out.write_bytes(pickle.dumps(calls))
    return len(calls)


def varied(calls: list[Call], seed: int = 57) -> list[Call]:
    """The calls with figures the steady node never shows (the module's `--vary`)."""
    from otel_vgpu.gpu.backend import ProcessUse  # noqa: PLC0415 (the tree's, once --tree is on the path)

    draw = random.Random(seed)
    out: list[Call] = []
    for name, book, called, kwargs in calls:
        args = called
        if name == "sampled":
            made = []
            for sample in args[0]:
                sm = sample.use.sm
                over = 1.2 if draw.random() < 0.01 else 0.0
                use = ProcessUse(sm, min(1.0, sm * 3), sm / 2, 0.0, sm * draw.random(), over)
                made.append(dataclasses.replace(sample, use=use))
            args = (made, *args[1:])
        elif name == "close":
            swung = [
                (end, None if gpu is None or draw.random() < 0.03 else gpu * draw.uniform(0.5, 1.5))
                for end, gpu in args[0]
            ]
            args = (swung, *args[1:])
        out.append((name, book, args, kwargs))
    return out


def replay(calls: list[Call], repeat: int) -> tuple[str, dict[str, float]]:
    """The digest of what every call answered (each window with its means) and the fastest of
    `repeat` replays' seconds, by ledger function."""
    from otel_vgpu.collect import ledger  # noqa: PLC0415 (the tree's, once --tree is on the path)

    best: dict[str, float] = {}
    digest = ""
    for _ in range(repeat):
        books: dict[int, ledger.GpuLedger] = {}
        spent = dict.fromkeys((*CALLED, "means"), 0.0)
        answers: list[object] = []
        for name, book, args, kwargs in calls:
            began = time.perf_counter()
            answer = getattr(ledger, name)(books.setdefault(book, ledger.GpuLedger()), *args, **kwargs)
            called = time.perf_counter()
            spent[name] += called - began
            if name == "close":
                means = ledger.means(answer)
                spent["means"] += time.perf_counter() - called
                answers.append(
                    (
                        answer.seconds,
                        sorted(answer.ran.items()),
                        answer.gpu_busy,
                        answer.unexplained,
                        sorted(answer.users),
                        sorted(answer.unattributed.items()),
                        sorted(means[0].items()),
                        sorted(means[1].items(), key=repr),
                    )
                )
            elif name == "sampled":
                answers.append(sorted(answer))
        digest = hashlib.sha256(repr(answers).encode()).hexdigest()[:16]
        best = {name: min(best.get(name, float("inf")), value) for name, value in spent.items()}
    return digest, best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    taking = commands.add_parser("capture", help="the ledger's calls of a row, pickled")
    taking.add_argument("row", type=Path, help="a recording kept by bench/agent_cost.py --keep (DIR/N-gpus)")
    taking.add_argument("out", type=Path)
    taking.add_argument("--scrape-every", type=float, default=15.0)
    taking.add_argument("--seconds", type=float, default=120.0)
    replaying = commands.add_parser("replay", help="the calls through this tree's ledger: digest and time")
    replaying.add_argument("calls", type=Path)
    replaying.add_argument("--repeat", type=int, default=3, help="the fastest of this many")
    replaying.add_argument("--vary", action="store_true", help="with figures the steady node never shows")
    replaying.add_argument("--tree", type=Path, help="another checkout whose otel_vgpu/ replays them")
    args = parser.parse_args()
    if args.command == "capture":
        sys.path[:0] = [str(ROOT)]
        count = capture(args.row, args.out, args.scrape_every, args.seconds)
        print(f"{count} calls kept in {args.out}", file=sys.stderr)
        return 0
    sys.path[:0] = [str(ROOT)] if args.tree is None else [str(args.tree.resolve()), str(ROOT)]
    import otel_vgpu  # noqa: PLC0415

    print(f"otel_vgpu of {Path(otel_vgpu.__file__).resolve().parents[1]}", file=sys.stderr)
    calls = pickle.loads(args.calls.read_bytes())
    digest, spent = replay(varied(calls) if args.vary else calls, args.repeat)
    times = " ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in spent.items())
    print(f"digest {digest}  {times}  total {sum(spent.values()) * 1000:.0f} ms ({len(calls)} calls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
