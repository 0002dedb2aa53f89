"""A GPU's memory adds up on a real GPU: the agent's used, reserved, pods and unattributed
against nvidia-smi and NVML's own figures.

Run as root on a GPU node from the repository root, with the rendered manifest (bench/README.md
says what the GPU scripts need):

    helm template otel-vgpu charts/otel-vgpu --namespace otel-vgpu > chart-defaults.yaml
    python3 bench/gpu_validate_memory.py --pod chart-defaults.yaml --out bench/results/h200-memory-identity.md

Two pods on the first GPU, as the agent sees them through the pod harness (testkit/pod_harness.py):
one busy with matrix products, one idle, each a PyTorch process holding memory in a kubelet-shaped
cgroup; and one process of no pod, left in the script's own cgroup (the host's). Once they hold
their memory, the agent is scraped `--scrapes` times `--every` seconds apart, and beside each
scrape nvidia-smi (`--query-gpu=memory.used,memory.reserved`) and NVML (v1 and v2 memory, the
process listings) are read. On every GPU, on every scrape whose NVML figures did not move since
the one before (the agent's sweep in between saw them too), it checks:

- the agent's vgpu_gpu_memory_used_bytes is NVML's v1 used, to the byte (nvml.h's nvmlMemory_t:
  "Sum of Reserved and Allocated device memory");
- vgpu_gpu_memory_reserved_bytes is NVML's v2 reserved to the byte, and nvidia-smi's
  memory.reserved within 1 MiB (nvidia-smi prints whole MiB);
- used less reserved is nvidia-smi's memory.used within 1 MiB: nvidia-smi shows v2's used,
  "Allocated device memory", without the reservation;
- used = the pods' vgpu_pod_memory_used_bytes + vgpu_gpu_memory_unattributed_bytes + reserved,
  within `--tolerance-mib`;
- on the first GPU, each pod's memory is what NVML lists for its process, and the unattributed
  what it lists for the others.

The report also gives, per GPU, how much of NVML's v2 used no process listing holds. It exits
non-zero on any failed check.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.cuda_workloads import require_gpu, start_workload
from testkit.host_pods import HostPod, place, stop_pods
from testkit.report import Report, Samples, scrape

MIB = 1024**2
# nvidia-smi prints whole MiB: a figure it shows is within this of NVML's bytes.
SMI_ROUNDING = MIB


@dataclass(frozen=True)
class NvmlMemory:
    """One GPU's memory as NVML gives it to root, in bytes."""

    index: int
    uuid: str
    model: str
    v1_used: int
    v2_used: int | None
    reserved: int | None
    """v2's figures; None where the driver or nvidia-ml-py has no nvmlDeviceGetMemoryInfo_v2."""
    listed: dict[int, int]
    """usedGpuMemory by PID, the compute and graphics listings merged."""

    @property
    def key(self) -> tuple[int, int | None, tuple[tuple[int, int], ...]]:
        return self.v1_used, self.reserved, tuple(sorted(self.listed.items()))


def nvml_memory() -> list[NvmlMemory]:
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    try:
        out = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            except (pynvml.NVMLError, AttributeError, TypeError):
                v2 = None
            listed: dict[int, int] = {}
            for listing in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
                for process in listing(handle):
                    listed[int(process.pid)] = int(process.usedGpuMemory or 0)
            name = pynvml.nvmlDeviceGetName(handle)
            out.append(
                NvmlMemory(
                    index=index,
                    uuid=str(pynvml.nvmlDeviceGetUUID(handle)),
                    model=name.decode() if isinstance(name, bytes) else str(name),
                    v1_used=int(v1.used),
                    v2_used=None if v2 is None else int(v2.used),
                    reserved=None if v2 is None else int(v2.reserved),
                    listed=listed,
                )
            )
        return out
    finally:
        pynvml.nvmlShutdown()


def driver_version() -> str:
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    finally:
        pynvml.nvmlShutdown()


def smi() -> dict[str, tuple[float, float | None]]:
    """nvidia-smi's memory.used and memory.reserved by GPU UUID, in MiB as it prints them; None
    where it prints no reservation ([N/A], a driver without v2)."""
    text = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,memory.used,memory.reserved", "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    out = {}
    for line in text.strip().splitlines():
        uuid, used, reserved = (field.strip() for field in line.split(","))
        out[uuid] = (float(used), None if reserved.startswith("[") else float(reserved))
    return out


@dataclass(frozen=True)
class Agent:
    """One GPU's memory families in a scrape, in bytes."""

    used: float | None
    reserved: float | None
    unattributed: float | None
    pods: dict[str, float]
    """vgpu_pod_memory_used_bytes by namespace/pod."""


def agent_figures(samples: Samples, uuid: str) -> Agent:
    def gpu(name: str) -> float | None:
        return next((v for labels, v in samples.get(name, []) if labels.get("gpu_uuid") == uuid), None)

    pods: dict[str, float] = {}
    for labels, value in samples.get("vgpu_pod_memory_used_bytes", []):
        if labels.get("gpu_uuid") == uuid:
            pod = f"{labels['namespace']}/{labels['pod']}"
            pods[pod] = pods.get(pod, 0.0) + value
    return Agent(
        gpu("vgpu_gpu_memory_used_bytes"),
        gpu("vgpu_gpu_memory_reserved_bytes"),
        gpu("vgpu_gpu_memory_unattributed_bytes"),
        pods,
    )


@dataclass(frozen=True)
class Reading:
    at: float
    agent: dict[str, Agent]
    nvml: list[NvmlMemory]
    smi: dict[str, tuple[float, float | None]]
    steady: bool
    """NVML's figures of every GPU are those of the reading before: the agent's sweep in between saw them."""


def mib(value: float | None) -> str:
    return "none" if value is None else f"{value / MIB:.4f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pod", type=Path, required=True, metavar="MANIFEST", help="the rendered DaemonSet to run")
    parser.add_argument("--out", type=Path, help="also write the report (Markdown) here")
    parser.add_argument("--scrapes", type=int, default=6)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between scrapes (above the sweep interval)")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds from the agent's start to the first look")
    parser.add_argument(
        "--tolerance-mib", type=float, default=1.0, help="how far used may be from pods + unattributed + reserved"
    )
    args = parser.parse_args()
    require_gpu()
    # Imported once the arguments are read: they need the agent's dependencies, --help none.
    from testkit.agent import wait_serving  # noqa: PLC0415
    from testkit.gpu_node import AGENT_PORT, NODE, POD_RESOURCES_DIR, REPLICAS, Doubles, pod_harness  # noqa: PLC0415

    report = Report()
    lines, check = report.lines, report.check
    trainer = HostPod("ml", "trainer-0", "systemd", "burstable")
    cache = HostPod("web", "cache-0", "cgroupfs", "besteffort")
    pods = [trainer, cache]
    tmp = Path(tempfile.mkdtemp(prefix="gpu-memory-", dir="/var/tmp"))
    idle = nvml_memory()
    idle_smi = smi()
    cluster = Doubles(tmp, NODE, pki=True, socket_dir=POD_RESOURCES_DIR)
    harness = None
    outside = None
    readings: list[Reading] = []
    try:
        # Started before the agent and moved into their pods' cgroups at once: the agent's first
        # sweep finds each where it stays. On NVML's GPU 0 by its UUID, whatever CUDA's order.
        gpu0 = idle[0].uuid
        on_gpu0 = {"CUDA_VISIBLE_DEVICES": gpu0}
        place(trainer, start_workload("busy", 3.0, on_gpu0))
        place(cache, start_workload("idle", 2.0, on_gpu0))
        outside = start_workload("idle", 1.0, on_gpu0)  # in no kubelet cgroup: a process of no pod
        cluster.kubelet.allocatable = {"nvidia.com/gpu": [f"{gpu0}::{n}" for n in range(REPLICAS)]}
        for n, pod in enumerate(pods):
            cluster.add(pod, {"main": [f"{gpu0}::{n}"]})
        harness = pod_harness(args.pod, tmp / "pod", cluster, NODE)
        url = f"http://127.0.0.1:{AGENT_PORT}"
        wait_serving(url, harness.start(), harness.log.read_text, timeout=60)
        time.sleep(args.settle)
        previous = nvml_memory()
        for _ in range(args.scrapes):
            time.sleep(args.every)
            before = nvml_memory()
            samples = scrape(f"{url}/metrics")
            after = nvml_memory()
            figures = smi()
            still = [g.key for g in previous] == [g.key for g in before] == [g.key for g in after]
            served = {gpu.uuid: agent_figures(samples, gpu.uuid) for gpu in after}
            readings.append(Reading(time.monotonic(), served, after, figures, still))
            previous = after
    finally:
        if harness is not None:
            harness.stop()
        stop_pods(pods, [outside] if outside is not None else [])
        cluster.stop()

    in_pods = {pod.name: {process.pid for process in pod.processes} for pod in pods}
    pod_pids = set().union(*in_pods.values())
    lines += [
        f"GPU: {idle[0].model}, driver {driver_version()}; {len(idle)} GPU(s). The agent run by "
        f"testkit/pod_harness.py from {args.pod.name}; on GPU 0 the pods ml/trainer-0 (busy, 3 GiB held) and "
        "web/cache-0 (idle, 2 GiB), and a process of no pod (idle, 1 GiB); "
        f"{len(readings)} scrapes {args.every:g} s apart.",
        "",
        "Before the workloads, idle (MiB): NVML's v1 used, v2 used and reserved; nvidia-smi's memory.used and "
        "memory.reserved.",
        "",
        "| GPU | v1 used | v2 used | v2 reserved | nvidia-smi used | nvidia-smi reserved |",
        "|---|---|---|---|---|---|",
        *(
            f"| {g.index} | {mib(g.v1_used)} | {mib(g.v2_used)} | {mib(g.reserved)} | "
            f"{idle_smi[g.uuid][0]:g} | {idle_smi[g.uuid][1]} |"
            for g in idle
        ),
        "",
        "Each scrape (MiB): the agent's used, reserved, the pods' sum, unattributed, and what is left of used "
        "after those three; nvidia-smi's used and reserved at the scrape; NVML's v2 used less what its process "
        "listings hold (memory no listed process holds).",
        "",
        "| scrape | GPU | used | reserved | pods | unattributed | used - (pods + unattributed + reserved) | "
        "nvidia-smi used | nvidia-smi reserved | v2 used - listed | NVML steady |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, reading in enumerate(readings):
        for gpu in reading.nvml:
            agent = reading.agent[gpu.uuid]
            parts = sum(agent.pods.values()) + (agent.unattributed or 0.0) + (agent.reserved or 0.0)
            left = None if agent.used is None else agent.used - parts
            unlisted = None if gpu.v2_used is None else gpu.v2_used - sum(gpu.listed.values())
            smi_used, smi_reserved = reading.smi[gpu.uuid]
            lines.append(
                f"| {n} | {gpu.index} | {mib(agent.used)} | {mib(agent.reserved)} | {mib(sum(agent.pods.values()))} | "
                f"{mib(agent.unattributed)} | {mib(left)} | {smi_used:g} | {smi_reserved} | {mib(unlisted)} | "
                f"{'yes' if reading.steady else 'no'} |"
            )
    lines += ["", "| check | what |", "|---|---|"]
    steady = [r for r in readings if r.steady]
    check(bool(steady), f"NVML's figures held still over {len(steady)} of {len(readings)} scrapes (those checked)")
    tolerance = args.tolerance_mib * MIB
    for n, reading in enumerate(steady):
        for gpu in reading.nvml:
            agent = reading.agent[gpu.uuid]
            smi_used, smi_reserved = reading.smi[gpu.uuid]
            on = f"scrape {readings.index(reading)}, GPU {gpu.index}"
            check(agent.used == gpu.v1_used, f"{on}: used {agent.used} == NVML's v1 used {gpu.v1_used}")
            if gpu.reserved is None:
                check(agent.reserved is None, f"{on}: no reserved series where NVML has no v2 ({agent.reserved})")
                check(
                    agent.used is not None and abs(agent.used - smi_used * MIB) <= SMI_ROUNDING,
                    f"{on}: used {mib(agent.used)} MiB is nvidia-smi's memory.used {smi_used:g} within 1 MiB",
                )
            else:
                check(agent.reserved == gpu.reserved, f"{on}: reserved {agent.reserved} == NVML's v2 {gpu.reserved}")
                check(
                    agent.reserved is not None
                    and smi_reserved is not None
                    and abs(agent.reserved - smi_reserved * MIB) <= SMI_ROUNDING,
                    f"{on}: reserved {mib(agent.reserved)} MiB is nvidia-smi's memory.reserved {smi_reserved} "
                    "within 1 MiB",
                )
                allocated = None if agent.used is None or agent.reserved is None else agent.used - agent.reserved
                check(
                    allocated is not None and abs(allocated - smi_used * MIB) <= SMI_ROUNDING,
                    f"{on}: used less reserved {mib(allocated)} MiB is nvidia-smi's memory.used {smi_used:g} "
                    "within 1 MiB",
                )
            parts = sum(agent.pods.values()) + (agent.unattributed or 0.0) + (agent.reserved or 0.0)
            check(
                agent.used is not None and abs(agent.used - parts) <= tolerance,
                f"{on}: used {mib(agent.used)} MiB == pods {mib(sum(agent.pods.values()))} + unattributed "
                f"{mib(agent.unattributed)} + reserved {mib(agent.reserved)} (= {mib(parts)}) within "
                f"{args.tolerance_mib:g} MiB",
            )
        if n == 0:
            gpu = reading.nvml[0]
            agent = reading.agent[gpu.uuid]
            for pod in pods:
                truth = sum(gpu.listed.get(pid, 0) for pid in in_pods[pod.name])
                got = agent.pods.get(f"{pod.namespace}/{pod.name}")
                check(
                    got == truth, f"GPU 0: {pod.namespace}/{pod.name}'s memory {got} == NVML's for its process {truth}"
                )
            outside_truth = sum(v for pid, v in gpu.listed.items() if pid not in pod_pids)
            check(
                agent.unattributed == outside_truth,
                f"GPU 0: unattributed {agent.unattributed} == NVML's for the processes of no pod {outside_truth}",
            )
    return report.finish("A GPU's memory adds up on a real GPU", args.out)


if __name__ == "__main__":
    raise SystemExit(main())
