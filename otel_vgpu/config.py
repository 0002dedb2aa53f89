"""The agent's configuration, and the one table of its flags.

Every flag has an environment twin (the OTLP flags, the SDK's variables); a flag on the
command line wins. The table below is the single source of `--help` (each entry's twin and
default are written into its help by `help_text`), of the flag table of docs/flags.md
(flag_table.py), which tests/unit/test_config.py checks against it, and of the defaults of
`Config`'s fields: each flag's field takes its default from the table by name (`_default`), so
that no default is written twice. What a flag declares is flag_spec.py's; how each flag's text
is read, flag_values.py's; the endpoint's bounds, limits.py's.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from otel_vgpu import __version__, flag_spec
from otel_vgpu.flag_spec import Action, Flag
from otel_vgpu.flag_values import (
    BUILTIN_SCENARIO,
    LOG_LEVEL_WORDS,
    RenamedVariable,
    gpu_resource,
    interval,
    kai_mode,
    kai_reservation,
    log_format,
    log_level_name,
    metric_patterns,
    namespaces,
    number,
    optional_path,
    otlp_names,
    scenario,
)
from otel_vgpu.limits import Limits

# A flag or environment value that cannot be used (one line), as a flag's own reading raises it too.
ConfigError = flag_spec.ConfigError

# Exit statuses: a bad flag, file or configuration; no GPU to read; the
# driver changed under a running agent (its container must restart to get
# the new driver's library).
EXIT_USAGE = 2
EXIT_NO_GPU = 1
EXIT_DRIVER_CHANGED = 3

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# Resources whose devices count as GPUs: the device plugin's own, its
# renamed replicas (renameByDefault) and its MIG resources (mixed strategy),
# the rule dcgm-exporter applies (exact name, or the `nvidia.com/mig-` prefix).
DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")
# DRA drivers whose devices are GPUs: the NVIDIA DRA driver.
DRA_DRIVERS = ("gpu.nvidia.com",)
# Where the GPU stack runs its MPS control daemon: the GPU Operator's namespace, the NVIDIA
# device plugin chart's usual one, and kube-system (GKE's). Tenants create no pods there.
DEFAULT_MPS_SERVER_NAMESPACES = ("gpu-operator", "nvidia-device-plugin", "kube-system")
# KAI Scheduler's reservation namespace, service account and app label by default
# (pkg/common/constants/constants.go, DefaultResourceReservationName; cmd/binder/app/options.go).
KAI_RESERVATION = "kai-resource-reservation"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Seconds to wait after a failure: `first`, doubling up to `most`."""

    first: float = 1.0
    most: float = 60.0


DEFAULT_BACKOFF = Backoff()


# The ratio file's default place: the working directory, as the image and the repository have it.
DEFAULT_ALLOCATION_FILE = Path("gpu_allocation.txt")
# A Kubernetes watch silent for 1.2 x its timeout plus this long is taken for hung.
KUBE_WATCH_GRACE_S = 5.0


FLAGS: tuple[Flag, ...] = (
    Flag("--port", "HTTP port", "OTEL_VGPU_PORT", number(int, "port", 1, 65535), 8080),
    Flag("--address", "address to listen on (IPv6 accepted)", "OTEL_VGPU_ADDRESS", str, "0.0.0.0"),
    Flag(
        "--allocation-file",
        "the vGPU ratio file (a whole number, or auto), reread when it changes; with --simulate and no file at the "
        "default path, the simulated node's ratio",
        "OTEL_VGPU_ALLOCATION_FILE",
        Path,
        DEFAULT_ALLOCATION_FILE,
    ),
    Flag(
        "--proc-root",
        "where to read /proc/<pid>/cgroup of GPU processes; the default is the host's when the agent shares "
        "the host's PID namespace, as it must",
        "OTEL_VGPU_PROC_ROOT",
        Path,
        Path("/proc"),
    ),
    Flag(
        "--node-name",
        "this node's name, in k8s.node.name (else NODE_NAME, else the simulated node's name, else the host name)",
        "OTEL_VGPU_NODE_NAME",
        str,
        "",
        fallback_env="NODE_NAME",
        shown_default="$NODE_NAME",
    ),
    Flag(
        "--simulate",
        "run on a simulated GPU node: the built-in one, or the scenario in FILE (YAML or JSON; see "
        "docs/scenario.md); in the environment, true or a file",
        "OTEL_VGPU_SIMULATE",
        scenario,
        action=Action.OPTIONAL,
        const=BUILTIN_SCENARIO,
        metavar="FILE",
    ),
    Flag(
        "--min-interval",
        "with --sweep-interval 0 only: oldest a sweep may be, in seconds, to serve a collection; "
        "collections closer together share one sweep, and scrapes one rendered body (with sweeps of the "
        "agent's own, a collection never sweeps: it serves the last sweep)",
        "OTEL_VGPU_MIN_INTERVAL",
        number(float, "interval", 0, 3600),
        1.0,
    ),
    Flag(
        "--sweep-interval",
        "mean seconds between the agent's own sweeps of NVML and /proc, which advance the usage counters "
        "(busy seconds, peak memory) and serve the scrapes and pushes in between; each wait is drawn at "
        "random from half to one and a half times this, so that no client can predict a sweep; 0: sweep "
        "only when scraped, pushed or probed, at instants a client can choose (docs/trust.md)",
        "OTEL_VGPU_SWEEP_INTERVAL",
        interval("interval", 3600, off="sweep only when collected"),
        2.0,
    ),
    Flag(
        "--watch-interval",
        "seconds between looks at each GPU's process list between sweeps, so that a process living "
        "between two sweeps is attributed and billed (collect/process_watch.py); 0: no watch, only the sweeps "
        "see processes",
        "OTEL_VGPU_WATCH_INTERVAL",
        interval("interval", 60, off="no watch"),
        0.25,
    ),
    Flag(
        "--gpu-idle-watts",
        "each GPU's power when idle with contexts open, which the energy split bills to the pods by "
        "the shares they hold; unset: learned per GPU, the lowest power over a sweep in which it was idle "
        "(0 until it has been idle once)",
        "OTEL_VGPU_GPU_IDLE_WATTS",
        number(float, "power", 0, 10000),
        metavar="WATTS",
        shown_default="learned",
    ),
    Flag(
        "--seed-metrics",
        "also expose the original exporter's pod_gpu_memory_used, pod_gpu_sm_util and pod_total_gpu_memory",
        "OTEL_VGPU_SEED_METRICS",
        action=Action.SWITCH,
        default=False,
    ),
    Flag(
        "--no-kubernetes",
        "do not use the Kubernetes API: pod names stay unresolved",
        "OTEL_VGPU_NO_KUBERNETES",
        action=Action.SWITCH,
        default=False,
    ),
    Flag(
        "--kubeconfig",
        "use this kubeconfig instead of the pod's service account",
        "OTEL_VGPU_KUBECONFIG",
        optional_path,
    ),
    Flag(
        "--service-account-dir",
        "the service account's token, ca.crt and namespace",
        "OTEL_VGPU_SERVICE_ACCOUNT_DIR",
        Path,
        SERVICE_ACCOUNT_DIR,
    ),
    Flag(
        "--pod-resources-socket",
        "the kubelet's pod-resources gRPC socket",
        "OTEL_VGPU_POD_RESOURCES_SOCKET",
        Path,
        POD_RESOURCES_SOCKET,
    ),
    Flag(
        "--kube-watch-seconds",
        "timeout of each Kubernetes watch; a watch silent for 1.2 times this plus "
        f"{KUBE_WATCH_GRACE_S:g} s is taken for hung and the pods are listed again",
        "OTEL_VGPU_KUBE_WATCH_SECONDS",
        number(int, "watch seconds", 1, 3600),
        300,
    ),
    Flag(
        "--pod-resources-interval",
        "seconds between calls to the kubelet's pod-resources API",
        "OTEL_VGPU_POD_RESOURCES_INTERVAL",
        interval("interval", 3600),
        5.0,
    ),
    Flag(
        "--no-pod-resources",
        "take vGPU shares from the pods' GPU limits, not the kubelet",
        "OTEL_VGPU_NO_POD_RESOURCES",
        action=Action.SWITCH,
        default=False,
    ),
    Flag(
        "--gpu-resource",
        "an extended resource whose devices count as vGPU shares, or a prefix ending in *; repeatable (in the "
        "environment, comma-separated); replaces the default list",
        "OTEL_VGPU_GPU_RESOURCE",
        gpu_resource,
        DEFAULT_RESOURCES,
        action=Action.APPEND,
        field="gpu_resources",
        metavar="NAME",
        renamed_from="OTEL_VGPU_GPU_RESOURCES",
    ),
    Flag(
        "--metric-allowlist",
        "publish only the families these comma-separated RE2 regular expressions name (each matched against the "
        "whole Prometheus or OpenTelemetry name, or the name under the semantic conventions), on the scrape and "
        "the OTLP push alike; a call to NVML that only turned-off families need is not made",
        "OTEL_VGPU_METRIC_ALLOWLIST",
        metric_patterns,
        (),
        metavar="PATTERNS",
        shown_default="unset",
    ),
    Flag(
        "--metric-denylist",
        "publish every family but those these patterns name (not with --metric-allowlist)",
        "OTEL_VGPU_METRIC_DENYLIST",
        metric_patterns,
        (),
        metavar="PATTERNS",
        shown_default="unset",
    ),
    Flag(
        "--mps-server-namespaces",
        "namespaces whose pods may run an MPS server, separated by commas: the GPU stack's, where only cluster "
        "operators create pods. A process named as the server in any other pod is that pod's, as any "
        "process, unless its GPU is in the EXCLUSIVE_PROCESS compute mode (docs/trust.md)",
        "OTEL_VGPU_MPS_SERVER_NAMESPACES",
        namespaces,
        DEFAULT_MPS_SERVER_NAMESPACES,
        metavar="NAMESPACES",
    ),
    Flag(
        "--kai",
        "KAI Scheduler's GPU fractions, from the BindRequests its scheduler writes (docs/kubernetes.md): auto, "
        "read once a pod of its reservation namespace runs on this node; on, from the start; off, never (its "
        "reservation pods are then pods as any other)",
        "OTEL_VGPU_KAI",
        kai_mode,
        "auto",
        metavar="{auto,on,off}",
    ),
    Flag(
        "--kai-reservation",
        "where KAI Scheduler's binder runs its reservation pods: their namespace, service account and app label, "
        "as its global.resourceReservation values name them, one left out being the namespace's name; Run:ai's "
        "is runai-reservation",
        "OTEL_VGPU_KAI_RESERVATION",
        kai_reservation,
        (KAI_RESERVATION,) * 3,
        metavar="NAMESPACE[/SERVICE_ACCOUNT[/APP_LABEL]]",
        shown_default=KAI_RESERVATION,
    ),
    Flag(
        "--by-container",
        "add a container label to the per-pod families",
        "OTEL_VGPU_BY_CONTAINER",
        action=Action.SWITCH,
        default=False,
    ),
    Flag(
        "--otlp-endpoint",
        "push metrics over OTLP to this Collector base URL (e.g. http://collector:4317); the push is also on "
        "when one of the variables is set. The SDK's other OTEL_EXPORTER_OTLP_* variables (headers, "
        "certificates, compression) apply to the push",
        metavar="URL",
        sdk_env=("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ),
    Flag(
        "--otlp-protocol",
        "OTLP protocol, grpc or http/protobuf",
        choices=("grpc", "http/protobuf"),
        shown_default="grpc",
        sdk_env=("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ),
    Flag(
        "--otlp-interval",
        "seconds between pushes; the variable is in milliseconds",
        parse=interval("interval", 86400),
        metavar="SECONDS",
        shown_default="60",
        sdk_env=("OTEL_METRIC_EXPORT_INTERVAL",),
    ),
    Flag(
        "--otlp-names",
        "the names the OTLP push speaks: vgpu, the agent's own, as a scrape serves them; semconv, OpenTelemetry's "
        "semantic conventions (hw.gpu.utilization, hw.energy, ...; a Resource per pod with k8s.pod.uid, "
        "k8s.pod.name and k8s.namespace.name: docs/metrics.md). The scrape is the same with either",
        "OTEL_VGPU_OTLP_NAMES",
        otlp_names,
        "vgpu",
        metavar="{vgpu,semconv}",
    ),
    Flag("--tls-cert-file", "serve HTTPS with this certificate (PEM)", "OTEL_VGPU_TLS_CERT_FILE", optional_path),
    Flag("--tls-key-file", "the certificate's private key (PEM)", "OTEL_VGPU_TLS_KEY_FILE", optional_path),
    Flag(
        "--tls-client-ca-file",
        "require client certificates signed by this CA: mutual TLS",
        "OTEL_VGPU_TLS_CLIENT_CA_FILE",
        optional_path,
    ),
    Flag(
        "--basic-auth-file",
        "require basic auth on /metrics: a file of user:hash lines, bcrypt or sha256:<hex>",
        "OTEL_VGPU_BASIC_AUTH_FILE",
        optional_path,
    ),
    Flag("--log-level", f"{LOG_LEVEL_WORDS}; any case", "OTEL_VGPU_LOG_LEVEL", log_level_name, "info"),
    Flag(
        "--log-format",
        "text, one line a person reads; json, one object a line; logfmt, key=value pairs. json and logfmt "
        "give the time (RFC 3339, UTC), level, logger, message and each field of a line apart, for log pipelines",
        "OTEL_VGPU_LOG_FORMAT",
        log_format,
        "text",
        metavar="{text,json,logfmt}",
    ),
)
_BY_FIELD = {flag.dest: flag for flag in FLAGS}


# The key, in a Config field's metadata, of the flag that fills it and gives its default.
FLAG_KEY = "flag"


def _default(name: str) -> Any:
    """Config field `name`, its default its flag's, the flag named in its metadata: so a field
    fed by FLAGS is told from a timer, and no flag's default is written a second time."""
    flag = _BY_FIELD[name]
    return field(default=flag.default, metadata={FLAG_KEY: flag.name})


def flag_or_variable(dest: str) -> str:
    """How a Config field is given, for a message naming one not given: `--port or OTEL_VGPU_PORT`."""
    flag = _BY_FIELD[dest]
    return f"{flag.name} or {flag.env}" if flag.env else flag.name


# Timer defaults of the sweep's reads (collect/reading.py), written once here.
# How long a GPU that answered NOT_SUPPORTED for per-process utilization is left alone.
ASK_AGAIN_S = 300.0
# How often each GPU's energy counter is read: a read costs more CPU than the rest of a
# sweep of the GPU (3.9 ms on an H200, bench/results/h200-sweep-cost.md), and the energy
# between reads is split over the sweeps it covers, so reading it every sweep buys nothing
# but finer steps of the joules counters.
ENERGY_EVERY_S = 10.0
# How long an engine window lasts. Each read of one of the GPU's sample buffers costs
# 2.7 ms of CPU on an H200, as much as the rest of a sweep of the GPU, and each buffer
# holds its last 14 s (71 samples 200 ms apart: bench/results/h200-engine-figures.md):
# read every 10 s, a buffer still holds every sample since the last read, so the windows
# lose nothing of the GPU's figure, at a fifth of the reads a sweep every 2 s would make.
ENGINE_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class Config:
    """What the agent runs with: a field per flag, its default the flag's (FLAGS), and timers
    that are no flag's business."""

    port: int = _default("port")
    address: str = _default("address")
    allocation_file: Path = _default("allocation_file")
    proc_root: Path = _default("proc_root")
    node_name: str = _default("node_name")
    """Empty: the simulated node's name, else the host name."""
    simulate: str | None = _default("simulate")
    """None: NVML; `builtin` or a scenario file: the simulated node."""
    min_interval: float = _default("min_interval")
    sweep_interval: float = _default("sweep_interval")
    """0: no sweeps of the agent's own (docs/metrics.md has what each interval costs)."""
    watch_interval: float = _default("watch_interval")
    """0: no process watch between sweeps."""
    gpu_idle_watts: float | None = _default("gpu_idle_watts")
    """None: learned per GPU (collect/usage.py)."""
    seed_metrics: bool = _default("seed_metrics")
    no_kubernetes: bool = _default("no_kubernetes")
    kubeconfig: Path | None = _default("kubeconfig")
    service_account_dir: Path = _default("service_account_dir")
    pod_resources_socket: Path = _default("pod_resources_socket")
    kube_watch_seconds: int = _default("kube_watch_seconds")
    pod_resources_interval: float = _default("pod_resources_interval")
    no_pod_resources: bool = _default("no_pod_resources")
    gpu_resources: tuple[str, ...] = _default("gpu_resources")
    metric_allowlist: tuple[str, ...] = _default("metric_allowlist")
    """Patterns of the families to publish; empty: all."""
    metric_denylist: tuple[str, ...] = _default("metric_denylist")
    """Patterns of the families not to publish."""
    mps_server_namespaces: tuple[str, ...] = _default("mps_server_namespaces")
    """Namespaces whose pods may run an MPS server (collect/trust.py): only cluster operators create pods there."""
    kai: str = _default("kai")
    """auto, on or off: KAI Scheduler's BindRequests read (kubernetes/bind_requests.py)."""
    kai_reservation: tuple[str, str, str] = _default("kai_reservation")
    """The namespace, service account and app label of KAI's reservation pods (allocation/kai.py)."""
    by_container: bool = _default("by_container")
    otlp_endpoint: str | None = _default("otlp_endpoint")
    otlp_protocol: str | None = _default("otlp_protocol")
    otlp_interval: float | None = _default("otlp_interval")
    otlp_names: str = _default("otlp_names")
    """vgpu or semconv: the names of the OTLP push (export/semconv.py)."""
    tls_cert_file: Path | None = _default("tls_cert_file")
    tls_key_file: Path | None = _default("tls_key_file")
    tls_client_ca_file: Path | None = _default("tls_client_ca_file")
    basic_auth_file: Path | None = _default("basic_auth_file")
    log_level: str = _default("log_level")
    log_format: str = _default("log_format")
    # Timers that are no flag's business; tests shorten them.
    kube_backoff: Backoff = field(default_factory=Backoff)
    """Between lists of a failing Kubernetes API."""
    nvml_backoff: Backoff = field(default_factory=Backoff)
    """Between attempts to initialise NVML while the driver does not answer."""
    kube_watch_grace_s: float = KUBE_WATCH_GRACE_S
    """A watch silent for 1.2 x kube_watch_seconds plus this long is taken for hung."""
    first_sync_wait_s: float = 3.0
    """How long start-up waits for the first list of pods, so the first scrape has names."""
    energy_every_s: float = ENERGY_EVERY_S
    """How often each GPU's energy counter is read (ENERGY_EVERY_S above says why)."""
    engine_every_s: float = ENGINE_EVERY_S
    """How long each GPU's engine windows last (ENGINE_EVERY_S above says why)."""
    credentials_check_s: float = 2.0
    """How often the TLS files and the users file are looked at for a new version."""
    ask_again_s: float = ASK_AGAIN_S
    """How long a GPU whose NVML cannot report per-process utilization is left alone before it is asked again."""
    limits: Limits = field(default_factory=Limits)
    """The endpoint's bounds on every client (limits.py; endpoint/server.py and the modules beside it apply them)."""
    given: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Where each field's value came from, by field: the flag (`--simulate`) or the variable
    (`OTEL_VGPU_SIMULATE`, `NODE_NAME`); a field not here holds its default. Only for messages,
    so that an error names what the operator wrote; two configs of equal values are equal."""
    renamed: tuple[RenamedVariable, ...] = field(default=(), compare=False)
    """Variables set under a former name, for a warning once logging is set up (cli.py)."""

    def origin(self, dest: str) -> str:
        """The flag or variable field `dest` came from; its flag where it holds the default."""
        return self.given.get(dest) or _BY_FIELD[dest].name

    def spelled(self, dest: str) -> str:
        """Field `dest` as the operator gave it, to begin a message: `--simulate /x.yaml` or
        `OTEL_VGPU_SIMULATE=/x.yaml`; its flag and value where it holds the default."""
        value = getattr(self, dest)
        text = ",".join(str(item) for item in value) if isinstance(value, tuple) else str(value)
        origin = self.origin(dest)
        return f"{origin} {text}" if origin.startswith("-") else f"{origin}={text}"


HELP_HELP = "print this list and exit"
VERSION_HELP = "print the version and exit"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: it lands in a pod's log.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line, from FLAGS: every flag's value is None unless given."""
    parser = _Parser(
        prog="otel-vgpu",
        description="Per-pod usage of shared NVIDIA GPUs, served as OpenTelemetry metrics on /metrics. "
        "Every flag can also be set through the environment variable shown.",
        add_help=False,
    )
    parser.add_argument("-h", "--help", action="help", help=HELP_HELP)
    for flag in FLAGS:
        common: dict[str, Any] = {"dest": flag.dest, "default": None, "help": flag.help_text()}
        if flag.action is Action.SWITCH:
            parser.add_argument(flag.name, action="store_true", **common)
            continue
        common.update(type=flag.parse, metavar=flag.metavar, choices=flag.choices)
        if flag.action is Action.APPEND:
            parser.add_argument(flag.name, action="append", **common)
        elif flag.action is Action.OPTIONAL:
            parser.add_argument(flag.name, nargs="?", const=flag.const, **common)
        else:
            parser.add_argument(flag.name, **common)
    parser.add_argument("--version", action="version", version=f"otel-vgpu {__version__}", help=VERSION_HELP)
    return parser


def parse_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Flags, else their environment twins (else a fallback variable), else the defaults. A bad
    flag exits 2 (argparse); a bad environment value raises ConfigError."""
    env = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    renamed: list[RenamedVariable] = []
    for flag in FLAGS:
        given = getattr(args, flag.dest)
        if flag.renamed_from and flag.env and env.get(flag.renamed_from):
            winner = flag.name if given is not None else (flag.env if env.get(flag.env) else None)
            renamed.append(RenamedVariable(flag.renamed_from, flag.env, winner))
        if given is None:
            names = (flag.env, flag.renamed_from, flag.fallback_env)
            variable = next((name for name in names if name and env.get(name)), None)
            if variable is None:
                continue
            given = flag.from_text(env[variable], variable)
            origins[flag.dest] = variable
        else:
            origins[flag.dest] = flag.name
        values[flag.dest] = tuple(given) if isinstance(given, list) else given
    config = replace(Config(), given=origins, renamed=tuple(renamed), **values)
    # The one rule between flags: kube-state-metrics' two lists are exclusive too.
    if config.metric_allowlist and config.metric_denylist:
        raise ConfigError(
            f"{config.spelled('metric_allowlist')} and {config.spelled('metric_denylist')} are mutually exclusive, "
            "as kube-state-metrics' are: give one list, the families to publish or those not to"
        )
    return config
