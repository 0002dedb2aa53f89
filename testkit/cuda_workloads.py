"""CUDA workloads for the real-GPU scripts (bench/gpu_*.py): PyTorch processes that keep a
GPU's SMs, memory or JPEG decoders busy, or hold memory idle; and NVML's own figures to check
the agent's against."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

WORKLOAD = r"""
import os, signal, sys, time, torch
mode, gib = sys.argv[1], float(sys.argv[2])
burst_s = float(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.1
work_file = os.environ.get("WORK_FILE")
if os.environ.get("COMM"):  # the name /proc/<pid>/stat shows: prctl(PR_SET_NAME), as any process may
    import ctypes
    ctypes.CDLL(None).prctl(15, os.environ["COMM"].encode(), 0, 0, 0)
hold = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

def step():
    global a
    a = (a @ a).clamp_(-1, 1)

# The GPU time one step takes alone: the fastest of a few timed batches (a batch
# that shared the GPU with another process only runs slower).
solo = float("inf")
for _ in range(8):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    solo = min(solo, (time.perf_counter() - t) / 10)
# The timed batches were work too: the GPU ran them, and an agent bills them.
steps, noted = 80, 0.0

def note():
    # GPU seconds of work done so far (steps x their solo time): what the process
    # ran, counted by itself, however time-slicing stretched its wall time.
    global noted
    if work_file and time.monotonic() - noted >= 0.5:
        noted = time.monotonic()
        with open(work_file + ".tmp", "w") as f:
            f.write(f"{time.time()} {steps * solo}\n")
        os.replace(work_file + ".tmp", work_file)

def stop(*_):
    # A pod deleted (SIGTERM): its last work is written before it goes, so that what it
    # counted is all it ran, not up to half a second less.
    global noted
    noted = 0.0
    note()
    os._exit(0)

signal.signal(signal.SIGTERM, stop)
born = time.monotonic()
print("ready", flush=True)
while True:
    if mode == "busy":
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        steps += 20
    elif mode == "batches" and (time.monotonic() - born) % float(os.environ.get("BATCH_EVERY_S", "8")) >= float(
        os.environ.get("BATCH_ON_S", "2")
    ):  # between batches: the context kept, no kernel launched
        time.sleep(0.01)
    elif mode in ("bursty", "steady", "batches"):  # kernels for burst_s of each second, or that share of every 100 ms
        period = 1.0 if mode == "bursty" else 0.1
        on = burst_s * period
        start = time.monotonic()
        while time.monotonic() - start < on:
            step()
            torch.cuda.synchronize()
            steps += 1
        time.sleep(max(0.0, period - (time.monotonic() - start)))
    elif mode == "once":  # bf16 matrix products for ONCE_S seconds, its work written, then gone
        until = time.monotonic() + float(os.environ.get("ONCE_S", "1.0"))
        while time.monotonic() < until:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
            steps += 20
        noted = 0.0
        note()
        sys.exit(0)
    elif mode == "copy":  # memory-bound: device-to-device copies (of COPY_GIB, 2 GiB), SMs nearly idle
        if "src" not in globals():
            src = torch.empty(int(float(os.environ.get("COPY_GIB", "2")) * 2**30), dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
        for _ in range(10):
            dst.copy_(src)
        torch.cuda.synchronize()
        steps += 10
    elif mode == "jpeg":  # JPEG decoding on the GPU (nvJPEG), 32 frames of 1080p a batch
        if "frames" not in globals():
            import torchvision
            frame = (torch.rand(3, 1080, 1920) * 255).to(torch.uint8)
            frames = [torchvision.io.encode_jpeg(frame)] * 32
        torchvision.io.decode_jpeg(frames, device="cuda")
        torch.cuda.synchronize()
        steps += 1
    else:
        time.sleep(0.5)
    note()
"""


def require_gpu() -> None:
    """Stop with one line, not a traceback, where there is no NVIDIA GPU to run on."""
    try:
        import pynvml  # noqa: PLC0415
    except ImportError:
        raise SystemExit("nvidia-ml-py is not installed: the GPU scripts need it (bench/README.md)") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise SystemExit(
            f"no NVIDIA GPU to run on: NVML says {error} (libnvidia-ml.so.1 and a loaded driver are needed); "
            "the GPU scripts run on a GPU node, bench/README.md says what they need"
        ) from None
    pynvml.nvmlShutdown()


def start_workload(
    mode: str, gib: float, env: dict[str, str] | None = None, burst_ms: float = 100.0
) -> subprocess.Popen[str]:
    """A PyTorch process on the GPU `env`'s CUDA_VISIBLE_DEVICES names (default: CUDA's first):
    `busy` (bf16 matrix products), `copy` (device-to-device copies of COPY_GIB, default 2 GiB: memory-bound),
    `bursty` (kernels for `burst_ms` of each second), `steady` (that share of every 100 ms),
    `jpeg` (JPEG decoding with nvJPEG), `once` (bf16 matrix products for ONCE_S seconds of
    `env`, then it exits), `batches` (as `steady` for BATCH_ON_S seconds of every
    BATCH_EVERY_S from its start, its context idle in between) or idle, holding `gib` GiB.
    With WORK_FILE in `env`, it writes there, twice a second and when it gets SIGTERM,
    "<unix time> <GPU seconds of work done>" (steps times one step's solo time, the timed
    batches that measure it included)."""
    return start_workloads([mode], gib, env, burst_ms)[0]


def in_cgroup(cgroup: Path | None, argv: list[str]) -> list[str]:
    """`argv`, run by a shell that first moves itself into `cgroup` and then execs it: the
    process is there before its first instruction, as runc puts a container's process."""
    if cgroup is None:
        return argv
    return ["sh", "-c", 'echo $$ > "$1" && shift && exec "$@"', "sh", str(cgroup / "cgroup.procs"), *argv]


def start_workloads(
    modes: list[str],
    gib: float,
    env: dict[str, str] | None = None,
    burst_ms: float = 100.0,
    cgroups: list[Path] | None = None,
) -> list[subprocess.Popen[str]]:
    """`start_workload` for each of `modes`, started together (a PyTorch start takes seconds),
    each ready when returned; with `cgroups`, each in its cgroup from before its first
    instruction, as the container runtime starts a container's process (testkit/host_pods.py
    `start_in`)."""
    processes = [
        subprocess.Popen(
            in_cgroup(
                None if cgroups is None else cgroups[n], [sys.executable, "-c", WORKLOAD, mode, str(gib), str(burst_ms)]
            ),
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        for n, mode in enumerate(modes)
    ]
    for process, mode in zip(processes, modes, strict=True):
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            # The caller never gets them to stop: those that did start would hold the GPU on.
            for started in processes:
                started.kill()
                started.wait()
            raise SystemExit(f"workload {mode} {gib} GiB did not start")
    return processes


def work_of(path: Path) -> float:
    """The GPU seconds of work a workload wrote to its WORK_FILE it had done, 0 before any."""
    return float(path.read_text().split()[1]) if path.exists() else 0.0


def nvml_truth() -> tuple[dict[int, int], int, str, str, str]:
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    used = {p.pid: p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
    name = pynvml.nvmlDeviceGetName(handle)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    driver = pynvml.nvmlSystemGetDriverVersion()
    pynvml.nvmlShutdown()
    return used, total, name, uuid, driver
