"""Memory and start-up cost of a Kubernetes client: lightkube against the official one.

Each client is imported and configured from a kubeconfig in a fresh
interpreter; the figures are the interpreter's peak resident memory and the
wall time of import + configuration, the median of several runs.

    python bench/kube_client_cost.py [--official-python PATH]

`--official-python` names an interpreter that has the `kubernetes` package
(e.g. a venv made with `pip install kubernetes`); without it only lightkube
and a bare interpreter are measured.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
PROBE = """
import resource, sys, time
started = time.perf_counter()
{body}
elapsed = time.perf_counter() - started
print(elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""
BODIES = {
    "bare interpreter": "pass",
    "lightkube": (
        "from lightkube import Client, KubeConfig\n"
        "from lightkube.resources.core_v1 import Pod\n"
        "Client(config=KubeConfig.from_file(sys.argv[1]))"
    ),
    "kubernetes (official)": (
        "from kubernetes import client, config, watch\nconfig.load_kube_config(sys.argv[1])\nclient.CoreV1Api()"
    ),
}


def measure(python: str, body: str, kubeconfig: Path, runs: int) -> tuple[float, float]:
    times, rss = [], []
    for _ in range(runs):
        out = subprocess.run(
            [python, "-c", PROBE.format(body=body), str(kubeconfig)], capture_output=True, text=True, check=True
        ).stdout.split()
        times.append(float(out[0]))
        rss.append(float(out[1]))
    return statistics.median(times), statistics.median(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--official-python", help="an interpreter with the kubernetes package")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG)
        print(f"{'client':24} {'import+config':>14} {'peak RSS':>10}")
        for name, body in BODIES.items():
            python = args.official_python if name.startswith("kubernetes") else sys.executable
            if python is None:
                continue
            seconds, mib = measure(python, body, kubeconfig, args.runs)
            print(f"{name:24} {seconds * 1000:11.0f} ms {mib:7.1f} MiB")


if __name__ == "__main__":
    main()
