"""Command line: flags (each with an OTEL_VGPU_* twin), start-up, shutdown."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import ssl
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from otel_vgpu import __version__
from otel_vgpu.allocation import DEFAULT_RESOURCES
from otel_vgpu.attribution import Attributor, ProcReader
from otel_vgpu.auth import BasicAuth
from otel_vgpu.kube import SERVICE_ACCOUNT_DIR
from otel_vgpu.podresources import DEFAULT_SOCKET
from otel_vgpu.ratio import RatioFileError, RatioSource
from otel_vgpu.sampler import Sampler, SweepObserver
from otel_vgpu.sources import EXIT_USAGE, KubeSettings, SourceError
from otel_vgpu.sources import build as build_sources

log = logging.getLogger("otel_vgpu")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}
LOG_LEVELS = ("debug", "info", "warning", "error")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: it lands in a pod's log.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _env(name: str, default: str) -> str:
    return os.environ.get(f"OTEL_VGPU_{name}", default)


def _env_flag(name: str) -> bool:
    raw = _env(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"OTEL_VGPU_{name}={raw!r}: expected true or false")


def _number(kind: type[int] | type[float], what: str, low: float, high: float, low_open: bool = False) -> Any:
    """An argparse type: a number of `kind` within [low, high] ((low, high] with low_open)."""
    whole = kind is int
    valid = (
        f"a whole number {low:g}-{high:g}"
        if whole
        else f"a number {'above' if low_open else 'from'} {low:g}{'' if low_open else f' to {high:g}'}"
    )

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: expected {valid}") from None
        if not (low < value if low_open else low <= value) or value > high:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: expected {valid}")
        return value

    return parse


_port = _number(int, "port", 1, 65535)
_interval = _number(float, "interval", 0, 3600)
_watch_seconds = _number(int, "watch seconds", 1, 3600)
_positive_seconds = _number(float, "seconds", 0, 86400, low_open=True)


def _log_level(text: str) -> str:
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"invalid log level {text!r}: expected one of {', '.join(LOG_LEVELS)}")
    return text.lower()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="otel-vgpu",
        description="Per-pod usage of shared NVIDIA GPUs, served as OpenTelemetry metrics on /metrics. "
        "Every flag can also be set through the environment variable shown.",
    )
    add = parser.add_argument
    add("--port", type=_port, default=_env("PORT", "8080"), help="HTTP port (OTEL_VGPU_PORT; default 8080)")
    add(
        "--address",
        default=_env("ADDRESS", "0.0.0.0"),
        help="address to listen on (OTEL_VGPU_ADDRESS; default 0.0.0.0)",
    )
    add(
        "--allocation-file",
        type=Path,
        default=Path(_env("ALLOCATION_FILE", "gpu_allocation.txt")),
        help="the vGPU ratio file, reread when it changes (OTEL_VGPU_ALLOCATION_FILE; default gpu_allocation.txt)",
    )
    add(
        "--proc-root",
        type=Path,
        default=Path(_env("PROC_ROOT", "/proc")),
        help="where to read /proc/<pid>/cgroup of GPU processes; the default is the host's when the agent "
        "shares the host's PID namespace, as it must (OTEL_VGPU_PROC_ROOT; default /proc)",
    )
    add(
        "--node-name",
        default=_env("NODE_NAME", os.environ.get("NODE_NAME", "")),
        help="this node's name, in k8s.node.name (OTEL_VGPU_NODE_NAME, else NODE_NAME, "
        "else the simulated node's name, else the host name)",
    )
    add(
        "--simulate",
        nargs="?",
        const="builtin",
        default=_simulate_default(),
        metavar="FILE",
        help="run on a simulated GPU node: the built-in one, or the scenario in FILE (YAML or JSON; see "
        "docs/scenario.md) (OTEL_VGPU_SIMULATE: true or a file)",
    )
    add(
        "--min-interval",
        type=_interval,
        default=_env("MIN_INTERVAL", "1"),
        help="oldest a sweep may be, in seconds, to serve a collection; collections closer together share "
        "one sweep (OTEL_VGPU_MIN_INTERVAL; default 1)",
    )
    add(
        "--seed-metrics",
        action="store_true",
        default=None,
        help="also expose the original exporter's pod_gpu_memory_used, pod_gpu_sm_util and "
        "pod_total_gpu_memory (OTEL_VGPU_SEED_METRICS)",
    )
    add(
        "--no-kubernetes",
        action="store_true",
        default=None,
        help="do not use the Kubernetes API: pod names stay unresolved (OTEL_VGPU_NO_KUBERNETES)",
    )
    add(
        "--kubeconfig",
        type=Path,
        default=_path_env("KUBECONFIG"),
        help="use this kubeconfig instead of the pod's service account (OTEL_VGPU_KUBECONFIG)",
    )
    add(
        "--service-account-dir",
        type=Path,
        default=Path(_env("SERVICE_ACCOUNT_DIR", str(SERVICE_ACCOUNT_DIR))),
        help=f"the service account's token, ca.crt and namespace (OTEL_VGPU_SERVICE_ACCOUNT_DIR; "
        f"default {SERVICE_ACCOUNT_DIR})",
    )
    add(
        "--pod-resources-socket",
        type=Path,
        default=Path(_env("POD_RESOURCES_SOCKET", str(DEFAULT_SOCKET))),
        help=f"the kubelet's pod-resources gRPC socket (OTEL_VGPU_POD_RESOURCES_SOCKET; default {DEFAULT_SOCKET})",
    )
    add(
        "--kube-watch-seconds",
        type=_watch_seconds,
        default=_env("KUBE_WATCH_SECONDS", "300"),
        help="timeout of each Kubernetes watch; a watch silent for 1.2 times this plus 5 s is taken for "
        "hung and the pods are listed again (OTEL_VGPU_KUBE_WATCH_SECONDS; default 300)",
    )
    add(
        "--pod-resources-interval",
        type=_interval,
        default=_env("POD_RESOURCES_INTERVAL", "5"),
        help="seconds between calls to the kubelet's pod-resources API (OTEL_VGPU_POD_RESOURCES_INTERVAL; default 5)",
    )
    add(
        "--no-pod-resources",
        action="store_true",
        default=None,
        help="take vGPU shares from the pods' GPU limits, not the kubelet (OTEL_VGPU_NO_POD_RESOURCES)",
    )
    add(
        "--gpu-resource",
        action="append",
        default=None,
        metavar="NAME",
        help="an extended resource whose devices count as vGPU shares; repeatable (OTEL_VGPU_GPU_RESOURCES, "
        f"comma-separated; default {', '.join(DEFAULT_RESOURCES)})",
    )
    add(
        "--by-container",
        action="store_true",
        default=None,
        help="add a container label to the per-pod families (OTEL_VGPU_BY_CONTAINER)",
    )
    add(
        "--otlp-endpoint",
        default=None,
        metavar="URL",
        help="push metrics over OTLP to this Collector base URL (e.g. http://collector:4317); also on when "
        "OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set",
    )
    add(
        "--otlp-protocol",
        choices=("grpc", "http/protobuf"),
        default=None,
        help="OTLP protocol (default OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)",
    )
    add(
        "--otlp-interval",
        type=_positive_seconds,
        default=None,
        metavar="SECONDS",
        help="seconds between pushes (default OTEL_METRIC_EXPORT_INTERVAL in ms, else 60)",
    )
    add(
        "--tls-cert-file",
        type=Path,
        default=_path_env("TLS_CERT_FILE"),
        help="serve HTTPS with this certificate (PEM) (OTEL_VGPU_TLS_CERT_FILE)",
    )
    add(
        "--tls-key-file",
        type=Path,
        default=_path_env("TLS_KEY_FILE"),
        help="the certificate's private key (PEM) (OTEL_VGPU_TLS_KEY_FILE)",
    )
    add(
        "--tls-client-ca-file",
        type=Path,
        default=_path_env("TLS_CLIENT_CA_FILE"),
        help="require client certificates signed by this CA: mutual TLS (OTEL_VGPU_TLS_CLIENT_CA_FILE)",
    )
    add(
        "--basic-auth-file",
        type=Path,
        default=_path_env("BASIC_AUTH_FILE"),
        help="require basic auth on /metrics: a file of user:hash lines, bcrypt or sha256:<hex> "
        "(OTEL_VGPU_BASIC_AUTH_FILE)",
    )
    add(
        "--log-level",
        type=_log_level,
        default=_env("LOG_LEVEL", "info"),
        help=f"one of {', '.join(LOG_LEVELS)} (OTEL_VGPU_LOG_LEVEL; default info)",
    )
    add("--version", action="version", version=f"otel-vgpu {__version__}")
    return parser


def _path_env(name: str) -> Path | None:
    raw = _env(name, "").strip()
    return Path(raw) if raw else None


def _simulate_default() -> str | None:
    raw = _env("SIMULATE", "").strip()
    if raw.lower() in _FALSE:
        return None
    return "builtin" if raw.lower() in _TRUE else raw


def _fail(message: str, status: int) -> NoReturn:
    print(f"otel-vgpu: error: {message}", file=sys.stderr)
    raise SystemExit(status)


class _ErrorSink:
    """Counts errors of background sources, which start before the
    telemetry exists: errors until then are held and handed over."""

    def __init__(self) -> None:
        self._observer: SweepObserver | None = None
        self._held: list[str] = []
        self._lock = threading.Lock()

    def attach(self, observer: SweepObserver) -> None:
        with self._lock:
            self._observer = observer
            held, self._held = self._held, []
        for stage in held:
            observer.error(stage)

    def __call__(self, stage: str) -> None:
        with self._lock:
            if self._observer is None:
                self._held.append(stage)
                return
        self._observer.error(stage)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        for flag in ("seed_metrics", "no_kubernetes", "no_pod_resources", "by_container"):
            if getattr(args, flag) is None:
                setattr(args, flag, _env_flag(flag.upper()))
        if args.gpu_resource is None:
            raw = _env("GPU_RESOURCES", ",".join(DEFAULT_RESOURCES))
            args.gpu_resource = [name.strip() for name in raw.split(",") if name.strip()]
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    # The HTTP clients log every request at INFO: a watch every few minutes,
    # a list after each outage. Their failures reach the agent's own log.
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))

    try:
        ratio = RatioSource(args.allocation_file)
    except RatioFileError as error:
        _fail(str(error), EXIT_USAGE)
    from otel_vgpu.otlp import settings_from  # noqa: PLC0415

    try:
        otlp = settings_from(args.otlp_endpoint, args.otlp_protocol, args.otlp_interval)
        endpoint = _endpoint_security(args)
    except ValueError as error:
        _fail(str(error), EXIT_USAGE)

    node_name = args.node_name or _scenario_node_name(args.simulate) or socket.gethostname()
    errors = _ErrorSink()
    kube = KubeSettings(
        enabled=not args.no_kubernetes,
        kubeconfig=args.kubeconfig,
        service_account_dir=args.service_account_dir,
        pod_resources=not args.no_pod_resources,
        pod_resources_socket=args.pod_resources_socket,
        pod_resources_interval=args.pod_resources_interval,
        resources=tuple(args.gpu_resource),
        watch_seconds=args.kube_watch_seconds,
    )
    try:
        sources = build_sources(args.simulate, args.proc_root, node_name, kube, errors)
    except SourceError as error:
        _fail(str(error), error.status)
    # Imported here so that a bad flag or file fails before the SDK loads.
    from otel_vgpu.server import Server, make_app  # noqa: PLC0415
    from otel_vgpu.telemetry import Telemetry  # noqa: PLC0415

    sampler = Sampler(
        sources.backend,
        attributor=Attributor(ProcReader(sources.proc_root)),
        directory=sources.directory,
        allocation=sources.allocation,
        ratio=ratio,
        by_container=args.by_container,
    )
    telemetry = Telemetry(sampler, args.min_interval, node_name, args.seed_metrics, otlp=otlp)
    sampler.observe(telemetry)
    errors.attach(telemetry)
    try:
        app = make_app(telemetry, sampler, max(args.min_interval, 1.0), endpoint.auth)
        server = Server(args.address, args.port, app, endpoint.ssl_context)
    except OSError as error:
        sources.close()
        _fail(f"cannot listen on {args.address}:{args.port}: {error.strerror or error}", EXIT_USAGE)

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    if otlp is not None:
        log.info(
            "pushing OTLP (%s) every %g s to %s",
            otlp.protocol,
            otlp.interval_s,
            otlp.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint",
        )
    log.info(
        "serving %s://%s:%d/metrics (ratio %g from %s, node %s)",
        "https" if endpoint.ssl_context else "http",
        args.address,
        server.port,
        ratio.ratio,
        args.allocation_file,
        node_name,
    )
    stop.wait()
    server.stop()
    telemetry.shutdown()
    sources.close()
    return 0


@dataclass(frozen=True, slots=True)
class _Endpoint:
    ssl_context: ssl.SSLContext | None
    auth: BasicAuth | None


def _endpoint_security(args: argparse.Namespace) -> _Endpoint:
    """TLS and basic auth for the endpoint; ValueError with one line if unusable."""
    from otel_vgpu.auth import AuthFileError, load_users  # noqa: PLC0415
    from otel_vgpu.server import tls_context  # noqa: PLC0415

    context = None
    if (args.tls_cert_file is None) != (args.tls_key_file is None):
        raise ValueError("--tls-cert-file and --tls-key-file go together")
    if args.tls_client_ca_file is not None and args.tls_cert_file is None:
        raise ValueError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
    if args.tls_cert_file is not None:
        try:
            context = tls_context(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
        except (OSError, ssl.SSLError) as error:
            files = ", ".join(str(f) for f in (args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file) if f)
            raise ValueError(f"cannot use the TLS files {files}: {error}") from None
    auth = None
    if args.basic_auth_file is not None:
        try:
            auth = BasicAuth(load_users(args.basic_auth_file))
        except AuthFileError as error:
            raise ValueError(str(error)) from None
    return _Endpoint(ssl_context=context, auth=auth)


def _scenario_node_name(simulate: str | None) -> str | None:
    """The `node:` of the scenario, read before the sources start: the
    Kubernetes directory watches pods by node name."""
    if simulate is None:
        return None
    from otel_vgpu.scenario import ScenarioError, load_scenario  # noqa: PLC0415

    try:
        return load_scenario(simulate).node_name
    except ScenarioError:
        return None  # reported when the sources are built
