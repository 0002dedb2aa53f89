"""What NVML gives per process beside SM on this GPU: memory copy, the video engines, JPEG
and optical flow; the GPU's own samples of each; how deep its sample buffers are; and
what each read costs.

Runs three CUDA processes alone on the GPU, one at a time and then together: compute-bound
(bf16 matrix products), memory-bound (device-to-device copies of 2 GiB) and idle. For
each, it reads the per-process samples every 0.5 s through both calls NVML has,
`nvmlDeviceGetProcessUtilization` (smUtil, memUtil, encUtil, decUtil) and, where the
driver has it (R550 and newer), `nvmlDeviceGetProcessesUtilizationInfo` (those and
jpgUtil, ofaUtil), beside the GPU's own samples (`nvmlDeviceGetSamples` with
NVML_GPU, MEMORY, ENC, DEC, JPG and OFA_UTILIZATION_SAMPLES). Then: how many samples each
buffer holds and over how long (asked since 0), how NVML says a GPU has no encoder
(`nvmlDeviceGetEncoderCapacity`, `nvmlDeviceGetEncoderUtilization`) and what engines each
GPU-instance profile holds (`nvmlDeviceGetGpuInstanceProfileInfo`, read-only: no MIG
setting is touched), and the CPU time of each call, the mean of 200.

Run as root, with PyTorch and CUDA, from the repository root:

    python3 bench/gpu_engine_figures.py [--seconds 6] [--out bench/results/h200-engine-figures.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.cuda_workloads import require_gpu, start_workload
from testkit.report import publish

FIGURES_V1 = ("smUtil", "memUtil", "encUtil", "decUtil")
FIGURES_V2 = (*FIGURES_V1, "jpgUtil", "ofaUtil")


def error_name(error: Exception) -> str:
    import pynvml  # noqa: PLC0415

    codes = {v: k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)}
    return str(codes.get(getattr(error, "value", -1), repr(error)))


def attempt(call: Callable[[], Any]) -> tuple[Any, str | None]:
    """The call's answer, or None and the NVML error's name."""
    import pynvml  # noqa: PLC0415

    try:
        return call(), None
    except pynvml.NVMLError as error:
        return None, error_name(error)
    except AttributeError as error:  # an nvidia-ml-py without the function
        return None, f"not in nvidia-ml-py ({error})"


def cpu_ms(call: Callable[[], Any], runs: int = 200) -> float:
    started = time.process_time()
    for _ in range(runs):
        attempt(call)
    return (time.process_time() - started) / runs * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_gpu()
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    gpu_types = {
        "GPU": pynvml.NVML_GPU_UTILIZATION_SAMPLES,
        "MEMORY": pynvml.NVML_MEMORY_UTILIZATION_SAMPLES,
        "ENC": pynvml.NVML_ENC_UTILIZATION_SAMPLES,
        "DEC": pynvml.NVML_DEC_UTILIZATION_SAMPLES,
        "JPG": getattr(pynvml, "NVML_JPG_UTILIZATION_SAMPLES", 8),
        "OFA": getattr(pynvml, "NVML_OFA_UTILIZATION_SAMPLES", 9),
    }
    lines = [
        f"GPU 0: {pynvml.nvmlDeviceGetName(handle)}, driver {pynvml.nvmlSystemGetDriverVersion()}, "
        f"NVML {pynvml.nvmlSystemGetNVMLVersion()}",
        "",
    ]

    def window(label: str, pids: dict[int, str]) -> None:
        """Read every 0.5 s for --seconds; per process, the mean and max of each figure seen."""
        seen_v1: dict[str, dict[str, list[int]]] = {name: {f: [] for f in FIGURES_V1} for name in pids.values()}
        seen_v2: dict[str, dict[str, list[int]]] = {name: {f: [] for f in FIGURES_V2} for name in pids.values()}
        gpu_seen: dict[str, list[float]] = {kind: [] for kind in gpu_types}
        errors: dict[str, str] = {}
        since = int(time.time() * 1e6) - 1_000_000
        gpu_since = dict.fromkeys(gpu_types, since)
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = int(time.time() * 1e6)
            for function, figures, seen in (
                (pynvml.nvmlDeviceGetProcessUtilization, FIGURES_V1, seen_v1),
                (pynvml.nvmlDeviceGetProcessesUtilizationInfo, FIGURES_V2, seen_v2),
            ):
                got, err = attempt(partial(function, handle, since))
                if err:
                    errors.setdefault(function.__name__, err)
                for sample in got or ():
                    if sample.pid in pids:
                        for f in figures:
                            seen[pids[sample.pid]][f].append(int(getattr(sample, f)))
            for kind, sampling in gpu_types.items():
                got, err = attempt(partial(pynvml.nvmlDeviceGetSamples, handle, sampling, gpu_since[kind]))
                if err:
                    errors.setdefault(f"nvmlDeviceGetSamples({kind})", err)
                    continue
                for sample in got[1]:
                    gpu_seen[kind].append(float(sample.sampleValue.uiVal))
                    gpu_since[kind] = max(gpu_since[kind], int(sample.timeStamp))
            since = now - 500_000

        def summary(values: list[int] | list[float]) -> str:
            return f"{statistics.mean(values):.1f} / {max(values):.0f} ({len(values)})" if values else "none"

        lines.extend([f"### {label}", "", "Per process, percent: mean / max (samples seen).", ""])
        lines.append("| process | call | " + " | ".join(FIGURES_V2) + " |")
        lines.append("|---|---|" + "---|" * len(FIGURES_V2))
        for name in pids.values():
            row1 = [summary(seen_v1[name][f]) for f in FIGURES_V1] + ["-", "-"]
            lines.append(f"| {name} | v1 | " + " | ".join(row1) + " |")
            row2 = [summary(seen_v2[name][f]) for f in FIGURES_V2]
            lines.append(f"| {name} | v2 | " + " | ".join(row2) + " |")
        lines.extend(
            [
                "",
                "The GPU's own samples, percent: "
                + "; ".join(f"{kind} {summary(values)}" for kind, values in gpu_seen.items()),
                "",
            ]
        )
        if errors:
            lines.extend(["Errors: " + "; ".join(f"{call}: {err}" for call, err in errors.items()), ""])

    modes = {"compute (bf16 matmul)": "busy", "memory (2 GiB copies)": "copy", "idle": "idle"}
    started = {}
    try:
        for label, mode in modes.items():
            process = start_workload(mode, 0.5)
            started[label] = process
            time.sleep(2)
            window(f"{label}, alone", {process.pid: label})
            process.terminate()
            process.wait(10)
        together = {label: start_workload(mode, 0.5) for label, mode in modes.items()}
        started.update(together)
        time.sleep(2)
        window("the three together", {p.pid: label for label, p in together.items()})

        lines.extend(
            ["### Sample buffers (asked since 0)", "", "| buffer | samples | span | spacing |", "|---|---|---|---|"]
        )
        for kind, sampling in gpu_types.items():
            got, err = attempt(partial(pynvml.nvmlDeviceGetSamples, handle, sampling, 0))
            if err:
                lines.append(f"| {kind} | {err} | | |")
                continue
            stamps = sorted(int(s.timeStamp) for s in got[1])
            span = (stamps[-1] - stamps[0]) / 1e6 if len(stamps) > 1 else 0.0
            spacing = span / (len(stamps) - 1) * 1000 if len(stamps) > 1 else 0.0
            lines.append(f"| {kind} | {len(stamps)} | {span:.2f} s | {spacing:.0f} ms |")
        for function in ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo"):
            got, err = attempt(partial(getattr(pynvml, function), handle, 0))
            if err:
                lines.append(f"| {function} | {err} | | |")
                continue
            per_pid: dict[int, int] = {}
            for sample in got:
                per_pid[int(sample.pid)] = per_pid.get(int(sample.pid), 0) + 1
            stamps = sorted(int(s.timeStamp) for s in got)
            span = (stamps[-1] - stamps[0]) / 1e6 if len(stamps) > 1 else 0.0
            lines.append(f"| {function} | {len(got)} ({sorted(per_pid.values())} per process) | {span:.2f} s | |")

        lines.extend(["", "### How NVML says a GPU has no video engine", ""])
        engine_calls: dict[str, Callable[[], Any]] = {
            "nvmlDeviceGetEncoderCapacity(H264)": lambda: pynvml.nvmlDeviceGetEncoderCapacity(
                handle, pynvml.NVML_ENCODER_QUERY_H264
            ),
            "nvmlDeviceGetEncoderUtilization": lambda: pynvml.nvmlDeviceGetEncoderUtilization(handle),
            "nvmlDeviceGetDecoderUtilization": lambda: pynvml.nvmlDeviceGetDecoderUtilization(handle),
            "nvmlDeviceGetJpgUtilization": lambda: pynvml.nvmlDeviceGetJpgUtilization(handle),
            "nvmlDeviceGetOfaUtilization": lambda: pynvml.nvmlDeviceGetOfaUtilization(handle),
            "nvmlDeviceGetEncoderSessions": lambda: len(pynvml.nvmlDeviceGetEncoderSessions(handle)),
        }
        for name, call in engine_calls.items():
            value, err = attempt(call)
            lines.append(f"- `{name}`: {err or value}")
        mode, err = attempt(lambda: pynvml.nvmlDeviceGetMigMode(handle))
        lines.extend(
            [
                "",
                f"The engines each GPU-instance profile holds (`nvmlDeviceGetGpuInstanceProfileInfo`, v2), "
                f"MIG mode (current, pending) {err or mode}:",
                "",
                "| profile | id | name | slices | SMs | decoders | encoders | JPEG | OFA |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
        )
        for profile in range(getattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12)):
            info, err = attempt(partial(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile))
            if err:
                lines.append(f"| {profile} | {err} | | | | | | | |")
                continue
            name = info.name.decode() if isinstance(info.name, bytes) else info.name
            lines.append(
                f"| {profile} | {info.id} | {name} | {info.sliceCount} | {info.multiprocessorCount} | "
                f"{info.decoderCount} | {info.encoderCount} | {info.jpegCount} | {info.ofaCount} |"
            )

        lines.extend(["", "### CPU per call, three processes running (mean of 200)", ""])
        since = int(time.time() * 1e6) - 2_000_000
        costs: dict[str, Callable[[], Any]] = {
            "nvmlDeviceGetProcessUtilization": lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, since),
            "nvmlDeviceGetProcessesUtilizationInfo": lambda: pynvml.nvmlDeviceGetProcessesUtilizationInfo(
                handle, since
            ),
            **{
                f"nvmlDeviceGetSamples({kind})": partial(pynvml.nvmlDeviceGetSamples, handle, sampling, since)
                for kind, sampling in gpu_types.items()
            },
            "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle),
            "nvmlDeviceGetDecoderUtilization": lambda: pynvml.nvmlDeviceGetDecoderUtilization(handle),
            "nvmlDeviceGetGpuInstanceProfileInfo(7 slices)": lambda: pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
                handle, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE
            ),
        }
        for name, cost in costs.items():
            lines.append(f"- `{name}`: {cpu_ms(cost):.2f} ms")
    finally:
        for process in started.values():
            if process.poll() is None:
                process.terminate()
        pynvml.nvmlShutdown()
    publish("Per-process engine figures on the H200", lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
