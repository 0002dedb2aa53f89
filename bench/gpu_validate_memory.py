"""A GPU's memory adds up on a real GPU: the agent's used, reserved, pods, unattributed and
unlisted against nvidia-smi and NVML's own figures.

Run as root on a GPU node from the repository root, with the rendered manifest (bench/README.md
says what the GPU scripts need):

    helm template otel-vgpu charts/otel-vgpu --namespace otel-vgpu > chart-defaults.yaml
    python3 bench/gpu_validate_memory.py --pod chart-defaults.yaml --out bench/results/h200-memory-identity.md

Three PyTorch processes on the first GPU, started one at a time: the pods ml/trainer-0 (busy with
matrix products, 3 GiB held) and web/cache-0 (idle, 2 GiB), each in a kubelet-shaped cgroup, and a
process of no pod (idle, 1 GiB) left in the script's own cgroup (the host's). After each start
the script waits until NVML lists the process and the GPU's figures hold still, and notes what
of NVML's used no listing holds beside the reservation: on an H200 with driver 580.159.04, 8.8 MiB
with one process and 14.4 MiB with two, the driver's memory of each CUDA context. Then the agent
runs through the pod harness (testkit/pod_harness.py); once a scrape shows both pods' memory, it
is scraped `--scrapes` times `--every` seconds apart, and beside each scrape nvidia-smi
(`--query-gpu=memory.used,memory.reserved`, `--query-compute-apps=gpu_uuid,pid,used_memory`) and
NVML (v1 and v2 memory, the process listings) are read. On every GPU, on every scrape whose NVML
figures did not move since the one before (the agent's sweep in between saw them too), it
checks:

- vgpu_gpu_memory_used_bytes is NVML's v1 used to the byte (nvml.h's nvmlMemory_t: "Sum of
  Reserved and Allocated device memory"), and nvidia-smi's memory.used + memory.reserved within
  1 MiB for each (nvidia-smi prints whole MiB: 616 for 615.0625);
- vgpu_gpu_memory_reserved_bytes is NVML's v2 reserved to the byte, and nvidia-smi's
  memory.reserved within 1 MiB;
- each pod's vgpu_pod_memory_used_bytes is NVML's usedGpuMemory of its PIDs to the byte, and
  nvidia-smi's used_memory of them within 1 MiB a process; vgpu_gpu_memory_unattributed_bytes
  the same of the processes of no pod;
- vgpu_gpu_memory_unlisted_bytes is NVML's v1 used less v2 reserved less every listed process's
  memory (never below 0), at least 0 and at most 16 MiB a listed process;
- used = the pods' + unattributed + reserved + unlisted, within `--tolerance-mib`.

Without v2 (a driver before R510) the reserved and unlisted have no series, and used is
nvidia-smi's memory.used; in MIG mode the unlisted has no series and the sums are not checked
(the agent lists processes per MIG device). The report gives a table per GPU of every figure at
every scrape, and the unlisted per CUDA context. It exits non-zero on any failed check.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.cuda_workloads import require_gpu, start_workload
from testkit.host_pods import HostPod, place, stop_pods
from testkit.report import Report, Samples, scrape

MIB = 1024**2
# nvidia-smi prints whole MiB: a figure it shows is within this of NVML's bytes.
SMI_ROUNDING = MIB
# The most a CUDA context may hold beyond its listed memory before the figure is taken for wrong:
# twice what the H200 showed for the first of them (8.8 MiB).
MOST_UNLISTED_PER_PROCESS = 16 * MIB
# How long the GPU's figures must hold still for a process to count as settled on it.
STILL_S = 0.5


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
    mig: bool

    @property
    def key(self) -> tuple[int, int | None, tuple[tuple[int, int], ...]]:
        return self.v1_used, self.reserved, tuple(sorted(self.listed.items()))

    @property
    def unlisted(self) -> int | None:
        """v1's used less v2's reserved less every listed process's memory, as it is (not floored)."""
        return None if self.reserved is None else self.v1_used - self.reserved - sum(self.listed.values())


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
            try:
                mig = pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            except pynvml.NVMLError:
                mig = False
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
                    mig=mig,
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


def nvidia_smi(query: str) -> list[list[str]]:
    """nvidia-smi's CSV answer to `query` (`--query-gpu=...`), a row of fields a line, no units."""
    text = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"], check=True, capture_output=True, text=True
    ).stdout
    return [[field.strip() for field in line.split(",")] for line in text.strip().splitlines() if "," in line]


def mib_or_none(field: str) -> float | None:
    """A figure nvidia-smi printed, in MiB; None where it printed none ([N/A], [Not Supported])."""
    return None if field.startswith("[") else float(field)


def smi() -> dict[str, tuple[float | None, float | None]]:
    """nvidia-smi's memory.used and memory.reserved by GPU UUID, in MiB as it prints them; the
    reserved None where it prints none (a driver without v2)."""
    return {
        uuid: (mib_or_none(used), mib_or_none(reserved))
        for uuid, used, reserved in nvidia_smi("--query-gpu=uuid,memory.used,memory.reserved")
    }


def smi_apps() -> dict[str, dict[int, float | None]]:
    """nvidia-smi's used_memory of each compute process, by GPU UUID and PID, in MiB."""
    out: dict[str, dict[int, float | None]] = {}
    for uuid, pid, used in nvidia_smi("--query-compute-apps=gpu_uuid,pid,used_memory"):
        out.setdefault(uuid, {})[int(pid)] = mib_or_none(used)
    return out


@dataclass(frozen=True)
class Agent:
    """One GPU's memory families in a scrape, in bytes; None where the family has no series."""

    used: float | None
    reserved: float | None
    unattributed: float | None
    unlisted: float | None
    pods: dict[str, float]
    """vgpu_pod_memory_used_bytes by namespace/pod."""

    @property
    def pods_total(self) -> float:
        return sum(self.pods.values())

    @property
    def left(self) -> float | None:
        """used less the pods', unattributed, reserved and unlisted: what no family holds."""
        if self.used is None:
            return None
        parts = (self.unattributed, self.reserved, self.unlisted)
        return self.used - self.pods_total - sum(part or 0.0 for part in parts)


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
        gpu("vgpu_gpu_memory_unlisted_bytes"),
        pods,
    )


@dataclass(frozen=True)
class Reading:
    agent: dict[str, Agent]
    nvml: list[NvmlMemory]
    smi: dict[str, tuple[float | None, float | None]]
    apps: dict[str, dict[int, float | None]]
    steady: bool
    """NVML's figures of every GPU are those of the reading before: the agent's sweep in between saw them."""


def settled(uuid: str, pids: set[int]) -> Callable[[], NvmlMemory | None]:
    """A poll: the GPU's figures once NVML lists each of `pids` holding memory and they have held
    still for STILL_S (a process that printed ready has made its allocations, yet the listing
    and the used may lag it); None until then."""
    since: list[tuple[float, NvmlMemory]] = []

    def poll() -> NvmlMemory | None:
        gpu = next(g for g in nvml_memory() if g.uuid == uuid)
        now = time.monotonic()
        if not since or since[0][1].key != gpu.key:
            since[:] = [(now, gpu)]
        holding = {pid for pid, used in gpu.listed.items() if used > 0}
        return gpu if pids <= holding and now - since[0][0] >= STILL_S else None

    return poll


def mib(value: float | None) -> str:
    return "none" if value is None else f"{value / MIB:.4f}"


def whole(value: float | None) -> str:
    """A figure in bytes, as bytes."""
    return "none" if value is None else f"{value:.0f}"


def shown(value: float | None) -> str:
    """A figure nvidia-smi printed (MiB)."""
    return "none" if value is None else f"{value:g}"


def within(value: float | None, against: float | None, tolerance: float) -> bool:
    return value is not None and against is not None and abs(value - against) <= tolerance


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pod", type=Path, required=True, metavar="MANIFEST", help="the rendered DaemonSet to run")
    parser.add_argument("--out", type=Path, help="also write the report (Markdown) here")
    parser.add_argument("--scrapes", type=int, default=6)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between scrapes (above the sweep interval)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a process or the agent")
    parser.add_argument(
        "--tolerance-mib",
        type=float,
        default=1.0,
        help="how far used may be from pods + unattributed + reserved + unlisted",
    )
    args = parser.parse_args()
    require_gpu()
    # Imported once the arguments are read: they need the agent's dependencies, --help none.
    from testkit.agent import wait_serving, wait_until  # noqa: PLC0415
    from testkit.gpu_node import AGENT_PORT, NODE, POD_RESOURCES_DIR, REPLICAS, Doubles, pod_harness  # noqa: PLC0415

    report = Report()
    lines, check = report.lines, report.check
    trainer = HostPod("ml", "trainer-0", "systemd", "burstable")
    cache = HostPod("web", "cache-0", "cgroupfs", "besteffort")
    pods = [trainer, cache]
    # (pod, or None for the process of no pod; mode; GiB held), in the order they start.
    workloads: list[tuple[HostPod | None, str, float]] = [
        (trainer, "busy", 3.0),
        (cache, "idle", 2.0),
        (None, "idle", 1.0),
    ]
    tmp = Path(tempfile.mkdtemp(prefix="gpu-memory-", dir="/var/tmp"))
    idle = nvml_memory()
    idle_smi = smi()
    gpu0 = idle[0].uuid
    cluster = Doubles(tmp, NODE, pki=True, socket_dir=POD_RESOURCES_DIR)
    harness = None
    started: list[subprocess.Popen[str]] = []
    joined = [idle[0]]  # GPU 0 as each process joined it: with none, one, two, three
    readings: list[Reading] = []
    try:
        # Started before the agent and moved into their pods' cgroups at once: the agent's first
        # sweep finds each where it stays. On NVML's GPU 0 by its UUID, whatever CUDA's order.
        on_gpu0 = {"CUDA_VISIBLE_DEVICES": gpu0}
        pids: set[int] = set()
        for pod, mode, gib in workloads:
            process = start_workload(mode, gib, on_gpu0)
            started.append(process)
            if pod is not None:  # else in no kubelet cgroup: a process of no pod
                place(pod, process)
            pids.add(process.pid)
            joined.append(wait_until(settled(gpu0, pids), args.timeout, f"GPU 0 listing PIDs {sorted(pids)}, still"))
        cluster.kubelet.allocatable = {"nvidia.com/gpu": [f"{gpu0}::{n}" for n in range(REPLICAS)]}
        for n, pod in enumerate(pods):
            cluster.add(pod, {"main": [f"{gpu0}::{n}"]})
        harness = pod_harness(args.pod, tmp / "pod", cluster, NODE)
        url = f"http://127.0.0.1:{AGENT_PORT}"
        wait_serving(url, harness.start(), harness.log.read_text, timeout=60)

        def seen_all() -> bool:
            # A sweep since every process settled: both pods' memory and the process of no pod's.
            agent = agent_figures(scrape(f"{url}/metrics"), gpu0)
            names = {f"{pod.namespace}/{pod.name}" for pod in pods}
            return all(agent.pods.get(name, 0.0) > 0 for name in names) and (agent.unattributed or 0.0) > 0

        wait_until(seen_all, args.timeout, "the agent's scrape showing both pods' memory and the process of no pod")
        previous = nvml_memory()
        for _ in range(args.scrapes):
            time.sleep(args.every)  # the cadence of a scraper, the agent sweeping on its own between
            before = nvml_memory()
            samples = scrape(f"{url}/metrics")
            figures, apps = smi(), smi_apps()
            after = nvml_memory()
            still = [g.key for g in previous] == [g.key for g in before] == [g.key for g in after]
            served = {gpu.uuid: agent_figures(samples, gpu.uuid) for gpu in after}
            readings.append(Reading(served, after, figures, apps, still))
            previous = after
    finally:
        if harness is not None:
            harness.stop()
        # The pods' processes, and every other started: the one of no pod, and one not yet placed.
        stop_pods(pods, [p for p in started if all(p not in pod.processes for pod in pods)])
        cluster.stop()

    in_pods = {f"{pod.namespace}/{pod.name}": {process.pid for process in pod.processes} for pod in pods}
    pod_pids = set().union(*in_pods.values())
    lines += [
        f"GPU: {idle[0].model}, driver {driver_version()}; {len(idle)} GPU(s). The agent run by "
        f"testkit/pod_harness.py from {args.pod.name}; on GPU 0 the pods ml/trainer-0 (busy, 3 GiB held) and "
        "web/cache-0 (idle, 2 GiB), and a process of no pod (idle, 1 GiB); "
        f"{len(readings)} scrapes {args.every:g} s apart. Figures in MiB.",
        "",
        "## Idle, before the workloads",
        "",
        "| GPU | NVML v1 used | v2 used | v2 reserved | listed | v1 used - reserved - listed | nvidia-smi used | "
        "nvidia-smi reserved |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {g.index} | {mib(g.v1_used)} | {mib(g.v2_used)} | {mib(g.reserved)} | {mib(sum(g.listed.values()))} | "
            f"{mib(g.unlisted)} | {shown(idle_smi[g.uuid][0])} | {shown(idle_smi[g.uuid][1])} |"
            for g in idle
        ),
        "",
        "## GPU 0 as the processes joined it (NVML, each once listed and still)",
        "",
        "| processes | v1 used | v2 reserved | listed | unlisted (v1 used - reserved - listed) | "
        "unlisted per process |",
        "|---|---|---|---|---|---|",
    ]
    for count, gpu in enumerate(joined):
        unlisted = gpu.unlisted
        per = None if unlisted is None or count == 0 else unlisted / count
        lines.append(
            f"| {count} | {mib(gpu.v1_used)} | {mib(gpu.reserved)} | {mib(sum(gpu.listed.values()))} | "
            f"{mib(unlisted)} | {mib(per) if count else ''} |"
        )
    for gpu in idle:
        lines += per_gpu_table(gpu.index, gpu.uuid, gpu.model, readings, in_pods, pod_pids)
    lines += per_context(joined, readings, gpu0)
    lines += ["", "## Checks", "", "| check | what |", "|---|---|"]
    steady = [r for r in readings if r.steady]
    check(bool(steady), f"NVML's figures held still over {len(steady)} of {len(readings)} scrapes (those checked)")
    for n, reading in enumerate(readings):
        for gpu in reading.nvml if reading.steady else ():
            checks(check, f"scrape {n}, GPU {gpu.index}", gpu, reading, in_pods, args.tolerance_mib)
    return report.finish("A GPU's memory adds up on a real GPU", args.out)


def per_gpu_table(
    index: int, uuid: str, model: str, readings: list[Reading], in_pods: dict[str, set[int]], pod_pids: set[int]
) -> list[str]:
    """Every figure of one GPU, a column a scrape."""
    columns = [(r.agent[uuid], next(g for g in r.nvml if g.uuid == uuid), r) for r in readings]

    def row(name: str, figure: Callable[[Agent, NvmlMemory, Reading], str]) -> str:
        return f"| {name} | " + " | ".join(figure(a, g, r) for a, g, r in columns) + " |"

    def smi_of(r: Reading, pids: set[int] | None) -> str:
        """nvidia-smi's used_memory of `pids` on the GPU (None: of the PIDs in no pod)."""
        apps = r.apps.get(uuid, {})
        held = [used for pid, used in apps.items() if (pid in pids if pids is not None else pid not in pod_pids)]
        return "none" if None in held else f"{sum(u for u in held if u is not None):g}"

    def smi_sum(r: Reading) -> str:
        used, reserved = r.smi[uuid]
        return "none" if used is None or reserved is None else f"{used + reserved:g}"

    def per_process(a: Agent, g: NvmlMemory) -> str:
        return mib(a.unlisted / len(g.listed)) if a.unlisted is not None and g.listed else ""

    def pod_rows(pod: str, pids: set[int]) -> list[str]:
        return [
            row(f"{pod} (the agent)", lambda a, g, r: mib(a.pods.get(pod))),
            row(f"{pod} (NVML)", lambda a, g, r: mib(sum(g.listed.get(pid, 0) for pid in pids))),
            row(f"{pod} (nvidia-smi)", lambda a, g, r: smi_of(r, pids)),
        ]

    out = [
        "",
        f"## GPU {index}: {model}, {uuid}",
        "",
        "| figure | " + " | ".join(f"scrape {n}" for n in range(len(readings))) + " |",
        "|---|" + "---|" * len(readings),
        row("NVML steady", lambda a, g, r: "yes" if r.steady else "no"),
        row("used (the agent)", lambda a, g, r: mib(a.used)),
        row("NVML v1 used", lambda a, g, r: mib(g.v1_used)),
        row("nvidia-smi memory.used + memory.reserved", lambda a, g, r: smi_sum(r)),
        row("nvidia-smi memory.used", lambda a, g, r: shown(r.smi[uuid][0])),
        row("reserved (the agent)", lambda a, g, r: mib(a.reserved)),
        row("NVML v2 reserved", lambda a, g, r: mib(g.reserved)),
        row("nvidia-smi memory.reserved", lambda a, g, r: shown(r.smi[uuid][1])),
        row("pods (the agent)", lambda a, g, r: mib(a.pods_total)),
    ]
    for pod, pids in in_pods.items():
        out += pod_rows(pod, pids)
    out += [
        row("unattributed (the agent)", lambda a, g, r: mib(a.unattributed)),
        row(
            "of no pod (NVML)", lambda a, g, r: mib(sum(used for pid, used in g.listed.items() if pid not in pod_pids))
        ),
        row("of no pod (nvidia-smi)", lambda a, g, r: smi_of(r, None)),
        row("unlisted (the agent)", lambda a, g, r: mib(a.unlisted)),
        row("NVML v1 used - v2 reserved - listed", lambda a, g, r: mib(g.unlisted)),
        row("processes listed (NVML)", lambda a, g, r: str(len(g.listed))),
        row("unlisted per process (the agent)", lambda a, g, r: per_process(a, g)),
        row("used - (pods + unattributed + reserved + unlisted)", lambda a, g, r: mib(a.left)),
    ]
    return out


def per_context(joined: list[NvmlMemory], readings: list[Reading], uuid: str) -> list[str]:
    """What no listing holds, per CUDA context: as the processes joined GPU 0 (NVML), and the
    agent's figure over the steady scrapes."""
    out = ["", "## Per CUDA context", ""]
    for count, gpu in enumerate(joined[1:], start=1):
        unlisted = gpu.unlisted
        if unlisted is not None:
            step = unlisted - (joined[count - 1].unlisted or 0)
            out.append(
                f"- {count} process(es): {mib(unlisted)} MiB unlisted, {mib(unlisted / count)} MiB a context; "
                f"the last to join added {mib(step)} MiB."
            )
    figures = [
        (agent.unlisted, len(gpu.listed))
        for r in readings
        if r.steady
        for gpu in r.nvml
        if gpu.uuid == uuid and (agent := r.agent[uuid]).unlisted is not None and gpu.listed
    ]
    if figures:
        per = [unlisted / count for unlisted, count in figures if unlisted is not None]
        out.append(
            f"- The agent's vgpu_gpu_memory_unlisted_bytes on GPU 0 over {len(per)} steady scrapes, "
            f"{figures[-1][1]} processes listed: {mib(min(per))} to {mib(max(per))} MiB a context."
        )
    else:
        out.append("- The agent published no unlisted figure for GPU 0 on a steady scrape.")
    return out


def checks(
    check: Callable[[bool, str], None],
    on: str,
    gpu: NvmlMemory,
    reading: Reading,
    in_pods: dict[str, set[int]],
    tolerance_mib: float,
) -> None:
    """One GPU's checks on one steady scrape."""
    agent = reading.agent[gpu.uuid]
    smi_used, smi_reserved = reading.smi[gpu.uuid]
    apps = reading.apps.get(gpu.uuid, {})
    check(agent.used == gpu.v1_used, f"{on}: used {whole(agent.used)} == NVML's v1 used {gpu.v1_used} (bytes)")
    if gpu.reserved is None:
        check(agent.reserved is None, f"{on}: no reserved series where NVML has no v2 ({whole(agent.reserved)})")
        check(agent.unlisted is None, f"{on}: no unlisted series where NVML has no v2 ({whole(agent.unlisted)})")
        check(
            within(agent.used, None if smi_used is None else smi_used * MIB, SMI_ROUNDING),
            f"{on}: used {mib(agent.used)} MiB is nvidia-smi's memory.used {shown(smi_used)} within 1 MiB",
        )
    else:
        check(
            agent.reserved == gpu.reserved,
            f"{on}: reserved {whole(agent.reserved)} == NVML's v2 {gpu.reserved} (bytes)",
        )
        check(
            within(agent.reserved, None if smi_reserved is None else smi_reserved * MIB, SMI_ROUNDING),
            f"{on}: reserved {mib(agent.reserved)} MiB is nvidia-smi's memory.reserved {shown(smi_reserved)} "
            "within 1 MiB",
        )
        smi_total = None if smi_used is None or smi_reserved is None else (smi_used + smi_reserved) * MIB
        check(
            within(agent.used, smi_total, 2 * SMI_ROUNDING),
            f"{on}: used {mib(agent.used)} MiB is nvidia-smi's memory.used {shown(smi_used)} + memory.reserved "
            f"{shown(smi_reserved)} within 1 MiB for each",
        )
    if gpu.mig:
        # Processes are listed per MIG device; what the GPU's used holds beyond them is no one figure.
        check(agent.unlisted is None, f"{on}: no unlisted series in MIG mode ({whole(agent.unlisted)})")
        return
    pod_pids: set[int] = set().union(*in_pods.values())
    for pod, pids in [*in_pods.items(), ("of no pod", {pid for pid in gpu.listed if pid not in pod_pids})]:
        got = agent.pods.get(pod, 0.0) if pod in in_pods else agent.unattributed
        truth = sum(gpu.listed.get(pid, 0) for pid in pids)
        name = f"{pod}'s memory" if pod in in_pods else "unattributed"
        check(got == truth, f"{on}: {name} {whole(got)} == NVML's usedGpuMemory of its PIDs {truth} (bytes)")
        theirs = [apps.get(pid) for pid in pids if pid in apps or pid in gpu.listed]
        smi_figure = None if None in theirs else sum(u for u in theirs if u is not None) * MIB
        check(
            within(got, smi_figure, SMI_ROUNDING * max(1, len(theirs))),
            f"{on}: {name} {mib(got)} MiB is nvidia-smi's used_memory of its {len(theirs)} PID(s) "
            f"{mib(smi_figure)} within 1 MiB a process",
        )
    if gpu.unlisted is None:
        return
    most = MOST_UNLISTED_PER_PROCESS * len(gpu.listed)
    check(
        agent.unlisted == max(0, gpu.unlisted),
        f"{on}: unlisted {whole(agent.unlisted)} == NVML's v1 used - v2 reserved - listed {gpu.unlisted}, floored at "
        "0 (bytes)",
    )
    check(
        agent.unlisted is not None and 0 <= agent.unlisted <= most,
        f"{on}: unlisted {mib(agent.unlisted)} MiB is 0 to 16 MiB a listed process ({len(gpu.listed)}: {mib(most)})",
    )
    left = agent.left
    check(
        left is not None and agent.unlisted is not None and abs(left) <= tolerance_mib * MIB,
        f"{on}: used {mib(agent.used)} MiB == pods {mib(agent.pods_total)} + unattributed {mib(agent.unattributed)} "
        f"+ reserved {mib(agent.reserved)} + unlisted {mib(agent.unlisted)} within {tolerance_mib:g} MiB "
        f"(off by {mib(left)})",
    )


if __name__ == "__main__":
    raise SystemExit(main())
