"""Command line: flags (each with an OTEL_VGPU_* twin), start-up, shutdown."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from otel_vgpu import __version__
from otel_vgpu.allocation import AllocationSource, UnknownAllocation
from otel_vgpu.attribution import Attributor, ProcReader
from otel_vgpu.gpu import GpuBackend
from otel_vgpu.pods import PodDirectory, UnresolvedDirectory
from otel_vgpu.ratio import RatioFileError, RatioSource
from otel_vgpu.sampler import Sampler

log = logging.getLogger("otel_vgpu")
EXIT_USAGE = 2
EXIT_NO_GPU = 1
# /readyz answers ready while a sweep succeeded this recently (or the probe's
# own sweep succeeds).
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


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: expected a whole number 1-65535") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: expected a whole number 1-65535")
    return value


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid interval {text!r}: expected seconds >= 0, e.g. 1") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"invalid interval {text!r}: expected seconds from 0 to 3600")
    return value


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
        help="the host's /proc, for /proc/<pid>/cgroup of GPU processes (OTEL_VGPU_PROC_ROOT; default /proc)",
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
        "--log-level",
        type=_log_level,
        default=_env("LOG_LEVEL", "info"),
        help=f"one of {', '.join(LOG_LEVELS)} (OTEL_VGPU_LOG_LEVEL; default info)",
    )
    add("--version", action="version", version=f"otel-vgpu {__version__}")
    return parser


def _simulate_default() -> str | None:
    raw = _env("SIMULATE", "").strip()
    if raw.lower() in _FALSE:
        return None
    return "builtin" if raw.lower() in _TRUE else raw


@dataclass(frozen=True, slots=True)
class Sources:
    backend: GpuBackend
    proc_root: Path
    directory: PodDirectory
    allocation: AllocationSource


def _fail(message: str, status: int) -> NoReturn:
    print(f"otel-vgpu: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def _sources(args: argparse.Namespace) -> Sources:
    if args.simulate is not None:
        from otel_vgpu.scenario import ScenarioError, load_scenario  # noqa: PLC0415
        from otel_vgpu.simulate import SimulatedNode  # noqa: PLC0415

        try:
            scenario = load_scenario(args.simulate)
        except ScenarioError as error:
            _fail(str(error), EXIT_USAGE)
        node = SimulatedNode(scenario)
        log.warning(
            "simulated GPU node (%s): %d GPUs, %d pods; proc tree in %s",
            args.simulate,
            len(scenario.gpus),
            len(scenario.pods),
            node.proc_root,
        )
        return Sources(backend=node, proc_root=node.proc_root, directory=node.directory(), allocation=node)

    from otel_vgpu.nvml import NvmlBackend, NvmlUnavailable  # noqa: PLC0415

    try:
        backend = NvmlBackend()
    except NvmlUnavailable as error:
        _fail(str(error), EXIT_NO_GPU)
    log.info("pod names are not resolved yet: the pod label holds the pod UID")
    return Sources(
        backend=backend, proc_root=args.proc_root, directory=UnresolvedDirectory(), allocation=UnknownAllocation()
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.seed_metrics is None:
            args.seed_metrics = _env_flag("SEED_METRICS")
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )

    try:
        ratio = RatioSource(args.allocation_file)
    except RatioFileError as error:
        _fail(str(error), EXIT_USAGE)

    sources = _sources(args)
    # Imported here so that a bad flag or file fails before the SDK loads.
    from otel_vgpu.server import Server, make_app  # noqa: PLC0415
    from otel_vgpu.telemetry import Telemetry  # noqa: PLC0415

    sampler = Sampler(
        sources.backend,
        attributor=Attributor(ProcReader(sources.proc_root)),
        directory=sources.directory,
        allocation=sources.allocation,
        ratio=ratio,
    )
    scenario = getattr(sources.backend, "scenario", None)
    node_name = args.node_name or (scenario and scenario.node_name) or socket.gethostname()
    telemetry = Telemetry(sampler, args.min_interval, node_name, args.seed_metrics)
    sampler.observe(telemetry)
    try:
        server = Server(args.address, args.port, make_app(telemetry, sampler, max(args.min_interval, 1.0)))
    except OSError as error:
        sources.backend.close()
        _fail(f"cannot listen on {args.address}:{args.port}: {error.strerror or error}", EXIT_USAGE)

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    log.info(
        "serving http://%s:%d/metrics (ratio %g from %s, node %s)",
        args.address,
        server.port,
        ratio.ratio,
        args.allocation_file,
        node_name,
    )
    stop.wait()
    server.stop()
    telemetry.shutdown()
    sources.backend.close()
    return 0
