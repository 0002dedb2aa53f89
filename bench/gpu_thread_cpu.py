"""Where the agent's CPU goes, thread by thread, on a real GPU through the pod harness.

Run as root on a GPU node from the repository root (bench/README.md says what the GPU scripts need):

    python3 bench/gpu_thread_cpu.py --pod chart-defaults.yaml [--before DIR] [--seconds 45] [--processes 12]
        [--out results.md] [--profile DIR] [--calls]

`--processes` CUDA processes in pods on GPU 0 (a third compute-bound, a third memory-bound, a
third idle); the agent as the manifest runs it, scraped every 15 s, as Prometheus would; each
of its threads' CPU (utime + stime of /proc/<pid>/task/<tid>/stat) over `--seconds`, by name.
With `--before DIR` (a directory holding an earlier `otel_vgpu`), that version's agent too, over
the same processes, one after the other: which thread a change made dearer. With `--profile DIR`,
this checkout's agent is also sampled by py-spy over the same window (the driver's calls show
as pynvml's frames; `--native` was tried on the H100 and fell behind: 612 samples of 16 threads
in 30 s, its addresses unnamed): DIR gets the raw stacks, by thread, and the report the
functions on top of the most samples, those of waiting threads left out. py-spy is the `profile`
extra's, installed beside the agent (`--target` puts it in `bin/` there, found on PATH or there).
With `--calls`, the CPU of each NVML call a sweep makes, over the same processes
(testkit/nvml_call_costs.py): which of the sweeper's calls the driver makes dear.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.agent import wait_serving
from testkit.cpu_compare import load_gpu
from testkit.cuda_workloads import nvml_truth, require_gpu
from testkit.gpu_node import AGENT_PORT, NODE, POD_RESOURCES_DIR, Doubles, pod_harness
from testkit.host_pods import HostPod, stop_pods
from testkit.nvml_call_costs import call_costs
from testkit.procstat import rss_by_mapping
from testkit.py_spy import py_spy, top_functions
from testkit.report import publish, scraped_for

URL = f"http://127.0.0.1:{AGENT_PORT}"


def threads(pid: int) -> dict[str, float]:
    """CPU seconds so far of each of the process's threads, summed by thread name."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


def sampled(pid: int, seconds: float, out: Path, fmt: str) -> subprocess.Popen[bytes]:
    """py-spy sampling process `pid` for `seconds`, 100 times a second, each thread apart."""
    command = [py_spy(), "record", "--pid", str(pid), "--duration", str(round(seconds)), "--rate", "100"]
    command += ["--threads", "--format", fmt, "--output", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def measure(
    args: argparse.Namespace, cluster: Doubles, tmp: Path, code: Path | None, profile: Path | None = None
) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Each thread's CPU, in percent of a core, of the agent in `code` (None: this checkout's),
    and its resident memory by mapping at the end; with `profile`, py-spy's raw stacks of the
    same window written there."""
    agent = pod_harness(args.pod, tmp, cluster, NODE, code=code)
    spies: list[subprocess.Popen[bytes]] = []
    try:
        wait_serving(URL, agent.start(), agent.log.read_text, timeout=60)
        time.sleep(12)  # past the first engine and GPM windows
        pid = agent.agent_pid()
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            spies = [sampled(pid, args.seconds, profile / "stacks.txt", "raw")]
        before = threads(pid)
        wall = scraped_for(f"{URL}/metrics", args.seconds)
        after = threads(pid)
        memory = rss_by_mapping(pid, 12)
        for spy in spies:
            try:
                _, error = spy.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                spy.send_signal(signal.SIGINT)  # py-spy writes what it has sampled, and exits
                try:
                    _, error = spy.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    spy.kill()
                    _, error = spy.communicate()
            if spy.returncode != 0:
                print(f"py-spy exited {spy.returncode}: {error.decode(errors='replace')[-400:]}", file=sys.stderr)
    finally:
        agent.stop()
    return {name: 100 * (after[name] - before.get(name, 0.0)) / wall for name in after}, memory


# Functions py-spy may sample a thread waiting in (a pool's idle worker, gRPC's server loop, an
# event loop's selector): not CPU, and left out of the report's shares.
WAITING = frozenset({"wait", "_worker", "_serve", "select", "poll", "epoll_wait", "sleep", "accept"})


def nvml_calls() -> list[str]:
    """The CPU of each call of a sweep of GPU 0 (testkit/nvml_call_costs.py), in an NVML session of its own."""
    import pynvml  # noqa: PLC0415 - only on a GPU node

    pynvml.nvmlInit()
    try:
        return call_costs(pynvml)
    finally:
        pynvml.nvmlShutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pod", type=Path, required=True, metavar="MANIFEST")
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--processes", type=int, default=12)
    parser.add_argument("--before", type=Path, help="the directory of an earlier otel_vgpu, measured first")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--profile", type=Path, help="a directory for py-spy's stacks of this checkout's agent")
    parser.add_argument(
        "--calls", action="store_true", help="also the CPU of each NVML call of a sweep, over the same processes"
    )
    args = parser.parse_args()
    require_gpu()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-threads-", dir="/var/tmp"))
    cluster = Doubles(tmp, NODE, pki=True, socket_dir=POD_RESOURCES_DIR)
    _, _, model, gpu_uuid, driver = nvml_truth()
    lines: list[str] = []
    pods: list[HostPod] = []
    try:
        pods, processes = load_gpu(cluster, args.processes, gpu_uuid)
        versions = {"now": None} if args.before is None else {"before": args.before, "now": None}
        measured = {
            label: measure(args, cluster, tmp / label, code, args.profile if code is None else None)
            for label, code in versions.items()
        }
        spent = {label: cpu for label, (cpu, _) in measured.items()}
        lines += [
            f"GPU: {model}, driver {driver}; {len(processes)} CUDA processes in {len(pods)} pods; the agent as "
            f"`{args.pod.name}` runs it, scraped every 15 s; CPU of each thread over {args.seconds:g} s",
            "",
            "| thread | " + " | ".join(f"{label}: CPU of a core" for label in spent) + " |",
            "|---|" + "---|" * len(spent),
        ]
        names = sorted({n for threads_ in spent.values() for n in threads_}, key=lambda n: -spent["now"].get(n, 0.0))
        for name in names:
            lines.append(f"| {name} | " + " | ".join(f"{t.get(name, 0.0):.3f} %" for t in spent.values()) + " |")
        lines.append("| all threads | " + " | ".join(f"{sum(t.values()):.3f} %" for t in spent.values()) + " |")
        memory = measured["now"][1]
        lines += [
            "",
            f"The agent's resident memory by mapping at the end ({sum(m for _, m in memory):.1f} MiB in these):",
            "",
        ]
        lines += ["| mapping | resident |", "|---|---|"] + [f"| `{name}` | {mib:.1f} MiB |" for name, mib in memory]
        if args.profile is not None and (args.profile / "stacks.txt").exists():
            where = f"`{args.profile}/stacks.txt`"
            lines += ["", f"py-spy over the same {args.seconds:g} s ({where}), the frames on top:", ""]
            top = top_functions(args.profile / "stacks.txt", 40, WAITING)
            lines += ["| samples | share | frame |", "|---|---|---|"]
            lines += [f"| {n} | {share:.1f} % | `{frame}` |" for frame, n, share in top]
        if args.calls:
            lines += ["", f"Each NVML call of a sweep, made in this process over the same {len(processes)} processes:"]
            lines += nvml_calls()
    finally:
        stop_pods(pods)
        cluster.stop()
    publish("The agent's CPU by thread, on a real GPU", lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
