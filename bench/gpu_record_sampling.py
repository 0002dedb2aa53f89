"""Record what NVML says of each process's GPU use, beside what each process ran: the test data
the bill's estimator is derived from and judged against (docs/nvml-sampling.md).

Runs each scenario's CUDA processes (testkit/sampling_workload.py, which note when their own
kernels ran) and polls NVML every `--poll-ms` for the whole scenario:

- the per-process samples (nvmlDeviceGetProcessesUtilizationInfo, else
  nvmlDeviceGetProcessUtilization, asked since 0: NVML keeps one sample a process, and one
  can arrive stamped well before the newest of another's), each new (PID, stamp) with when it
  first appeared;
- the GPU's own sample buffer (nvmlDeviceGetSamples, GPU utilization), each new sample;
- the process listings (compute, and MPS clients) with each process's memory, the device's
  used memory, and nvmlDeviceGetUtilizationRates.

Each scenario becomes one gzipped JSON file in `--out`, with the GPU, the driver, the
step's solo time (measured alone first) and every process's own truth. One call of under ten
minutes records them all:

    python3 bench/gpu_record_sampling.py --out tests/data/nvml-recordings

Run as root on a machine with an NVIDIA GPU, PyTorch and nvidia-ml-py, from the repository
root. The MPS scenario starts an MPS control daemon and tells it to quit afterwards, which
changes no GPU setting.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "testkit" / "sampling_workload.py"


@dataclass(frozen=True)
class Worker:
    name: str
    pod: str
    plan: list[list[float]] | None = None
    """Segments of [seconds, period ms, on ms]."""
    spawn: list[list[float]] | None = None
    """Children of [offset s, life s], forked in turn."""
    dodge: list[float] | None = None
    """[seconds, margin ms]: kernels only between the driver's ticks (sampling_workload.py)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    workers: list[Worker]
    seconds: float
    mps: bool = False


BUSY, IDLE = [100, 100], [100, 0]


def _seg(seconds: float, period_on: list[int]) -> list[float]:
    return [seconds, *period_on]


def _idle_context(name: str, about: str, steady: list[int], idle: list[int]) -> Scenario:
    """A process at `idle`'s [period ms, on ms] for 6 s that then keeps its context idle, beside
    a steady one at `steady`'s, 30 s: one scenario, at rhythms locked to the ticks or not."""
    return Scenario(
        name,
        about,
        [
            Worker("steady", "pod-a", plan=[_seg(30, steady)]),
            Worker("idle", "pod-b", plan=[_seg(6, idle), _seg(24, IDLE)]),
        ],
        30,
    )


# [offset s, life s]: beside the steady process, then back to back (offset passed: at once), then alone.
FRESH: list[list[float]] = [[1, 0.1], [3, 0.3], [5.5, 1], [8.5, 3], [13.5, 1]]
FRESH += [[0.0, 1.0] for _ in range(5)] + [[27.0, 0.3], [29.0, 1.0]]

SCENARIOS = [
    Scenario(
        "solo-duty",
        "one process alone: busy, then kernels 50, 20 and 5 ms of every 100 ms, 300 ms of every second, then idle",
        [
            Worker(
                "a",
                "pod-a",
                plan=[
                    _seg(8, BUSY),
                    _seg(8, [100, 50]),
                    _seg(8, [100, 20]),
                    _seg(8, [100, 5]),
                    _seg(8, [1000, 300]),
                    _seg(6, IDLE),
                ],
            )
        ],
        46,
    ),
    Scenario(
        "two-sliced",
        "two time-sliced processes: busy+busy, busy+30%, busy+300 ms/s, 50%+50%, 20%+40%, busy+idle context",
        [
            Worker(
                "a",
                "pod-a",
                plan=[
                    _seg(8, BUSY),
                    _seg(8, BUSY),
                    _seg(8, BUSY),
                    _seg(8, [100, 50]),
                    _seg(8, [100, 20]),
                    _seg(8, BUSY),
                ],
            ),
            Worker(
                "b",
                "pod-b",
                plan=[
                    _seg(8, BUSY),
                    _seg(8, [100, 30]),
                    _seg(8, [1000, 300]),
                    _seg(8, [100, 50]),
                    _seg(8, [100, 40]),
                    _seg(8, IDLE),
                ],
            ),
        ],
        48,
    ),
    Scenario(
        "three-sliced",
        "three time-sliced processes: all busy, then 40%+30%+20%, then busy+30%+200 ms/s",
        [
            Worker("a", "pod-a", plan=[_seg(8, BUSY), _seg(8, [100, 40]), _seg(8, BUSY)]),
            Worker("b", "pod-b", plan=[_seg(8, BUSY), _seg(8, [100, 30]), _seg(8, [100, 30])]),
            Worker("c", "pod-c", plan=[_seg(8, BUSY), _seg(8, [100, 20]), _seg(8, [1000, 200])]),
        ],
        24,
    ),
    Scenario(
        "batches",
        "a steady process at 40% beside one that works in batches and keeps its context idle between them",
        [
            Worker("steady", "pod-a", plan=[_seg(40, [100, 40])]),
            Worker(
                "batches",
                "pod-b",
                plan=[
                    _seg(5, BUSY),
                    _seg(10, IDLE),
                    _seg(5, [100, 50]),
                    _seg(10, IDLE),
                    _seg(5, [1000, 500]),
                    _seg(5, IDLE),
                ],
            ),
        ],
        40,
    ),
    _idle_context(
        "idle-context",
        "a process at half of every 100 ms for 6 s that then keeps its context idle, beside a steady one at 40% "
        "(gpu_validate_bill.py's idle-context)",
        steady=[100, 40],
        idle=[100, 50],
    ),
    _idle_context(
        "idle-context-drifting",
        "idle-context with rhythms that drift against the driver's 200 ms ticks: a process at half of every "
        "97 ms for 6 s that then keeps its context idle, beside one at 41 ms of every 103 ms",
        steady=[103, 41],
        idle=[97, 48],
    ),
    Scenario(
        "batches-busy",
        "a server busy 2 s of every 8 s, its context idle in between, beside a steady process at 40% "
        "(gpu_validate_bill.py's batches)",
        [
            Worker("steady", "pod-a", plan=[_seg(32, [100, 40])]),
            Worker("server", "pod-b", plan=[_seg(2, BUSY), _seg(6, IDLE)] * 4),
        ],
        32,
    ),
    Scenario(
        "tick-dodging",
        "a tenant that reads the GPU's sample stamps from NVML and runs kernels only from 25 ms after each "
        "tick to 25 ms before the next, beside a victim busy for 12 s, then at 41 ms of every 103 ms",
        [
            Worker("victim", "pod-a", plan=[_seg(12, BUSY), _seg(12, [103, 41])]),
            Worker("tenant", "pod-b", dodge=[24, 25]),
        ],
        24,
    ),
    Scenario(
        "fresh",
        "busy processes of 0.1, 0.3, 1 and 3 s, then six 1 s processes back to back, beside a steady process at "
        "40%; then 0.3 s and 1 s processes alone",
        [
            Worker("steady", "pod-a", plan=[_seg(25, [100, 40])]),
            Worker(
                "fresh",
                "pod-b",
                spawn=FRESH,
            ),
        ],
        32,
    ),
    Scenario(
        "mps",
        "an MPS server with three clients: two of pod-a (busy, 30%) and one of pod-b (50%)",
        [
            Worker("a1", "pod-a", plan=[_seg(20, BUSY)]),
            Worker("a2", "pod-a", plan=[_seg(20, [100, 30])]),
            Worker("b1", "pod-b", plan=[_seg(20, [100, 50])]),
        ],
        22,
        mps=True,
    ),
]


@dataclass
class Recording:
    polls: list[list[Any]] = field(default_factory=list)
    """[t us, {pid: used bytes}, device used bytes, utilization rates gpu %, {mps pid: used}]"""
    samples: list[list[Any]] = field(default_factory=list)
    """[arrived us, pid, stamp us, sm %, mem %, enc %, dec %]"""
    device: list[list[int]] = field(default_factory=list)
    """[stamp us, GPU utilization %]"""


def _record(pynvml: Any, handle: Any, until: float, poll_s: float, mps: bool) -> Recording:
    recording = Recording()
    seen: set[tuple[int, int]] = set()
    device_since = 0
    v2 = hasattr(pynvml, "nvmlDeviceGetProcessesUtilizationInfo")
    while time.time() < until:
        now = time.time_ns() // 1000
        try:
            if v2:
                samples = pynvml.nvmlDeviceGetProcessesUtilizationInfo(handle, 0)
            else:
                samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
        except pynvml.NVMLError as error:
            if isinstance(error, pynvml.NVMLError_NotFound):
                samples = []  # no process has a sample: NVML's answer when all are idle
            elif v2:
                v2 = False  # a driver without the newer call: the older one serves
                continue
            else:
                raise
        for sample in samples:
            key = (int(sample.pid), int(sample.timeStamp))
            if key not in seen:
                seen.add(key)
                recording.samples.append(
                    [now, *key, int(sample.smUtil), int(sample.memUtil), int(sample.encUtil), int(sample.decUtil)]
                )
        try:
            _, own = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, device_since)
        except pynvml.NVMLError_NotFound:
            own = []
        for sample in own:
            if int(sample.timeStamp) > device_since:
                recording.device.append([int(sample.timeStamp), int(sample.sampleValue.uiVal)])
        device_since = max([device_since, *(int(s.timeStamp) for s in own)])
        listed = {int(p.pid): int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        clients = (
            {int(p.pid): int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle)}
            if mps
            else {}
        )
        used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        rate = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        recording.polls.append([now, listed, used, rate, clients])
        time.sleep(max(0.0, poll_s - (time.time_ns() // 1000 - now) / 1e6))
    return recording


@contextlib.contextmanager
def _mps(directory: Path) -> Iterator[dict[str, str]]:
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}
    for path in env.values():
        Path(path).mkdir(parents=True)
    daemon = subprocess.Popen(
        ["nvidia-cuda-mps-control", "-f"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield env
    finally:
        subprocess.run(
            ["nvidia-cuda-mps-control"], input="quit\n", text=True, env={**os.environ, **env}, timeout=30, check=False
        )
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def _calibrate() -> float:
    out = subprocess.run([sys.executable, str(WORKLOAD), "--calibrate"], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def run_scenario(pynvml: Any, handle: Any, scenario: Scenario, poll_s: float, work: Path) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(_mps(work / f"mps-{scenario.name}")) if scenario.mps else {}
        start_at = time.time() + 15  # time for every process to import PyTorch and make its context
        processes = []
        for worker in scenario.workers:
            truth = work / f"{scenario.name}-{worker.name}.json"
            argv = [sys.executable, str(WORKLOAD), "--truth", str(truth), "--start-at", f"{start_at:.6f}"]
            if worker.spawn:
                argv += ["--spawn", json.dumps(worker.spawn)]
            elif worker.dodge:
                argv += ["--dodge", json.dumps(worker.dodge)]
            else:
                argv += ["--plan", json.dumps(worker.plan)]
            processes.append(
                (worker, truth, subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env={**os.environ, **env}))
            )
        recorded_from = time.time()
        recording = _record(pynvml, handle, start_at + scenario.seconds + 2.5, poll_s, scenario.mps)
        workers = []
        for worker, truth, process in processes:
            process.wait(timeout=60)
            if not truth.exists():
                raise SystemExit(f"{scenario.name}: worker {worker.name} exited {process.returncode} without its truth")
            workers.append(
                {"name": worker.name, "pod": worker.pod, "plan": worker.plan, "spawn": worker.spawn,
                 "dodge": worker.dodge, "parent": process.pid, "processes": json.loads(truth.read_text())}
            )  # fmt: skip
    return {
        "scenario": scenario.name,
        "about": scenario.about,
        "start_us": int(start_at * 1e6),
        "recorded_from_us": int(recorded_from * 1e6),
        "workers": workers,
        "polls": recording.polls,
        "samples": recording.samples,
        "device": recording.device,
        "mps": scenario.mps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--poll-ms", type=float, default=25.0)
    parser.add_argument("--only", nargs="*", help="scenarios to record (default: every one)")
    parser.add_argument("--take", type=int, help="name each file <scenario>-<take>: one scenario recorded again")
    args = parser.parse_args()
    import pynvml  # noqa: PLC0415

    args.out.mkdir(parents=True, exist_ok=True)
    solo = _calibrate()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    gpu = {
        "name": str(pynvml.nvmlDeviceGetName(handle)),
        "driver": str(pynvml.nvmlSystemGetDriverVersion()),
        "nvml": str(pynvml.nvmlSystemGetNVMLVersion()),
        "memory_total": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
        "step_solo_s": solo,
        "poll_ms": args.poll_ms,
        "recorded": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python3 bench/gpu_record_sampling.py " + " ".join(sys.argv[1:]),
    }
    print(f"{gpu['name']}, driver {gpu['driver']}: one step alone {solo * 1e3:.3f} ms", flush=True)
    with tempfile.TemporaryDirectory() as work:
        for scenario in SCENARIOS:
            if args.only and scenario.name not in args.only:
                continue
            began = time.time()
            data = {"gpu": gpu, **run_scenario(pynvml, handle, scenario, args.poll_ms / 1000, Path(work))}
            stem = scenario.name if args.take is None else f"{scenario.name}-{args.take}"
            path = args.out / f"{stem}.json.gz"
            with gzip.open(path, "wt", compresslevel=9) as out:
                json.dump(data, out, separators=(",", ":"))
            print(
                f"{scenario.name}: {len(data['samples'])} process samples, {len(data['device'])} GPU samples, "
                f"{len(data['polls'])} polls, {time.time() - began:.0f} s, {path.stat().st_size // 1024} KiB",
                flush=True,
            )
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
