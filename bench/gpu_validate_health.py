"""Each GPU's health and GPM efficiency on a real GPU, through the pod harness, and what they cost.

Run as root on a GPU node from the repository root, with the rendered manifest
(bench/README.md says what the GPU scripts need):

    helm template otel-vgpu charts/otel-vgpu --namespace otel-vgpu > chart-defaults.yaml
    python3 bench/gpu_validate_health.py --pod chart-defaults.yaml --before DIR [--out results.md]

`--part proof` (and `all`): the agent as the chart's default render runs it (testkit/pod_harness.py).
- Health: at one moment, a scrape and `nvidia-smi --query-gpu` (and `nvidia-smi -q -d PCIE`
  for the replay counter): clocks, temperatures, power and its limit, ECC counts, remapped
  rows, the clock event reasons, each against the other.
- GPM: a pod running bf16 matrix products alone on GPU 0 (tensor active above 0.8, and its
  pod-level figure the GPU's); then a pod copying device memory alone (DRAM above 0.7); then
  both: the GPU's figures published, the pods' left out, a shared window counted, and the
  estimate the recording rule would make (deploy/prometheus-rules.yaml) from the same scrapes.

`--part cost` (and `all`): the CPU of the agent before these families (`--before`: a directory
holding that version's `otel_vgpu`) and now, each as the chart runs it, with `--processes`
CUDA processes in pods on GPU 0, each agent sweeping on its own clock and scraped every 15 s,
alternately, `--rounds` times each, over `--cost-seconds` each time. Nothing on the GPU is
reconfigured and no fault is injected.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import wait_serving
from testkit.cpu_compare import add_arguments as add_cost_arguments
from testkit.cpu_compare import before_and_now
from testkit.cuda_workloads import nvml_truth, require_gpu
from testkit.gpu_node import AGENT_PORT, NODE, POD_RESOURCES_DIR, Doubles, pod_harness
from testkit.host_pods import HostPod, start_in, stop_pods
from testkit.report import Report, Samples, scrape

URL = f"http://127.0.0.1:{AGENT_PORT}"
SCRAPE_EVERY_S = 15.0
# nvidia-smi's field for each health family, and how far the two may be apart, read a moment
# apart: clocks and power move with the load, counters and limits must be equal.
SMI = {
    "clocks.sm": ("vgpu_gpu_sm_clock_hertz", 1e-6, 0.10),
    "clocks.mem": ("vgpu_gpu_memory_clock_hertz", 1e-6, 0.0),
    "temperature.gpu": ("vgpu_gpu_temperature_celsius", 1.0, 3.0),
    "temperature.memory": ("vgpu_gpu_memory_temperature_celsius", 1.0, 3.0),
    "power.draw": ("vgpu_gpu_power_watts", 1.0, 0.20),
    "enforced.power.limit": ("vgpu_gpu_power_limit_watts", 1.0, 0.0),
    "ecc.errors.corrected.volatile.total": ("vgpu_gpu_ecc_corrected_total", 1.0, 0.0),
    "ecc.errors.uncorrected.volatile.total": ("vgpu_gpu_ecc_uncorrected_total", 1.0, 0.0),
    "remapped_rows.correctable": ("vgpu_gpu_remapped_rows_correctable_total", 1.0, 0.0),
    "remapped_rows.uncorrectable": ("vgpu_gpu_remapped_rows_uncorrectable_total", 1.0, 0.0),
    "remapped_rows.pending": ("vgpu_gpu_remapped_rows_pending", 1.0, 0.0),
    "remapped_rows.failure": ("vgpu_gpu_remapped_rows_failure", 1.0, 0.0),
    "clocks_event_reasons.active": ("vgpu_gpu_clock_event_reasons", 1.0, 0.0),
}
# A relative tolerance below 1, an absolute one from 1 on (degrees); 0: equal.
RELATIVE = 1.0


def gpu0(samples: Samples, name: str) -> float | None:
    return next((v for labels, v in samples.get(name, []) if labels.get("gpu_id") == "0"), None)


def of_pods(samples: Samples, name: str) -> dict[str, float]:
    return {labels["pod"]: v for labels, v in samples.get(name, []) if labels.get("gpu_id") == "0"}


def smi_now() -> dict[str, float | None]:
    """nvidia-smi's figures of GPU 0 now; None where it prints [N/A]."""
    fields = list(SMI)
    line = subprocess.run(
        ["nvidia-smi", "-i", "0", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    out: dict[str, float | None] = {}
    for field, text in zip(fields, (v.strip() for v in line.split(",")), strict=True):
        if text in ("[N/A]", "N/A", "[Not Supported]"):
            out[field] = None
        elif text in ("Yes", "No"):
            out[field] = 1.0 if text == "Yes" else 0.0
        else:
            out[field] = float(int(text, 16)) if text.startswith("0x") else float(text)
    query = subprocess.run(["nvidia-smi", "-i", "0", "-q", "-d", "PCIE"], capture_output=True, text=True, check=False)
    replays = re.search(r"Replays Since Reset\s*:\s*(\d+)", query.stdout)
    out["replays"] = float(replays.group(1)) if replays else None
    return out


def health_checks(report: Report, samples: Samples, smi: dict[str, float | None]) -> None:
    report.lines += ["| nvidia-smi field | nvidia-smi | the agent | |", "|---|---|---|---|"]
    for field, (family, scale, tolerance) in SMI.items():
        theirs, ours = smi[field], gpu0(samples, family)
        ours_shown = None if ours is None else ours * scale
        if theirs is None:
            ok, why = ours is None, "both absent" if ours is None else "absent in nvidia-smi only"
        elif ours_shown is None:
            ok, why = False, "the agent has none"
        elif tolerance == 0:
            ok, why = ours_shown == theirs, "equal"
        elif tolerance < RELATIVE:
            ok, why = abs(ours_shown - theirs) <= tolerance * max(abs(theirs), 1.0), f"within {tolerance:.0%}"
        else:
            ok, why = abs(ours_shown - theirs) <= tolerance, f"within {tolerance:g}"
        report.lines.append(f"| {field} | {theirs} | {ours_shown} | {'ok' if ok else 'FAIL'} ({why}) |")
        if not ok:
            report.failures.append(f"{field}: nvidia-smi {theirs}, the agent {ours_shown}")
    replays = gpu0(samples, "vgpu_gpu_pcie_replays_total")
    report.lines.append("")
    if smi["replays"] is None:
        report.lines += [f"PCIe replays: nvidia-smi -q shows no replay counter; the agent {replays}", ""]
    else:
        report.check(replays == smi["replays"], f"PCIe replays: nvidia-smi -q {smi['replays']}, the agent {replays}")
        report.lines.append("")


def wait_for(what: str, test: Callable[[Samples], bool], timeout: float = 90.0) -> Samples:
    """Scrapes until `test(samples)` holds (a GPM window has to close)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(f"{URL}/metrics")
        if test(samples):
            return samples
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout:g} s")
        time.sleep(1.0)


FAMILY = {
    "tensor": "tensor_active",
    "dram": "dram_active",
    "sm": "sm_active",
    "sm_occupancy": "sm_occupancy",
    "sm_utilization": "sm_utilization",
}


def gpm_line(samples: Samples, gpu: tuple[str, ...], pod: tuple[str, ...]) -> str:
    """The GPU's figures (and the pods' where given) of one scrape, for the report."""

    def shown(value: float | None) -> str:
        return "absent" if value is None else f"{value:.3f}"

    text = "GPU: " + ", ".join(f"{f} {shown(gpu0(samples, f'vgpu_gpu_{FAMILY[f]}_ratio'))}" for f in gpu)
    for figure in pod:
        pods = of_pods(samples, f"vgpu_pod_{FAMILY[figure]}_ratio")
        text += f"; the pods' {figure}: " + (", ".join(f"{p} {v:.3f}" for p, v in sorted(pods.items())) or "none")
    return text


def held(samples: Samples) -> str:
    """What each pod holds and uses of GPU 0 in a scrape: memory and SM, as the pods' rows say."""
    memory = of_pods(samples, "vgpu_pod_memory_used_bytes")
    sm = of_pods(samples, "vgpu_pod_sm_utilization_ratio")
    return "The pods' memory and SM: " + ", ".join(
        f"{pod} {memory[pod] / 2**30:.2f} GiB, SM {sm.get(pod, float('nan')):.3f}" for pod in sorted(memory)
    )


def window_mark(samples: Samples) -> float:
    """What moves at every GPM window's close under load: the tensor and DRAM busy seconds."""
    return sum(gpu0(samples, f"vgpu_gpu_{f}_busy_seconds_total") or 0.0 for f in ("tensor", "dram"))


def next_window(what: str, after: Samples) -> Samples:
    """The first scrape after the GPM window that follows `after`'s: one the pods ran through whole."""
    closed = window_mark(after)
    return wait_for(what, lambda s: window_mark(s) != closed)


def consistent_health(report: Report) -> None:
    """Health against nvidia-smi: a scrape and nvidia-smi a moment apart, again (three times at
    most) where a figure that moves with the load moved between the two."""
    # The health figures serve from the health reader's first round, which follows the first
    # sweep (a quarter of a second at most): the agent answers before it.
    asked = time.monotonic()
    wait_for("the health figures", lambda s: "vgpu_gpu_temperature_celsius" in s, timeout=10)
    report.lines += [f"The health figures served {time.monotonic() - asked:.2f} s after the agent answered.", ""]
    for attempt in range(3):
        trial = Report()
        samples = scrape(f"{URL}/metrics")
        health_checks(trial, samples, smi_now())
        if not trial.failures or attempt == 2:
            report.lines += trial.lines
            report.failures += trial.failures
            return


def proof(args: argparse.Namespace, cluster: Doubles, tmp: Path, report: Report) -> None:
    lines, check = report.lines, report.check
    _, _, model, gpu_uuid, driver = nvml_truth()
    matmul = HostPod("ml", "matmul-0", "systemd", "guaranteed")
    copier = HostPod("data", "copy-0", "systemd", "burstable")
    again = HostPod("ml", "matmul-1", "systemd", "guaranteed")
    cluster.kubelet.allocatable = {"nvidia.com/gpu": [f"{gpu_uuid}::{n}" for n in range(3)]}
    pods = [matmul, copier, again]
    agent = pod_harness(args.pod, tmp / "proof", cluster, NODE)
    try:
        wait_serving(URL, agent.start(), agent.log.read_text, timeout=60)
        lines += [f"GPU: {model}, driver {driver}; the agent as `{args.pod.name}` runs it (pod harness)", ""]
        # Health, at one moment, idle but for the driver.
        lines += ["### Health, against nvidia-smi read at the same moment", ""]
        consistent_health(report)

        lines += ["### GPM: a bf16 matrix-product pod alone", ""]
        start_in(matmul, ["busy"], 2.0)
        cluster.add(matmul, {"main": [f"{gpu_uuid}::0"]})
        first_alone = wait_for(
            "the matmul pod alone", lambda s: "matmul-0" in of_pods(s, "vgpu_pod_tensor_active_ratio")
        )
        alone = next_window("a whole window of the matmul pod alone", first_alone)
        tensor, pod_tensor = gpu0(alone, "vgpu_gpu_tensor_active_ratio"), of_pods(alone, "vgpu_pod_tensor_active_ratio")
        lines += [gpm_line(alone, ("tensor", "dram", "sm", "sm_occupancy", "sm_utilization"), ("tensor",)), ""]
        lines += [held(alone), ""]
        check(tensor is not None and tensor > 0.8, f"the GPU's tensor active above 0.8 ({tensor})")
        check(pod_tensor.get("matmul-0") == tensor, "the pod-level figure is the GPU's, the pod being alone")
        lines += ["Health under load:", ""]
        consistent_health(report)

        lines += ["### GPM: a device-to-device copy pod alone", ""]
        start_in(copier, ["copy"], 2.0)
        cluster.add(copier, {"main": [f"{gpu_uuid}::1"]})
        stop_pods([matmul])
        first_copy = wait_for("the copy pod alone", lambda s: "copy-0" in of_pods(s, "vgpu_pod_dram_active_ratio"))
        copy = next_window("a whole window of the copy pod alone", first_copy)
        dram = gpu0(copy, "vgpu_gpu_dram_active_ratio")
        lines += [gpm_line(copy, ("dram", "tensor", "sm"), ("dram",)), ""]
        lines += [held(copy), ""]
        check(dram is not None and dram > 0.7, f"the GPU's DRAM active above 0.7 ({dram})")

        lines += ["### GPM: both together", ""]
        shared_before = gpu0(copy, "vgpu_gpu_gpm_shared_windows_total") or 0.0
        start_in(again, ["busy"], 2.0)
        cluster.add(again, {"main": [f"{gpu_uuid}::2"]})
        first = wait_for(
            "a shared window", lambda s: (gpu0(s, "vgpu_gpu_gpm_shared_windows_total") or 0.0) > shared_before
        )
        both = wait_for(
            "a second shared window",
            lambda s: (
                (gpu0(s, "vgpu_gpu_gpm_shared_windows_total") or 0.0)
                > (gpu0(first, "vgpu_gpu_gpm_shared_windows_total") or 0.0)
            ),
        )
        gpu_tensor, gpu_dram = gpu0(both, "vgpu_gpu_tensor_active_ratio"), gpu0(both, "vgpu_gpu_dram_active_ratio")
        check(
            gpu_tensor is not None and gpu_dram is not None,
            f"the GPU's figures published: tensor {gpu_tensor}, DRAM {gpu_dram}",
        )
        check(
            not of_pods(both, "vgpu_pod_tensor_active_ratio") and not of_pods(both, "vgpu_pod_dram_active_ratio"),
            "no pod-level GPM figure while the GPU is shared",
        )
        # The estimate rule: the GPU's figure split by each pod's share of the SM-busy seconds
        # over the same interval (deploy/prometheus-rules.yaml; promtool tests it on these values).
        busy = [of_pods(s, "vgpu_pod_sm_busy_seconds_total") for s in (first, both)]
        increase = {pod: busy[1][pod] - busy[0].get(pod, 0.0) for pod in busy[1]}
        total = sum(increase.values()) or 1.0
        estimate = {pod: (gpu_tensor or 0.0) * rise / total for pod, rise in increase.items()}
        lines += [
            gpm_line(both, ("tensor", "dram", "sm"), ("sm_utilization",))
            + ". SM-busy seconds over the window, per pod: "
            + ", ".join(f"{pod} {rise:.2f}" for pod, rise in sorted(increase.items())),
            "",
            "The estimate rule's split of the GPU's tensor figure: "
            + ", ".join(f"{pod} {value:.3f}" for pod, value in sorted(estimate.items())),
            "",
        ]
        check(abs(sum(estimate.values()) - (gpu_tensor or 0.0)) < 1e-9, "the estimates add up to the GPU's figure")
        lines += [held(both), ""]
        # NVML's own per-process view at the same time, beside the pods' SM figures above.
        pmon = subprocess.run(["nvidia-smi", "pmon", "-c", "1", "-s", "u"], capture_output=True, text=True, check=False)
        lines += [
            "`nvidia-smi pmon -c 1 -s u` just after:",
            "",
            *(f"    {line}" for line in pmon.stdout.splitlines()),
            "",
        ]
        readers(report, both)
    finally:
        log = agent.stop()
        stop_pods(pods)
        errors = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
        lines += ["", f"agent log: {len(log.splitlines())} lines, {len(errors)} errors", ""]
        lines += [f"    {line}" for line in errors[:5]]


def readers(report: Report, samples: Samples) -> None:
    """Each reader's last pass as the agent served it (vgpu_agent_reader_*): the GPU's readers
    (sweep, health, GPM) all succeeded, each taking what it took on this GPU."""
    duration = {labels["reader"]: value for labels, value in samples.get("vgpu_agent_reader_duration_seconds", [])}
    success = {labels["reader"]: value for labels, value in samples.get("vgpu_agent_reader_success", [])}
    report.lines += ["### Each reader's last pass", "", "| reader | seconds | success |", "|---|---|---|"]
    report.lines += [f"| {r} | {duration.get(r, 0.0):.4f} | {success.get(r)} |" for r in sorted(success)]
    report.lines.append("")
    for reader in ("sweep", "health", "gpm"):
        report.check(success.get(reader) == 1.0, f"the {reader} reader's last pass succeeded")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pod", type=Path, required=True, metavar="MANIFEST")
    parser.add_argument("--part", choices=("proof", "cost", "all"), default="all")
    add_cost_arguments(parser, seconds=30.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.part != "proof" and (args.before is None or not (args.before / "otel_vgpu").is_dir()):
        parser.error("--part cost and all need --before DIR, a directory holding the earlier otel_vgpu package")
    require_gpu()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-health-", dir="/var/tmp"))
    cluster = Doubles(tmp, NODE, pki=True, socket_dir=POD_RESOURCES_DIR)
    report = Report()
    try:
        if args.part in ("proof", "all"):
            try:
                proof(args, cluster, tmp, report)
            except SystemExit as stopped:  # a wait that ran out: said, and the cost still measured
                report.check(False, str(stopped))
        if args.part in ("cost", "all"):
            spent = before_and_now(args, cluster, tmp, deployed_as="the chart's default render")
            report.lines += ["### What it costs", "", *spent.lines]
            report.failures += spent.failures
    finally:
        cluster.stop()
    return report.finish("Each GPU's health and GPM efficiency, on a real GPU", args.out)


if __name__ == "__main__":
    raise SystemExit(main())
