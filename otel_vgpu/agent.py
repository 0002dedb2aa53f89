"""The agent, built from a `Config`, started and stopped: the one place that wires it.

Order of construction, each part handed what it needs and nothing wired
afterwards:

1. `AgentHealth`: every part that can fail reports to it;
2. the ratio file, the endpoint's TLS and auth, the OTLP settings: a bad one
   stops the agent before anything runs;
3. the GPU backend (NVML, or the simulated node, only ever when asked) and
   the proc root;
4. the pod directory and the allocation: the Kubernetes API and the
   kubelet's pod-resources API in a cluster, else the simulated node's or none;
5. the sampler, the telemetry (meter provider, readers, instruments), the
   HTTP server, bound but not serving.

`start()` serves and starts the background threads; `stop()` ends them in
reverse order. Simulation is only ever chosen explicitly (`simulate`).

What every run needs is imported at the top. Imported where used: the
OpenTelemetry SDK (a bad flag or file fails before it loads), and what only
some runs use, each costing memory a node without it should not pay
(bench/scrape_bench.py, part 5): the scenario reader and the simulated node,
NVML, the Kubernetes clients.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otel_vgpu.agent_health import AgentHealth
from otel_vgpu.allocation.ratio import RatioFileError, RatioSource
from otel_vgpu.allocation.shares import AllocationSource, UnknownAllocation
from otel_vgpu.collect.device_health import DeviceHealth
from otel_vgpu.collect.process_watch import ProcessWatch
from otel_vgpu.collect.reading import GpuReader, Read
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.collect.sweeper import Sweeper
from otel_vgpu.collect.xids import XidCounts, XidWatch
from otel_vgpu.config import (
    DEFAULT_ALLOCATION_FILE,
    EXIT_DRIVER_CHANGED,
    EXIT_NO_GPU,
    EXIT_USAGE,
    Config,
    flag_or_variable,
)
from otel_vgpu.endpoint.auth import AuthFileError, BasicAuth, load_users
from otel_vgpu.endpoint.reload import CredentialWatch, Watched
from otel_vgpu.endpoint.server import Server
from otel_vgpu.endpoint.tls import server_context
from otel_vgpu.export.families import Family, reads_of, selected
from otel_vgpu.export.sdk_internals import SdkMismatch
from otel_vgpu.gpu.backend import GpuBackend
from otel_vgpu.pods.attribution import Attributor, ProcReader
from otel_vgpu.pods.directory import PodDirectory, UnresolvedDirectory
from otel_vgpu.sim.scenario import Scenario, ScenarioError, sm_asked
from otel_vgpu.wording import counted, host_in_url

if TYPE_CHECKING:
    from otel_vgpu.kubernetes.list_watch import WatchSettings

log = logging.getLogger("otel_vgpu")


class StartupError(Exception):
    """The agent cannot start. `status` is the exit status; the message is one line."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class _Sources:
    backend: GpuBackend
    proc_root: Path
    directory: PodDirectory
    allocation: AllocationSource
    node_name: str


class Agent:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.health = AgentHealth()
        self._closers: list[Callable[[], None]] = []
        self.stopping = threading.Event()
        """Set when the agent should stop: a signal, or a driver it cannot use any more."""
        self.exit_status = 0
        self._watching: WatchSettings | None = None
        """The Kubernetes API's client and timers, shared by the watches (None without the API)."""
        self._scenario = self._load_scenario()
        self.ratio = self._ratio_source()
        self._check_proc_root()
        # The SDK loads from here on: a bad flag or file has failed before, in a few milliseconds.
        from otel_vgpu.export.otlp import settings_from  # noqa: PLC0415

        try:
            self.otlp = settings_from(
                config.otlp_endpoint, config.otlp_protocol, config.otlp_interval, config.otlp_names
            )
            ssl_context, auth = _endpoint_security(config)
        except ValueError as error:
            raise StartupError(str(error), EXIT_USAGE) from None
        self.families = _selected_families(config)
        sources = self._gpu_sources()
        self._backend = sources.backend
        self._closers.append(sources.backend.close)
        self.node_name = sources.node_name
        try:
            self._attach_kubernetes(sources)
            self.sampler = self._sampler(sources)
            self._watch_node()
            self._export(ssl_context, auth)
        except BaseException:
            self.close()
            raise

    def _sampler(self, sources: _Sources) -> Sampler:
        config = self.config
        return Sampler(
            sources.backend,
            attributor=Attributor(ProcReader(sources.proc_root)),
            directory=sources.directory,
            allocation=sources.allocation,
            ratio=self.ratio,
            health=self.health,
            by_container=config.by_container,
            on_driver_changed=self._driver_changed,
            idle_watts=config.gpu_idle_watts,
            mps_server_namespaces=config.mps_server_namespaces,
            reader=GpuReader(
                sources.backend,
                ask_again_s=config.ask_again_s,
                energy_every_s=config.energy_every_s,
                engine_every_s=config.engine_every_s,
                reads=reads_of(self.families),
            ),
        )

    def _export(self, ssl_context: ssl.SSLContext | None, auth: BasicAuth | None) -> None:
        """The telemetry (meter provider, readers, instruments) and the endpoint, bound but not serving."""
        from otel_vgpu.endpoint.paths import Endpoint  # noqa: PLC0415
        from otel_vgpu.export.telemetry import Telemetry  # noqa: PLC0415

        config = self.config
        reads = reads_of(self.families)
        devices = self.devices = DeviceHealth(self.sampler, self.health) if Read.HEALTH in reads else None
        self.xids = XidCounts() if Read.XID_EVENTS in reads else None
        try:
            self.telemetry = Telemetry(
                self.sampler,
                self.health,
                config.min_interval,
                self.node_name,
                config.seed_metrics,
                otlp=self.otlp,
                families=self.families,
                devices=devices,
                xids=self.xids,
            )
        except SdkMismatch as error:
            raise StartupError(str(error), EXIT_USAGE) from None
        self._closers.append(self.telemetry.shutdown)
        self.endpoint = Endpoint(
            self.telemetry,
            self.sampler,
            max(config.min_interval, 1.0),
            auth,
            client_certificates=config.tls_client_ca_file is not None,
            limits=config.limits,
        )
        self._closers.append(self.endpoint.close)
        try:
            self.server = Server(
                config.address,
                config.port,
                self.endpoint,
                ssl_context,
                config.limits,
                credentials=config.basic_auth_file is not None,
            )
        except OSError as error:
            where = f"{host_in_url(config.address)}:{config.port}"
            given = f"{config.spelled('address')}, {config.spelled('port')}"
            address = f"; choose an address of this host with {flag_or_variable('address')} (0.0.0.0: all of them)"
            # An address that does not resolve is a gaierror, whose errno is getaddrinfo's, not errno's.
            hint = (
                address
                if isinstance(error, socket.gaierror)
                else {
                    errno.EADDRINUSE: f"; choose another port with {flag_or_variable('port')}",
                    errno.EADDRNOTAVAIL: address,
                    errno.EACCES: f"; ports below 1024 need privileges: choose another with {flag_or_variable('port')}",
                }.get(error.errno or 0, "")
            )
            raise StartupError(
                f"cannot listen on {where} ({given}): {error.strerror or error}{hint}", EXIT_USAGE
            ) from None

    # --- lifecycle ------------------------------------------------------------------

    def _driver_changed(self, message: str) -> None:
        log.error("%s", message)
        self.exit_status = EXIT_DRIVER_CHANGED
        self.stopping.set()

    def start(self) -> None:
        self.server.start()
        self._watch_credentials()

        sweeper = Sweeper(self.sampler, self.config.sweep_interval)
        sweeper.start()
        self._closers.append(sweeper.stop)
        self.process_watch = ProcessWatch(self.sampler, self.config.watch_interval)
        self.process_watch.start()
        self._closers.append(self.process_watch.stop)
        if self.devices is not None:
            self.devices.start()
            self._closers.append(self.devices.stop)
        if self.xids is not None:
            watch = XidWatch(self._backend, self.xids, self.health, self.sampler.gpu_indices)
            watch.start()
            self._closers.append(watch.stop)
        self.telemetry.start()
        if self._scenario is not None:
            self._describe_simulation(self._scenario)
        if self.otlp is not None:
            log.info(
                "pushing OTLP (%s) every %g s to %s",
                self.otlp.protocol,
                self.otlp.interval_s,
                self.otlp.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint",
            )
        log.info(
            "serving %s://%s:%d/metrics (ratio %s from %s, node %s)",
            "https" if self.server.tls else "http",
            host_in_url(self.config.address),
            self.server.port,
            self.ratio.describe(),
            self.ratio.origin,
            self.node_name,
        )

    def stop(self) -> None:
        self.server.stop()
        self.close()

    def close(self) -> None:
        """Stop the background threads and release the sources, newest first."""
        while self._closers:
            self._closers.pop()()

    # --- sources ----------------------------------------------------------------------

    def _load_scenario(self) -> Scenario | None:
        config = self.config
        if config.simulate is None:
            return None
        from otel_vgpu.sim.scenario_file import ScenarioFileError, load_scenario  # noqa: PLC0415

        try:
            return load_scenario(config.simulate, name=config.spelled("simulate"))
        except ScenarioFileError as error:
            # Another file is the remedy, or none: the built-in node, spelled where the file was.
            builtin = (
                "--simulate alone" if config.origin("simulate").startswith("-") else f"{config.origin('simulate')}=true"
            )
            raise StartupError(
                f"{error}; give a scenario file (docs/scenario.md), or {builtin} for the built-in node", EXIT_USAGE
            ) from None
        except ScenarioError as error:
            raise StartupError(str(error), EXIT_USAGE) from None

    def _ratio_source(self) -> RatioSource:
        """The ratio file; on a simulated node without one where the default
        path points, the scenario's ratio (said in the serving line)."""
        config = self.config
        path = config.allocation_file
        simulated = self._scenario is not None and path == DEFAULT_ALLOCATION_FILE and not path.exists()
        try:
            return RatioSource(
                path,
                fallback=self._scenario.ratio if self._scenario and simulated else None,
                name=config.spelled("allocation_file"),
            )
        except RatioFileError as error:
            default = "" if "allocation_file" in config.given else "; that is the default path"
            hint = (
                ""
                if path.exists()
                else f"{default}; give the ratio file's path with {flag_or_variable('allocation_file')}"
            )
            raise StartupError(f"{error}{hint}", EXIT_USAGE) from None

    def _check_proc_root(self) -> None:
        """--proc-root, on a real node (a simulated one has its own): a wrong one would attribute
        every process to no pod, sweep after sweep, with nothing said; it fails the start instead,
        before the driver is asked."""
        config = self.config
        if self._scenario is not None or config.proc_root.is_dir():
            return
        what = "not a directory" if config.proc_root.exists() else "no such directory"
        raise StartupError(
            f"{config.spelled('proc_root')}: {what}; give the /proc of the host's PID namespace as the agent "
            "sees it (the default, /proc, with the host's PID namespace shared)",
            EXIT_USAGE,
        )

    def _describe_simulation(self, scenario: Scenario) -> None:
        """Said once serving, so that nothing precedes a start-up error's one line."""
        log.warning(
            "simulated GPU node (%s): %s, %s; proc tree in %s",
            self.config.simulate,
            counted(len(scenario.gpus), "GPU"),
            counted(len(scenario.pods), "pod"),
            self._proc_root,
        )
        for index, asked in sorted(sm_asked(scenario).items()):
            if asked > 1.0:
                log.info(
                    "simulated GPU %d: its processes ask for up to %.2f of its SMs together; a GPU has 1, so "
                    "each gets its part of it, as time-slicing shares it",
                    index,
                    asked,
                )

    def _gpu_sources(self) -> _Sources:
        config = self.config
        if self._scenario is not None:
            from otel_vgpu.sim.node import SimulatedNode  # noqa: PLC0415

            scenario = self._scenario
            node = SimulatedNode(scenario)
            self._proc_root = node.proc_root
            return _Sources(
                backend=node,
                proc_root=node.proc_root,
                directory=node.directory(),
                allocation=node,
                node_name=config.node_name or scenario.node_name or socket.gethostname(),
            )

        from otel_vgpu.gpu.nvml import NvmlBackend, NvmlUnavailable  # noqa: PLC0415

        try:
            backend = NvmlBackend(backoff=config.nvml_backoff)
        except NvmlUnavailable as error:
            raise StartupError(str(error), EXIT_NO_GPU) from None
        return _Sources(
            backend=backend,
            proc_root=config.proc_root,
            directory=UnresolvedDirectory(),
            allocation=UnknownAllocation(),
            node_name=config.node_name or socket.gethostname(),
        )

    def _attach_kubernetes(self, sources: _Sources) -> None:
        """Names from the Kubernetes API in a cluster (a service-account token
        and KUBERNETES_SERVICE_HOST) or with a kubeconfig; shares from the
        kubelet whenever the API is used (its answers name pods, which only
        the API maps to UIDs)."""
        config = self.config
        in_cluster = (
            bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (config.service_account_dir / "token").is_file()
        )
        if config.no_kubernetes or not (config.kubeconfig or in_cluster):
            why = "--no-kubernetes" if config.no_kubernetes else "not in a cluster and no --kubeconfig"
            if isinstance(sources.directory, UnresolvedDirectory):
                log.warning("Kubernetes API off (%s): the pod label holds pod UIDs and namespace is empty", why)
            return

        from otel_vgpu.kubernetes.api import KubeconfigError, KubePodDirectory, make_client  # noqa: PLC0415
        from otel_vgpu.kubernetes.list_watch import WatchSettings  # noqa: PLC0415
        from otel_vgpu.kubernetes.podresources import KubeletAllocation, PodResourcesClient  # noqa: PLC0415

        def new_client() -> Any:
            return make_client(config.kubeconfig, config.service_account_dir)

        try:
            new_client().close()  # a bad configuration fails here, at start
        except KubeconfigError as error:
            raise StartupError(
                f"{config.spelled('kubeconfig')}: {error.what}; give a kubeconfig file (kubectl config view --raw "
                "--minify writes one), or none in a pod, which then uses its service account",
                EXIT_USAGE,
            ) from None
        except Exception as error:  # lightkube raises several kinds for a bad config
            why = " ".join(str(error).split())
            if config.kubeconfig is not None:
                message = (
                    f"{config.spelled('kubeconfig')}: cannot be used ({why}); give a kubeconfig that kubectl "
                    f"can use (kubectl --kubeconfig {config.kubeconfig} get pods)"
                )
            else:
                message = (
                    f"{config.spelled('service_account_dir')}: the pod's service account cannot be used ({why}); "
                    "give the directory of its token, ca.crt and namespace, or a kubeconfig with "
                    f"{flag_or_variable('kubeconfig')}"
                )
            raise StartupError(message, EXIT_USAGE) from None
        self._watching = WatchSettings(
            new_client,
            sources.node_name,
            self.health,
            watch_seconds=config.kube_watch_seconds,
            backoff=config.kube_backoff,
            watch_grace_s=config.kube_watch_grace_s,
        )
        directory = KubePodDirectory(self._watching, config.gpu_resources)
        directory.start()
        self._closers.append(directory.stop)
        if not directory.wait_synced(config.first_sync_wait_s):
            log.warning("no answer from the Kubernetes API yet; pods show their UIDs until it answers")
        sources.directory = directory

        client = None if config.no_pod_resources else PodResourcesClient(config.pod_resources_socket)
        if client is None:
            log.info("pod-resources off (--no-pod-resources): shares come from the pods' GPU limits")
        allocation = KubeletAllocation(
            directory,
            client,
            config.gpu_resources,
            self.health,
            poll_seconds=max(0.1, config.pod_resources_interval),
            kai=self._kai_bind_requests(),
        )
        allocation.start()
        self._closers.append(allocation.stop)
        sources.allocation = allocation

    def _kai_bind_requests(self) -> Any:
        """KAI Scheduler's BindRequests for this node (kubernetes/bind_requests.py), unless --kai off."""
        config = self.config
        if config.kai == "off" or self._watching is None:
            return None
        from otel_vgpu.allocation.kai import KaiSettings  # noqa: PLC0415
        from otel_vgpu.kubernetes.bind_requests import KaiBindRequests  # noqa: PLC0415

        bind_requests = KaiBindRequests(self._watching, config.kai, KaiSettings(*config.kai_reservation))
        bind_requests.start()
        self._closers.append(bind_requests.stop)
        if config.kai == "on" and not bind_requests.wait_synced(config.first_sync_wait_s):
            log.warning("no BindRequests from the Kubernetes API yet; KAI's fractions count once it answers")
        return bind_requests

    def _watch_credentials(self) -> None:
        """Reread the TLS files and the users file when they change (endpoint/reload.py)."""
        config = self.config
        groups = []
        cert, key, ca = config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file
        if cert is not None and key is not None:

            def load_tls() -> ssl.SSLContext:
                context = server_context(config)
                assert context is not None  # the files are given
                return context

            paths = [cert, key, *([ca] if ca else [])]
            groups.append(Watched("the TLS certificate and key", paths, load_tls, self.server.use_tls))
        users = config.basic_auth_file
        if users is not None:
            groups.append(
                Watched(
                    f"the users file {users}", [users], lambda: BasicAuth(load_users(users)), self.endpoint.use_auth
                )
            )
        watch = CredentialWatch(groups, self.health, every_s=config.credentials_check_s)
        watch.start()
        self._closers.append(watch.stop)

    def _watch_node(self) -> None:
        """With the Kubernetes API: this node's labels, so that NVML is let go
        of while the GPU Operator upgrades the driver (kubernetes/driver_upgrade.py)."""
        if self._watching is None:
            return
        from otel_vgpu.kubernetes.driver_upgrade import NodeWatch  # noqa: PLC0415

        watch = NodeWatch(self._watching, on_pause=self.sampler.pause, on_resume=self.sampler.resume)
        watch.start()
        self._closers.append(watch.stop)


def _selected_families(config: Config) -> tuple[Family[Any], ...]:
    """The families the allow- or denylist keeps; a pattern that names none is said, not fatal."""
    families, unmatched = selected(config.metric_allowlist, config.metric_denylist)
    for pattern in unmatched:
        flag = "--metric-allowlist" if pattern in config.metric_allowlist else "--metric-denylist"
        log.warning(
            "%s pattern %r names no family (matched against the whole name, e.g. vgpu_pod_energy.*, "
            "vgpu\\.pod\\.energy or hw\\.energy); docs/metrics.md lists them",
            flag,
            pattern,
        )
    return families


def _endpoint_security(config: Config) -> tuple[ssl.SSLContext | None, BasicAuth | None]:
    """TLS and basic auth for the endpoint; ValueError with one line if unusable."""
    context = server_context(config)
    auth = None
    if config.basic_auth_file is not None:
        try:
            auth = BasicAuth(load_users(config.basic_auth_file, config.spelled("basic_auth_file")))
        except AuthFileError as error:
            raise ValueError(str(error)) from None
    return context, auth
