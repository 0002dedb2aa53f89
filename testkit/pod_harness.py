"""Run the agent the way a rendered DaemonSet runs it, on a machine without a kubelet.

A GPU validation that runs the agent as root in the host's namespaces proves
nothing about the pod: the agent once passed such a validation while the
shipped DaemonSet saw no pod at all. This harness reads the DaemonSet from
`kubectl kustomize` output and gives the agent what its pod spec asks for:

- PID namespace: its own (`unshare --pid`) unless `hostPID: true`, with a
  /proc mounted for that namespace, as the runtime mounts it;
- mount namespace: the host's root bound read-only (`readOnlyRootFilesystem`),
  /dev and /proc aside, with every volume at its `mountPath`: ConfigMaps laid
  out as the kubelet lays them out (a timestamped directory, `..data`, and
  each key a link through it), hostPaths bound (read-only where the mount
  says so), `emptyDir` as a tmpfs, and the service account's token, `ca.crt`
  and namespace at /var/run/secrets/kubernetes.io/serviceaccount;
- cgroup: a kubelet-shaped container cgroup of its own, and a private cgroup
  namespace, as containerd gives containers on cgroup v2;
- user and group from `securityContext`, no supplementary groups, no
  capabilities in any set (`setpriv --inh-caps=-all --bounding-set=-all`),
  `no_new_privs` unless `allowPrivilegeEscalation` is true;
- environment: the container's `env` with its fieldRefs filled in, and the
  Kubernetes service variables the kubelet adds; nothing of the caller's.

Not modelled: the pod's network namespace (the agent listens on the host's,
which changes nothing NVML or /proc show), seccomp, and the device cgroup
(the NVIDIA runtime's injection is stood in for by the host's own driver
files, visible in the read-only root).

Run as root, through `bench/gpu_validate.py --pod`. `start()` returns the
agent's process; `evidence()` reads back what the kernel says of it (uid,
capabilities, namespaces, root mount).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.procstat import children
from testkit.yamldocs import documents

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTAINER_NAME = "otel-vgpu"


def load_daemonset(manifest: Path) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """The DaemonSet's pod spec and the ConfigMaps' data, by name, from rendered YAML."""
    docs = documents(manifest.read_text())
    daemonsets = [d for d in docs if d["kind"] == "DaemonSet"]
    if len(daemonsets) != 1:
        raise SystemExit(f"{manifest}: expected one DaemonSet, found {len(daemonsets)}")
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    return daemonsets[0]["spec"]["template"]["spec"], configmaps


@dataclass
class Pod:
    """The identity the kubelet would give the pod, for fieldRefs and the cgroup."""

    node: str
    namespace: str = "otel-vgpu"
    name: str = "otel-vgpu-harness"
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class Cluster:
    """Where the agent finds the API server: its address and what the service account holds."""

    api_host: str
    api_port: int
    token: str
    ca_crt: bytes


class PodHarness:
    def __init__(
        self,
        manifest: Path,
        workdir: Path,
        pod: Pod,
        cluster: Cluster,
        python: str = sys.executable,
        python_path: tuple[str, ...] = (),
        drop_host_pid: bool = False,
        host_paths: dict[str, Path] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """`host_paths` stands other directories in for the manifest's hostPaths
        (a test's kubelet socket, not the node's); `extra_args` go after the
        container's own (`--simulate` where there is no GPU)."""
        self.spec, self.configmaps = load_daemonset(manifest)
        if drop_host_pid:
            self.spec.pop("hostPID", None)
        self.container = next(c for c in self.spec["containers"] if c["name"] == CONTAINER_NAME)
        self.workdir = workdir
        self.pod = pod
        self.cluster = cluster
        self.python = python
        self.python_path = python_path
        self.host_paths = host_paths or {}
        self.extra_args = extra_args
        self.process: subprocess.Popen[str] | None = None
        self.log = workdir / "agent.log"
        self.cgroup: Path | None = None
        """The container's cgroup, once the script has made it."""

    @property
    def host_pid(self) -> bool:
        return bool(self.spec.get("hostPID"))

    # --- the pieces of the pod ---------------------------------------------------

    def _security(self) -> tuple[int, int, bool]:
        pod_ctx = self.spec.get("securityContext", {})
        ctx = {**pod_ctx, **self.container.get("securityContext", {})}
        if ctx.get("privileged") or ctx.get("capabilities", {}).get("add"):
            raise SystemExit("the harness models unprivileged containers without added capabilities")
        if ctx.get("capabilities", {}).get("drop") != ["ALL"]:
            raise SystemExit("the harness drops every capability; the manifest must say so (drop: [ALL])")
        escalation = ctx.get("allowPrivilegeEscalation") is not False
        return int(ctx.get("runAsUser", 0)), int(ctx.get("runAsGroup", 0)), escalation

    def _env(self) -> dict[str, str]:
        fields = {
            "spec.nodeName": self.pod.node,
            "metadata.name": self.pod.name,
            "metadata.namespace": self.pod.namespace,
            "metadata.uid": self.pod.uid,
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
            "spec.serviceAccountName": self.spec.get("serviceAccountName", "default"),
        }
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOSTNAME": self.pod.name,
            "PYTHONPATH": ":".join(self.python_path),
            "PYTHONUNBUFFERED": "1",
            # Always there, whatever enableServiceLinks says.
            "KUBERNETES_SERVICE_HOST": self.cluster.api_host,
            "KUBERNETES_SERVICE_PORT": str(self.cluster.api_port),
        }
        for item in self.container.get("env", []):
            if "value" in item:
                env[item["name"]] = expand(str(item["value"]), env)
            else:
                path = item["valueFrom"]["fieldRef"]["fieldPath"]
                if path not in fields:
                    raise SystemExit(f"the harness cannot fill the fieldRef {path}")
                env[item["name"]] = fields[path]
        return env

    def _volumes(self) -> list[tuple[str, str, bool]]:
        """(kind:source, mountPath, read-only) for every mount, sources prepared."""
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        mounts: list[tuple[str, str, bool]] = []
        for mount in self.container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            read_only = bool(mount.get("readOnly"))
            if "configMap" in volume:
                source = self._configmap(volume["name"], self.configmaps[volume["configMap"]["name"]])
                mounts.append((f"bind:{source}", mount["mountPath"], True))
            elif "hostPath" in volume:
                path = self.host_paths.get(volume["hostPath"]["path"], Path(volume["hostPath"]["path"]))
                if volume["hostPath"].get("type") == "DirectoryOrCreate" and not path.exists():
                    path.mkdir(parents=True, mode=0o755)
                mounts.append((f"bind:{path}", mount["mountPath"], read_only))
            elif "emptyDir" in volume:
                size = volume["emptyDir"].get("sizeLimit", "64Mi").replace("Mi", "m")
                mounts.append((f"tmpfs:{size}", mount["mountPath"], False))
            else:
                raise SystemExit(f"the harness does not model volume {volume}")
        if self.spec.get("automountServiceAccountToken", True):
            account = self.workdir / "serviceaccount"
            account.mkdir(parents=True, exist_ok=True)
            (account / "token").write_text(self.cluster.token)
            (account / "ca.crt").write_bytes(self.cluster.ca_crt)
            (account / "namespace").write_text(self.pod.namespace)
            mounts.append((f"bind:{account}", SERVICE_ACCOUNT_DIR, True))
        return mounts

    def _configmap(self, name: str, data: dict[str, str]) -> Path:
        """The kubelet's layout: ..<timestamp>/<key>, ..data -> it, <key> -> ..data/<key>."""
        volume = self.workdir / "volumes" / name
        version = volume / "..2026_11_30_00_00_00.000000001"
        version.mkdir(parents=True, exist_ok=True)
        for key, text in data.items():
            (version / key).write_text(text)
        (volume / "..data").symlink_to(version.name)
        for key in data:
            (volume / key).symlink_to(f"..data/{key}")
        return volume

    def _cgroup(self) -> Path:
        """A container cgroup shaped like the kubelet's (systemd driver, containerd),
        in the unified (v2) hierarchy: /sys/fs/cgroup, or its /unified on a hybrid host."""
        uid = self.pod.uid.replace("-", "_")
        unified = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.procs").exists() else CGROUP_ROOT / "unified"
        parent = unified / "kubepods.slice" / "kubepods-burstable.slice" / f"kubepods-burstable-pod{uid}.slice"
        directory = parent / f"cri-containerd-{uuid.uuid4().hex}{uuid.uuid4().hex}.scope"
        directory.mkdir(parents=True)
        return directory

    def script(self) -> str:
        """The shell script that builds the pod's mount namespace and execs the agent."""
        uid, gid, escalation = self._security()
        root = self.workdir / "root"
        root.mkdir(parents=True, exist_ok=True)
        lines = ["set -eu", f"ROOT={shlex.quote(str(root))}", 'mount --rbind / "$ROOT"']
        # readOnlyRootFilesystem: every mount of the root read-only, /dev and /proc aside.
        lines.append(
            "awk '{print $5}' /proc/self/mountinfo | grep -E \"^$ROOT(/|$)\" | sort -u | while read -r m; do\n"
            '  case "$m" in "$ROOT/dev"*|"$ROOT/proc"*) continue;; esac\n'
            '  mount -o remount,bind,ro "$m" 2>/dev/null || echo "harness: $m stays writable" >&2\n'
            "done"
        )
        for source, target, read_only in self._volumes():
            # The target as the host resolves it (/var/run is often a link to
            # /run): the root is the host's, so the same path inside it.
            os.makedirs(target, exist_ok=True)
            inside = '"$ROOT"' + shlex.quote(os.path.realpath(target))
            kind, _, what = source.partition(":")
            if kind == "bind":
                lines.append(f"mount --bind {shlex.quote(what)} {inside}")
                if read_only:
                    lines.append(f"mount -o remount,bind,ro {inside}")
            else:
                lines.append(f"mount -t tmpfs -o size={what},mode=1777 tmpfs {inside}")
        # What the image holds (the interpreter's packages, the agent's code)
        # at the same paths, read-only, over whatever volume covers them (the
        # emptyDir at /tmp covers a checkout under /tmp).
        for path in dict.fromkeys(p for p in self.python_path if p and os.path.isdir(p)):
            inside = '"$ROOT"' + shlex.quote(os.path.realpath(path))
            lines += [
                f"mkdir -p {inside}",
                f"mount --bind {shlex.quote(path)} {inside}",
                f"mount -o remount,bind,ro {inside}",
            ]
        lines.append('mount -t proc proc "$ROOT/proc"')
        cgroup = self.cgroup = self._cgroup()
        lines.append(f"echo $$ > {shlex.quote(str(cgroup / 'cgroup.procs'))}")
        env = " ".join(shlex.quote(f"{k}={v}") for k, v in self._env().items())
        argv = [*self.container.get("command", []), *self.container.get("args", []), *self.extra_args]
        args = " ".join(shlex.quote(a) for a in argv)
        setpriv = f"setpriv --reuid={uid} --regid={gid} --clear-groups --inh-caps=-all --bounding-set=-all"
        if not escalation:
            setpriv += " --no-new-privs"
        lines.append(
            f'exec unshare --cgroup -- chroot "$ROOT" {setpriv} -- '
            f"env -i {env} {shlex.quote(self.python)} -m otel_vgpu {args}"
        )
        return "\n".join(lines) + "\n"

    # --- running ------------------------------------------------------------------

    def cpu_seconds(self) -> float:
        """The CPU the container's cgroup has used, in seconds to the microsecond (cgroup v2's
        cpu.stat usage_usec, kept by every cgroup): every thread of the agent, ended ones too,
        where /proc/<pid>/stat counts in clock ticks (10 ms)."""
        assert self.cgroup is not None, "the pod has not started"
        stat = self.cgroup / "cpu.stat"
        for line in stat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        raise AssertionError(f"{stat} has no usage_usec")

    def start(self) -> subprocess.Popen[str]:
        if os.geteuid() != 0:
            raise SystemExit("run as root: the harness makes namespaces and mounts")
        script = self.workdir / "pod.sh"
        script.write_text(self.script())
        namespaces = ["--mount"] if self.host_pid else ["--mount", "--pid", "--fork", "--kill-child"]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                ["unshare", *namespaces, "--", "sh", str(script)], stdout=log, stderr=subprocess.STDOUT, text=True
            )
        return self.process

    def agent_pid(self) -> int:
        """The agent's PID on the host: the unshare itself, or its child in a new PID namespace."""
        assert self.process is not None
        if self.host_pid:
            return self.process.pid
        deadline = time.monotonic() + 10
        while True:
            forked = children(self.process.pid)
            if forked:
                return forked[0]
            if time.monotonic() > deadline:
                raise SystemExit(f"the pod did not start; its log:\n{self.log.read_text()}")
            time.sleep(0.05)

    def evidence(self, workload_pid: int | None = None) -> dict[str, str]:
        """What the kernel says of the running agent: the pod's isolation, as it
        is; and, given a GPU workload's PID, its cgroup as the agent reads it."""
        pid = self.agent_pid()
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        root_mount = next(
            line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines() if line.split()[4] == "/"
        )
        return {
            "uid (real, effective, saved, fs)": " ".join(status["Uid"].split()),
            "gid": " ".join(status["Gid"].split()),
            "supplementary groups": status["Groups"].strip() or "none",
            "CapEff / CapPrm / CapBnd / CapAmb": " / ".join(
                status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")
            ),
            "NoNewPrivs": status["NoNewPrivs"].strip(),
            "PID namespace: agent / harness (host)": _namespaces("pid", pid),
            "cgroup namespace: agent / harness (host)": _namespaces("cgroup", pid),
            "agent's cgroup (host's view)": Path(f"/proc/{pid}/cgroup").read_text().strip().splitlines()[-1],
            "root mount options": root_mount[5],
            **(
                {
                    f"workload {workload_pid}'s cgroup, read in the agent's cgroup namespace": self._in_cgroupns(
                        pid, workload_pid
                    )
                }
                if workload_pid
                else {}
            ),
        }

    @staticmethod
    def _in_cgroupns(agent: int, workload: int) -> str:
        # /proc/<pid>/cgroup is written relative to the reader's cgroup
        # namespace: a private one shows other pods' cgroups as /../...
        read = ["nsenter", f"--cgroup=/proc/{agent}/ns/cgroup", "cat", f"/proc/{workload}/cgroup"]
        return subprocess.run(read, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]

    def stop(self) -> str:
        """SIGTERM to the agent, as the kubelet stops a container; its log."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.kill(self.agent_pid(), signal.SIGTERM)
                self.process.wait(timeout=15)
            except (subprocess.TimeoutExpired, SystemExit, ProcessLookupError):
                self.process.kill()
                self.process.wait()
        return self.log.read_text() if self.log.exists() else ""


def expand(value: str, defined: dict[str, str]) -> str:
    """`$(NAME)` replaced by an earlier variable's value and `$$` by `$`, as
    the kubelet expands a container's env; an unknown `$(NAME)` stays as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return defined.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", replace, value)


def _namespaces(kind: str, pid: int) -> str:
    return f"{os.readlink(f'/proc/{pid}/ns/{kind}')} / {os.readlink(f'/proc/self/ns/{kind}')}"
