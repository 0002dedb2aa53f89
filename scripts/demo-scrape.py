#!/usr/bin/env python3
"""The scrape README.md's "What the demo shows" reads: runs the demo as the README's first
command does (`otel-vgpu --simulate`, in the repository, so with its gpu_allocation.txt), waits
until its figures have settled, scrapes it once and prints GPU 0's rows the README shows, in
its order and format, then the figures its prose quotes from them.

`--write` puts the rows in README.md, in the block after "GPU 0's rows, from one scrape:"; the
prose's figures are then to be brought to those printed. tests/system/test_builtin_demo.py checks
that the block is what this prints of a live scrape, values aside, that each value is within
its stated tolerance of the live one, and that the prose quotes the block:
.venv/bin/python scripts/demo-scrape.py --write"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The README's sentence before the block, and the block's fences.
MARKER = "GPU 0's rows, from one scrape:"
FENCE_OPEN, FENCE_CLOSE = "```text\n", "```"
GPU = "0"
# GPU 0's families the README shows, in its order: each pod's memory, allocation, SM and
# vGPU use and busy seconds, then the GPU's memory identity and its SM against its pods'.
SHOWN = (
    "vgpu_pod_memory_used_bytes",
    "vgpu_pod_memory_allocated_bytes",
    "vgpu_pod_sm_utilization_ratio",
    "vgpu_pod_vgpu_utilization_ratio",
    "vgpu_pod_sm_busy_seconds_total",
    "vgpu_gpu_memory_total_bytes",
    "vgpu_gpu_memory_used_bytes",
    "vgpu_gpu_memory_unattributed_bytes",
    "vgpu_gpu_memory_reserved_bytes",
    "vgpu_gpu_memory_unlisted_bytes",
    "vgpu_gpu_sm_utilization_ratio",
    "vgpu_gpu_sm_busy_seconds_total",
    "vgpu_gpu_sm_unattributed_seconds_total",
    "vgpu_gpu_vgpus",
)
# A pod's SM figure is NVML's 14.2 s trailing mean, and the bill waits 3 s for a period to
# settle (docs/nvml-sampling.md): past both and a sweep, every figure is of the scenario's run.
SETTLE_S = 20.0
START_TIMEOUT_S = 60.0


# A NamedTuple, not a dataclass: the tests load this file as a module of no package
# (testkit/scripts.py), where dataclasses cannot resolve its annotations.
class Row(NamedTuple):
    """One series of the README's block."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    @property
    def key(self) -> str:
        """The series as the exposition names it, labels in its order."""
        pairs = ",".join(f'{k}="{_escaped(v)}"' for k, v in self.labels)
        return f"{self.name}{{{pairs}}}"

    @property
    def label(self) -> dict[str, str]:
        return dict(self.labels)

    def line(self) -> str:
        return f"{self.key} {figure(self.value)}"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def figure(value: float) -> str:
    """A value as the README prints it: whole numbers whole, large ones to five figures, the
    rest to four decimals (enough to add the rows up by hand)."""
    if abs(value) >= 1e4:
        return f"{value:.4e}"
    if value == int(value):
        return str(int(value))
    return f"{value:.4f}".rstrip("0").rstrip(".")


def rows_of(exposition: str) -> list[Row]:
    """Every series of an exposition, in its order, labels sorted as the agent serves them."""
    return [
        Row(sample.name, tuple(sorted(sample.labels.items())), sample.value)
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    ]


def shown(exposition: str) -> list[Row]:
    """GPU 0's rows of a scrape that the README shows, in SHOWN's order, each family's series in
    the order served."""
    rows = [row for row in rows_of(exposition) if row.name in SHOWN and row.label.get("gpu_id") == GPU]
    return sorted(rows, key=lambda row: SHOWN.index(row.name))  # stable: served order within a family


def readme_block(readme: str) -> str:
    """The text of the README's block (its lines, without the fences)."""
    after = readme.split(MARKER, 1)[1]
    return after.split(FENCE_OPEN, 1)[1].split(FENCE_CLOSE, 1)[0]


def with_block(readme: str, rows: Sequence[Row]) -> str:
    """The README with its block holding `rows`."""
    before, after = readme.split(MARKER, 1)
    head, rest = after.split(FENCE_OPEN, 1)
    old = rest.split(FENCE_CLOSE, 1)[0]
    body = "".join(f"{row.line()}\n" for row in rows)
    return before + MARKER + head + FENCE_OPEN + body + rest[len(old) :]


def find(rows: Sequence[Row], name: str, **labels: str) -> float:
    """The value of the one row of `name` whose labels include `labels`."""
    [value] = [row.value for row in rows if row.name == name and labels.items() <= row.label.items()]
    return value


def quoted(rows: Sequence[Row]) -> list[str]:
    """The figures the README's prose quotes from its block, as it words them."""
    memory, sm, busy = "vgpu_pod_memory_used_bytes", "vgpu_pod_sm_utilization_ratio", "vgpu_pod_sm_busy_seconds_total"
    trainer, notebook = "llama-finetune-0", "notebook-alice"
    unattributed = sum(row.value for row in rows if row.name == "vgpu_gpu_sm_unattributed_seconds_total")
    processes = sum(1 for row in rows if row.name == memory)  # one process a pod on GPU 0
    gb, mib = 1e9, 2**20
    return [
        f"uses {find(rows, memory, pod=notebook) / gb:.1f} GB of the "
        f"{find(rows, 'vgpu_pod_memory_allocated_bytes', pod=notebook) / gb:.0f} GB",
        f"and {find(rows, sm, pod=notebook):.2f} of the GPU's SMs",
        f"/ shares, is {find(rows, 'vgpu_pod_vgpu_utilization_ratio', pod=notebook):.2f}, above 1",
        # The sums to the block's own figures, so that a reader can add them up.
        f"The GPU's SM use, {figure(find(rows, 'vgpu_gpu_sm_utilization_ratio'))}, is its two pods' "
        f"({figure(find(rows, sm, pod=trainer))} + {figure(find(rows, sm, pod=notebook))})",
        f"the GPU's {figure(find(rows, 'vgpu_gpu_sm_busy_seconds_total'))} s = {figure(find(rows, busy, pod=trainer))} "
        f"+ {figure(find(rows, busy, pod=notebook))} + {figure(unattributed)}",
        f"its pods' ({find(rows, memory, pod=trainer) / gb:.1f} + {find(rows, memory, pod=notebook) / gb:.1f} GB)",
        f"`vgpu_gpu_memory_reserved_bytes`, {find(rows, 'vgpu_gpu_memory_reserved_bytes') / mib:.0f} MiB",
        f"`vgpu_gpu_memory_unlisted_bytes`, {find(rows, 'vgpu_gpu_memory_unlisted_bytes') / mib / processes:.1f} MiB "
        "a process",
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except OSError:
        return 0, ""


@contextmanager
def demo() -> Iterator[str]:
    """The demo as the README's first command runs it, on a free local port; its base URL, once
    it serves."""
    port = _free_port()
    command = [sys.executable, "-m", "otel_vgpu", "--simulate", "--address", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while _get(f"{url}/healthz")[0] != 200:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                sys.exit(f"the demo did not serve: {process.communicate()[1]}")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.communicate(timeout=30)


def settled_scrape(url: str) -> str:
    """A scrape of the demo at `url` once its figures have settled (SETTLE_S after it served)."""
    time.sleep(SETTLE_S)
    status, text = _get(f"{url}/metrics")
    if status != 200:
        sys.exit(f"the scrape answered {status}")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--write", action="store_true", help="put the rows in README.md's block")
    args = parser.parse_args()
    with demo() as url:
        rows = shown(settled_scrape(url))
    if args.write:
        text = README.read_text()
        new = with_block(text, rows)
        if new != text:
            README.write_text(new)
        print(f"README.md: the demo's scrape {'rewritten' if new != text else 'already current'}")
    else:
        print("".join(f"{row.line()}\n" for row in rows), end="")
    print("\nthe figures the prose quotes:", *quoted(rows), sep="\n  ")


if __name__ == "__main__":
    main()
