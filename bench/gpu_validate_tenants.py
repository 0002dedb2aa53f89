"""Tenants as adversaries on a real GPU, with the agent run as the DaemonSet runs it.

Run as root on a node with an NVIDIA GPU, cgroup v2, CUDA and PyTorch, from the repository
root (the manifest rendered where kubectl is; bench/README.md says what the GPU scripts need):

    kubectl kustomize kustomize/base > base.yaml
    python3 bench/gpu_validate_tenants.py --pod base.yaml --part nested --out bench/results/h200-tenant-nested.md
    python3 bench/gpu_validate_tenants.py --pod base.yaml --part renamed --out bench/results/h200-tenant-renamed.md
    python3 bench/gpu_validate_tenants.py --pod base.yaml --part ended --out bench/results/h200-tenant-ended.md
    python3 bench/gpu_validate_tenants.py --pod chart-defaults.yaml --part restarts [--code DIR]
    python3 bench/gpu_validate_tenants.py --pod chart-defaults.yaml --part restarts-scraping [--code DIR]
    python3 bench/gpu_validate_tenants.py --pod chart-defaults.yaml --part own-mps [--code DIR]

The agent runs through testkit/pod_harness.py (its namespaces, uid, no capabilities,
read-only root, volumes); pod names come from the API double, devices from the kubelet
double (one replica of the GPU each, `auto` off: ratio 2). Nothing on the GPU is
reconfigured. Each part is an attack of docs/trust.md, with the bill it must leave:

`--part nested`: pod A runs a busy process in a cgroup it nested below its own container
and named after pod B (`kubepods.slice/kubepods-pod<B>.slice/cri-containerd-<id>.scope`, as
a pod running systemd or Docker-in-Docker can); B runs an idle one. A is billed for its
process (memory, SM, busy seconds), B for its own alone, and the refusal is counted.

`--part renamed`: pod A's busy process calls itself `nvidia-cuda-mps-server`
(`prctl(PR_SET_NAME)`); pod B runs a busy one beside it. No MPS client is listed by NVML,
so the GPU runs no MPS: both pods keep their SM figures and counters, A is billed for its
process, and the refusal is counted. (A real MPS daemon is `gpu_validate_sharing.py --part mps`.)

`--part ended`: pod A runs a bursty process throughout; pod B's busy process ends mid-run,
and B with it (its phase Succeeded in the API), between two scrapes 15 s apart. At each of
`--sweep-interval` 2, 5 and 10 s: every joule the GPU drew is in a series a scrape read (the
pods', B's final value included, and the unattributed), B's counters are in the first scrape
after its end, no lower than in the last scrape before it, and its gauges are not. (What B
ran after its last sweep is in no sample once it has ended: NVML drops an ended process's
samples at once on an H200, bench/results/h200-nvml-ended-samples.md.) B's busy seconds are shown beside the GPU
seconds of work its process counted itself.

`--part restarts`: a tenant pod runs fresh CUDA processes one after another for 60 s, each
computing 1 s of bf16 matrix products once its context is up, beside a steady pod computing
30 % of every 100 ms; `--part restarts-scraping` has the tenant scrape `/metrics` before
each process. Each pod's busy seconds between the first and the last scrape, against the
GPU seconds of work its processes counted themselves, and the agent's CPU meanwhile; with
`--code DIR`, an earlier version's agent (a before).

`--part own-mps`: a tenant pod starts its own MPS control daemon (`nvidia-cuda-mps-control
-f`, its pipe directory its own, no privilege) and two clients computing 30 % of every 100 ms,
beside a pod on the same GPU computing 30 % outside MPS (time-slicing, default compute mode).
NVML gives the clients' SM to the daemon's server, which is in the tenant's pod: the tenant is
billed the server's busy seconds and energy, the neighbour keeps its own, and the GPU's energy
is not left unattributed.

It prints a Markdown report and exits non-zero on any failed check.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import wait_serving
from testkit.cuda_workloads import require_gpu, start_workloads, work_of
from testkit.gpu_node import NODE, POD_RESOURCES_DIR, Doubles, pod_harness
from testkit.host_pods import CGROUP_ROOT, HostPod, cgroup_dir, place, start_in, stop_pods
from testkit.kube_api_double import pod_object
from testkit.mps import mps_daemon
from testkit.report import Report, Samples, scrape

AGENT_URL = "http://127.0.0.1:8080"
GIB = 1024**3
SCRAPE_EVERY_S = 15.0
# `--part restarts`: how long the tenant runs processes, and each one's work once its context is up.
RESTARTS_S = [60.0]
RESTART_WORK_S = 1.0
OWN_MPS_S = 30.0
CODE: list[Path | None] = [None]
"""`--code`: a directory holding another version's `otel_vgpu`, run in its place (a before)."""


def series(metrics: Samples, family: str, **labels: str) -> list[float]:
    return [v for got, v in metrics.get(family, []) if all(got.get(k) == want for k, want in labels.items())]


def one(metrics: Samples, family: str, **labels: str) -> float | None:
    found = series(metrics, family, **labels)
    return found[0] if len(found) == 1 else None


def nvml_used() -> dict[int, int]:
    """GPU 0's compute processes: PID -> usedGpuMemory, asked as root in the host's namespace."""
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {p.pid: p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    finally:
        pynvml.nvmlShutdown()


def gpu_uuid() -> tuple[str, str, str]:
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle), pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()


@contextlib.contextmanager
def cluster_of(pods: list[HostPod], workdir: Path) -> Iterator[Doubles]:
    """The doubles, each pod published with one replica of GPU 0 (two replicas advertised)."""
    gpu, _, _ = gpu_uuid()
    cluster = Doubles(workdir, NODE, pki=True, socket_dir=POD_RESOURCES_DIR)
    try:
        for index, pod in enumerate(pods):
            cluster.add(pod, {"main": [f"{gpu}::{index}"]})
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def agent(manifest: Path, workdir: Path, cluster: Doubles, lines: list[str], *extra: str) -> Iterator[Any]:
    harness = pod_harness(manifest, workdir, cluster, NODE, code=CODE[0], extra_args=extra)
    for data in harness.configmaps.values():
        if "gpu_allocation.txt" in data:
            data["gpu_allocation.txt"] = "2\n"
    wait_serving(AGENT_URL, harness.start(), harness.log.read_text, timeout=60)
    try:
        yield harness
    finally:
        log = harness.stop()
        said = [line for line in log.splitlines() if "refused (" in line or " ERROR " in line or "Traceback" in line]
        lines += ["", f"agent log: {len(log.splitlines())} lines; refusals and errors:", ""]
        lines += [f"    {line[:200]}" for line in said[:6]] or ["    (none)"]


def nest(pod: HostPod, named_after: HostPod, process: Any) -> Path:
    """Move `process` into a cgroup nested below `pod`'s container, named like `named_after`'s
    kubelet cgroups, as a pod delegated its subtree can (a container of its own is made first)."""
    container_id = uuid.uuid4().hex + uuid.uuid4().hex
    container = cgroup_dir(pod, container_id)
    underscored = named_after.uid.replace("-", "_")
    nested = container / "kubepods.slice" / f"kubepods-pod{underscored}.slice"
    nested = nested / f"cri-containerd-{uuid.uuid4().hex + uuid.uuid4().hex}.scope"
    nested.mkdir(parents=True)
    (nested / "cgroup.procs").write_text(str(process.pid))
    pod.processes.append(process)
    pod.containers.append((container_id, nested))
    return nested


def measured(
    manifest: Path, workdir: Path, pods: list[HostPod], lines: list[str], settle: float
) -> tuple[Samples, dict[int, int]]:
    """The agent's second scrape after `settle` seconds of the pods' load, and NVML's memory
    per process then; the table of both in `lines`, then the checks' header."""
    with cluster_of(pods, workdir) as cluster, agent(manifest, workdir / "pod", cluster, lines):
        time.sleep(settle)
        scrape(f"{AGENT_URL}/metrics")
        time.sleep(3.0)
        metrics = scrape(f"{AGENT_URL}/metrics")
        used = nvml_used()
    table(lines, metrics, pods, used)
    lines += ["", "| check | what |", "|---|---|"]
    return metrics, used


def nested_part(manifest: Path, workdir: Path, report: Report, settle: float) -> None:
    lines, check = report.lines, report.check
    attacker = HostPod("team-b", "attacker", "systemd", "besteffort")
    victim = HostPod("team-a", "victim", "systemd", "burstable")
    busy, idle = start_workloads(["busy", "idle"], 4.0)
    path = nest(attacker, victim, busy)
    place(victim, idle)
    lines += [f"A's busy process (PID {busy.pid}) in `{path.relative_to(CGROUP_ROOT)}`", ""]
    try:
        metrics, used = measured(manifest, workdir, [attacker, victim], lines, settle)
        mine = one(metrics, "vgpu_pod_memory_used_bytes", pod="attacker")
        check(mine == used.get(busy.pid), f"A's memory {mine} == its busy process's, NVML {used.get(busy.pid)}")
        theirs = one(metrics, "vgpu_pod_memory_used_bytes", pod="victim")
        check(theirs == used.get(idle.pid), f"B's memory {theirs} == its own idle process's, NVML {used.get(idle.pid)}")
        sm = one(metrics, "vgpu_pod_sm_utilization_ratio", pod="attacker")
        check(sm is not None and sm > 0.5, f"A's SM {sm} > 0.5: the busy process's")
        victim_sm = one(metrics, "vgpu_pod_sm_utilization_ratio", pod="victim")
        check(victim_sm is not None and victim_sm < 0.05, f"B's SM {victim_sm} < 0.05: its idle process's")
        busy_s = one(metrics, "vgpu_pod_sm_busy_seconds_total", pod="attacker")
        check(busy_s is not None and busy_s > 1.0, f"A's SM-busy seconds {busy_s} count (> 1)")
        uids = {labels.get("pod_uid") for labels, _ in metrics.get("vgpu_pod_memory_used_bytes", [])}
        check(uids == {attacker.uid, victim.uid}, f"no row but A's and B's ({len(uids)} pod UIDs)")
        refused = one(metrics, "vgpu_agent_refusals_total", reason="nested_pod_cgroup")
        check(refused == 1, f"refusals{{reason=nested_pod_cgroup}} {refused} == 1")
    finally:
        stop_pods([attacker, victim])


def renamed_part(manifest: Path, workdir: Path, report: Report, settle: float) -> None:
    lines, check = report.lines, report.check
    attacker = HostPod("team-b", "attacker", "systemd", "besteffort")
    victim = HostPod("team-a", "victim", "cgroupfs", "burstable")
    renamed = start_workloads(["busy"], 0.25, {"COMM": "nvidia-cuda-mps-server"})[0]
    busy = start_workloads(["busy"], 4.0)[0]
    place(attacker, renamed)
    place(victim, busy)
    command = Path(f"/proc/{renamed.pid}/stat").read_text().split("(", 1)[1].rsplit(")", 1)[0]
    lines += [f"A's process {renamed.pid} shows command {command!r} in /proc/<pid>/stat", ""]
    try:
        metrics, _ = measured(manifest, workdir, [attacker, victim], lines, settle)
        check(command == "nvidia-cuda-mps", f"the kernel shows the chosen name ({command!r})")
        mps = series(metrics, "vgpu_gpu_mps_servers", gpu_id="0")
        check(mps == [0], f"vgpu_gpu_mps_servers {mps} == [0]: NVML lists no MPS client")
        for pod in (attacker, victim):
            sm = one(metrics, "vgpu_pod_sm_utilization_ratio", pod=pod.name)
            busy_s = one(metrics, "vgpu_pod_sm_busy_seconds_total", pod=pod.name)
            joules = one(metrics, "vgpu_pod_energy_joules_total", pod=pod.name)
            check(
                sm is not None and sm > 0.1 and busy_s is not None and busy_s > 0.5 and joules is not None,
                f"{pod.name}: SM {sm} > 0.1, busy seconds {busy_s} > 0.5, joules {joules} counted",
            )
        pods_sm = sum(series(metrics, "vgpu_pod_sm_utilization_ratio", gpu_id="0"))
        gpu_sm = series(metrics, "vgpu_gpu_sm_utilization_ratio", gpu_id="0")
        check(bool(gpu_sm) and pods_sm <= gpu_sm[0] + 0.02, f"the pods' SM {pods_sm:.3f} <= the GPU's {gpu_sm}")
        refused = one(metrics, "vgpu_agent_refusals_total", reason="mps_server_name")
        check(refused == 1, f"refusals{{reason=mps_server_name}} {refused} == 1")
    finally:
        stop_pods([attacker, victim])


def ended_part(manifest: Path, workdir: Path, report: Report, settle: float) -> None:
    lines, check = report.lines, report.check
    lines += [
        "| sweep interval | GPU J | pods J (last seen) | unattributed J | missing J | B's busy s | B's work s | "
        "B's counters after its end, against before | B's gauges after its end |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    results = []
    for interval in ("2", "5", "10"):
        stays = HostPod("team-a", "stays", "systemd", "burstable")
        ends = HostPod("team-b", "ends", "systemd", "besteffort")
        work = workdir / f"work-{interval}"
        place(stays, start_workloads(["bursty"], 2.0, burst_ms=300)[0])
        place(ends, start_workloads(["busy"], 2.0, {"WORK_FILE": str(work)})[0])
        seen: dict[tuple[str, str], float] = {}
        before_end: Samples = {}
        after_end: Samples = {}
        try:
            with (
                cluster_of([stays, ends], workdir / f"cluster-{interval}") as cluster,
                agent(manifest, workdir / f"pod-{interval}", cluster, lines, "--sweep-interval", interval),
            ):
                started = time.monotonic()
                for k in range(1, 5):  # scrapes at 15, 30, 45 and 60 s; B ends at 37 s
                    while time.monotonic() - started < k * SCRAPE_EVERY_S:
                        if time.monotonic() - started > 37 and ends.processes[0].poll() is None:
                            ends.processes[0].kill()
                            ends.processes[0].wait()
                            containers = {"main": ends.containers[0][0]}
                            cluster.api.put(
                                pod_object(ends.namespace, ends.name, ends.uid, NODE, containers, phase="Succeeded")
                            )
                        time.sleep(0.1)
                    metrics = scrape(f"{AGENT_URL}/metrics")
                    before_end = metrics if k == 2 else before_end
                    after_end = metrics if k == 3 else after_end
                    for family in ("vgpu_pod_energy_joules_total", "vgpu_pod_sm_busy_seconds_total"):
                        for labels, value in metrics.get(family, []):
                            seen[(family, labels["pod"])] = value
            # B's process counted the GPU seconds of work it did, the file its last word.
            ran = work_of(work) if work.exists() else float("nan")
        finally:
            stop_pods([stays, ends])
        gpu = one(metrics, "vgpu_gpu_energy_joules_total", gpu_id="0") or 0.0
        unattributed = one(metrics, "vgpu_gpu_energy_unattributed_joules_total", gpu_id="0") or 0.0
        pods = sum(v for (family, _), v in seen.items() if family == "vgpu_pod_energy_joules_total")
        busy = seen.get(("vgpu_pod_sm_busy_seconds_total", "ends"), 0.0)
        final = [
            one(after_end, f, pod="ends") for f in ("vgpu_pod_energy_joules_total", "vgpu_pod_sm_busy_seconds_total")
        ]
        last = [
            one(before_end, f, pod="ends") for f in ("vgpu_pod_energy_joules_total", "vgpu_pod_sm_busy_seconds_total")
        ]
        counters = all(a is not None and b is not None and a >= b for a, b in zip(final, last, strict=True))
        gauges = one(after_end, "vgpu_pod_memory_used_bytes", pod="ends") is not None
        lines.append(
            f"| {interval} s | {gpu:.1f} | {pods:.1f} | {unattributed:.1f} | {gpu - pods - unattributed:.3f} | "
            f"{busy:.2f} | {ran:.2f} | {'no lower' if counters else 'lower or absent'} | "
            f"{'present' if gauges else 'absent'} |"
        )
        results.append((interval, gpu, pods, unattributed, busy, ran, counters, gauges))
    lines += ["", "| check | what |", "|---|---|"]
    for interval, gpu, pods, unattributed, _, _, counters, gauges in results:
        check(
            gpu > 0 and abs(pods + unattributed - gpu) <= 1e-6 * gpu,
            f"{interval} s: pods' {pods:.1f} J + unattributed {unattributed:.1f} J == the GPU's {gpu:.1f} J",
        )
        check(
            counters and not gauges,
            f"{interval} s: after B's end, its counters in the scrape, no lower than before it, its gauges not",
        )


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def restarts_part(manifest: Path, workdir: Path, report: Report, settle: float, scraping: bool = False) -> None:
    """A tenant that runs fresh CUDA processes one after another, each computing RESTART_WORK_S
    once its context is up, beside a steady pod; with `scraping`, the tenant scrapes /metrics
    in its gaps. Each pod's busy seconds between two scrapes `--restarts-seconds` apart, against the GPU
    seconds its processes counted themselves."""
    lines, check = report.lines, report.check
    steady = HostPod("team-a", "steady", "systemd", "burstable")
    tenant = HostPod("team-b", "tenant", "systemd", "besteffort")
    steady_work = workdir / "steady-work"
    place(steady, start_workloads(["steady"], 2.0, {"WORK_FILE": str(steady_work)}, burst_ms=300)[0])
    ran = {"steady": 0.0, "tenant": 0.0}
    try:
        with (
            cluster_of([steady, tenant], workdir / "cluster") as cluster,
            agent(manifest, workdir / "pod", cluster, lines) as harness,
        ):
            time.sleep(settle)
            first, steady_before, cpu_before = (
                scrape(f"{AGENT_URL}/metrics"),
                work_of(steady_work),
                harness.cpu_seconds(),
            )
            started, processes, scrapes = time.monotonic(), 0, 0
            while time.monotonic() - started < RESTARTS_S[0]:
                if scraping:  # in its gap: were a scrape to sweep, the next sweep would come after its work
                    scrape(f"{AGENT_URL}/metrics")
                    scrapes += 1
                work = workdir / f"tenant-{processes}"
                once = start_in(tenant, ["once"], 1.0, {"WORK_FILE": str(work), "ONCE_S": str(RESTART_WORK_S)})[0]
                once.wait()
                ran["tenant"] += work_of(work)
                processes += 1
            time.sleep(SCRAPE_EVERY_S / 5)  # the last process's end reaches a sweep
            last, cpu = scrape(f"{AGENT_URL}/metrics"), harness.cpu_seconds() - cpu_before
            ran["steady"] = work_of(steady_work) - steady_before
            seconds = time.monotonic() - started
    finally:
        stop_pods([steady, tenant])
    lines += [
        f"{processes} tenant processes of {RESTART_WORK_S} s of work each over {seconds:.0f} s"
        + (f", the tenant scraping /metrics {scrapes} times in its gaps" if scraping else "")
        + f"; the agent's CPU over them: {cpu:.2f} s ({100 * cpu / seconds:.2f} % of a core)",
        "",
        "| pod | billed busy s | its processes' GPU s of work | billed / ran |",
        "|---|---|---|---|",
    ]
    billed = {}
    for name in ("tenant", "steady"):
        before = one(first, "vgpu_pod_sm_busy_seconds_total", pod=name) or 0.0
        after = one(last, "vgpu_pod_sm_busy_seconds_total", pod=name) or 0.0
        billed[name] = after - before
        ratio = billed[name] / ran[name] if ran[name] > 0 else float("nan")
        lines.append(f"| {name} | {billed[name]:.2f} | {ran[name]:.2f} | {ratio:.2f} |")
    gpu = [one(m, "vgpu_gpu_sm_busy_seconds_total", gpu_id="0") or 0.0 for m in (first, last)]
    lines += [
        f"| the GPU | {gpu[1] - gpu[0]:.2f} | {sum(ran.values()):.2f} | "
        f"{(gpu[1] - gpu[0]) / max(1e-9, sum(ran.values())):.2f} |",
        "",
        "| check | what |",
        "|---|---|",
    ]
    check(processes >= 5, f"{processes} tenant processes ran (>= 5)")
    check(
        billed["tenant"] >= 0.8 * ran["tenant"],
        f"the tenant billed {billed['tenant']:.2f} >= 0.8 x its {ran['tenant']:.2f}",
    )
    check(
        abs(billed["steady"] - ran["steady"]) <= 0.15 * ran["steady"],
        f"the steady pod billed {billed['steady']:.2f} within 15 % of its {ran['steady']:.2f}",
    )


def own_mps_part(manifest: Path, workdir: Path, report: Report, settle: float) -> None:
    """A tenant's own MPS daemon and two clients beside a time-sliced pod; each pod's busy
    seconds and joules between two scrapes OWN_MPS_S apart, against what its processes counted."""
    lines, check = report.lines, report.check
    tenant = HostPod("team-b", "mps-tenant", "systemd", "besteffort")
    neighbour = HostPod("team-a", "neighbour", "systemd", "burstable")
    works = {"neighbour": [workdir / "neighbour-work"], "mps-tenant": [workdir / f"client-{n}" for n in range(2)]}
    with mps_daemon(tenant, workdir / "tenant") as daemon:
        try:
            time.sleep(1.0)
            place(
                neighbour, start_workloads(["steady"], 1.0, {"WORK_FILE": str(works["neighbour"][0])}, burst_ms=300)[0]
            )
            for path in works["mps-tenant"]:
                start_in(tenant, ["steady"], 1.0, {**daemon.env, "WORK_FILE": str(path)}, burst_ms=300)
            with (
                cluster_of([tenant, neighbour], workdir / "cluster") as cluster,
                agent(manifest, workdir / "pod", cluster, lines),
            ):
                time.sleep(settle)
                first = scrape(f"{AGENT_URL}/metrics")
                before = {name: sum(work_of(p) for p in paths) for name, paths in works.items()}
                time.sleep(OWN_MPS_S)
                last = scrape(f"{AGENT_URL}/metrics")
                ran = {name: sum(work_of(p) for p in paths) - before[name] for name, paths in works.items()}
            listed = nvml_used()
        finally:
            stop_pods([tenant, neighbour])
    servers = [pid for pid in listed if command_of(pid).startswith("nvidia-cuda-mps")]
    lines += [
        f"NVML's compute list at the end: {len(listed)} processes, MPS servers among them: {servers}",
        "",
        "| pod | billed busy s | its processes' GPU s of work | joules | MPS client series |",
        "|---|---|---|---|---|",
    ]

    def delta(family: str, **labels: str) -> float:
        return (one(last, family, **labels) or 0.0) - (one(first, family, **labels) or 0.0)

    billed, joules = {}, {}
    for name in ("mps-tenant", "neighbour"):
        billed[name] = delta("vgpu_pod_sm_busy_seconds_total", pod=name)
        joules[name] = delta("vgpu_pod_energy_joules_total", pod=name)
        sm = series(last, "vgpu_pod_sm_utilization_ratio", pod=name)
        lines.append(f"| {name} | {billed[name]:.2f} | {ran[name]:.2f} | {joules[name]:.0f} | SM gauge {sm} |")
    gpu_busy = delta("vgpu_gpu_sm_busy_seconds_total", gpu_id="0")
    gpu_joules = delta("vgpu_gpu_energy_joules_total", gpu_id="0")
    unattributed = delta("vgpu_gpu_energy_unattributed_joules_total", gpu_id="0")
    lines += [
        f"| the GPU | {gpu_busy:.2f} | {sum(ran.values()):.2f} | "
        f"{gpu_joules:.0f} ({unattributed:.0f} unattributed) | |",
        "",
        f"vgpu_gpu_mps_servers: {series(last, 'vgpu_gpu_mps_servers', gpu_id='0')}",
        "",
        "| check | what |",
        "|---|---|",
    ]
    check(ran["mps-tenant"] > 1.0, f"the tenant's clients computed {ran['mps-tenant']:.2f} GPU s (> 1)")
    # The clients' kernels share the server's context, so the GPU's busy time under MPS can be
    # less than the sum of their own counts: the tenant is held to what the GPU ran beyond the
    # neighbour, and to no more than its own count.
    beyond = gpu_busy - ran["neighbour"]
    check(
        billed["mps-tenant"] >= 0.8 * min(beyond, ran["mps-tenant"]),
        f"the tenant billed {billed['mps-tenant']:.2f} >= 0.8 x min(GPU beyond the neighbour {beyond:.2f}, "
        f"its clients' {ran['mps-tenant']:.2f})",
    )
    check(
        abs(billed["neighbour"] - ran["neighbour"]) <= 0.15 * ran["neighbour"],
        f"the neighbour billed {billed['neighbour']:.2f} within 15 % of its {ran['neighbour']:.2f}",
    )
    check(joules["mps-tenant"] > 0 and joules["neighbour"] > 0, f"both pods drew joules: {joules}")
    check(
        unattributed <= 0.25 * gpu_joules,
        f"unattributed energy {unattributed:.0f} J <= a quarter of the GPU's {gpu_joules:.0f} J (the idle draw "
        "of periods no pod ran is the GPU's)",
    )


def table(lines: list[str], metrics: Samples, pods: list[HostPod], used: dict[int, int]) -> None:
    lines += [
        "| pod | memory (agent) | memory (NVML) | SM | SM-busy s | joules |",
        "|---|---|---|---|---|---|",
    ]
    for pod in pods:
        lines.append(
            f"| {pod.namespace}/{pod.name} | {one(metrics, 'vgpu_pod_memory_used_bytes', pod=pod.name)} | "
            f"{sum(used.get(p.pid, 0) for p in pod.processes)} | "
            f"{one(metrics, 'vgpu_pod_sm_utilization_ratio', pod=pod.name)} | "
            f"{one(metrics, 'vgpu_pod_sm_busy_seconds_total', pod=pod.name)} | "
            f"{one(metrics, 'vgpu_pod_energy_joules_total', pod=pod.name)} |"
        )


Part = Callable[[Path, Path, Report, float], None]
PARTS: dict[str, Part] = {
    "nested": nested_part,
    "renamed": renamed_part,
    "ended": ended_part,
    "restarts": restarts_part,
    "restarts-scraping": functools.partial(restarts_part, scraping=True),
    "own-mps": own_mps_part,
}
TITLES = {
    "nested": "A nested cgroup named after another pod",
    "renamed": "A process named like the MPS server",
    "ended": "A pod that ends between scrapes",
    "restarts": "A tenant that runs fresh short processes one after another",
    "restarts-scraping": "A tenant that runs fresh short processes and scrapes in its gaps",
    "own-mps": "A tenant's own MPS daemon beside a time-sliced pod",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pod", type=Path, required=True, metavar="MANIFEST", help="the rendered DaemonSet")
    parser.add_argument("--part", choices=tuple(PARTS), required=True)
    parser.add_argument("--out", type=Path, help="also write the report (Markdown) here")
    parser.add_argument("--settle", type=float, default=6.0, help="seconds of load before the first scrape")
    parser.add_argument("--code", type=Path, help="a directory holding another version's otel_vgpu, to run instead")
    parser.add_argument(
        "--restarts-seconds", type=float, default=RESTARTS_S[0], help="--part restarts: how long the tenant runs"
    )
    args = parser.parse_args()
    CODE[0] = args.code
    RESTARTS_S[0] = args.restarts_seconds
    require_gpu()
    if os.geteuid() != 0 or not (CGROUP_ROOT / "cgroup.controllers").exists():
        raise SystemExit("run as root on a node with cgroup v2 at /sys/fs/cgroup")
    gpu, model, driver = gpu_uuid()
    version = f" (the otel_vgpu of {args.code})" if args.code else ""
    report = Report(
        [f"GPU: {model} {gpu}, driver {driver}; agent{version} from {args.pod.name} through the pod harness", ""]
    )
    workdir = Path(tempfile.mkdtemp(prefix=f"gpu-tenants-{args.part}-", dir="/var/tmp"))
    PARTS[args.part](args.pod, workdir, report, args.settle)
    return report.finish(f"{TITLES[args.part]}, on a real GPU, through the pod harness", args.out)


if __name__ == "__main__":
    raise SystemExit(main())
