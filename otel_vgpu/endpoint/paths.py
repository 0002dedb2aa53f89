"""What each path of the endpoint answers: /metrics for Prometheus, /healthz and /readyz for probes.

- /metrics is rendered on a fixed pool of worker threads and shared: scrapes
  that arrive while a body of their format is rendered wait for it, and the
  body is kept for the scrapes that follow until a new sweep is due;
- basic auth's bcrypt checks run on one thread of their own, so a flood of
  wrong passwords cannot take the workers;
- with mutual TLS, a client certificate is required on /metrics only: the
  kubelet's probes send none.

The connections, their bounds and TLS are the server's (server.py, with places.py,
handshakes.py, exchange.py and connections.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gzip
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from otel_vgpu.collect.aggregate import Snapshot
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.endpoint.auth import Attempt, BasicAuth, Verdict, network_of
from otel_vgpu.endpoint.checks import CheckQueue
from otel_vgpu.endpoint.http import Request, Response, accepts_gzip, no_cache, text
from otel_vgpu.export.exposition import Format, negotiate
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.gpu.pidns import blind_message
from otel_vgpu.limits import DEFAULT_LIMITS, Limits
from otel_vgpu.threads import name_this_thread
from otel_vgpu.wording import counted

# Rendered bodies kept for the current snapshot, one per format and encoding asked for: every
# variant there is (OpenMetrics or not, four escapings, gzip or not), so that clients cycling
# through them cost one encoding each per sweep, not one each per request.
MAX_KEPT_BODIES = 16


class Endpoint:
    """What each path answers. Cheap answers come from the event loop; a
    render, a sweep or a password check runs on its executor."""

    def __init__(
        self,
        telemetry: Telemetry,
        sampler: Sampler,
        ready_max_age: float,
        auth: BasicAuth | None = None,
        client_certificates: bool = False,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._telemetry = telemetry
        self._sampler = sampler
        self._ready_max_age = ready_max_age
        self._auth = auth
        self._client_certificates = client_certificates
        self._limits = limits
        self.workers = ThreadPoolExecutor(
            max_workers=limits.workers, thread_name_prefix="http-worker", initializer=name_this_thread
        )
        self._auth_worker = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="http-auth", initializer=name_this_thread
        )
        self._checks = CheckQueue(
            self._auth_worker, limits.password_checks, network_of, passed=lambda verdict: verdict is Verdict.ALLOW
        )
        """Password checks, running or waiting for the bcrypt thread, shared fairly (endpoint/checks.py)."""
        # Keyed by what the body depends on (OpenMetrics or not, escaping, gzip), never by
        # what a client writes in Accept: a made-up version per request shares one render.
        self._flights: dict[tuple[tuple[bool, str], bool, bool], _Flight] = {}
        self._bodies: dict[tuple[tuple[bool, str], bool], tuple[Snapshot, Response]] = {}
        self.renders = 0
        """Bodies rendered (each shared by every scrape of its snapshot)."""

    def use_auth(self, auth: BasicAuth) -> None:
        """Users from a reread file, for the requests that follow (what the old ones had
        remembered, passed or failed, goes with them: a revoked password stops working)."""
        self._auth = auth

    def close(self) -> None:
        self.workers.shutdown(wait=False, cancel_futures=True)
        self._auth_worker.shutdown(wait=False, cancel_futures=True)

    async def handle(self, request: Request) -> Response:
        loop = asyncio.get_running_loop()
        if request.method not in ("GET", "HEAD"):
            return text(405, "method not allowed; use GET\n", ("Allow", "GET, HEAD"))
        path = request.path
        if path == "/healthz":
            stuck = self._sampler.stuck_for()
            if stuck > self._limits.stuck_after_s:
                return text(503, f"a sweep has been running for {stuck:.0f} s\n")
            return text(200, "ok\n")
        if path == "/readyz":
            return await loop.run_in_executor(self.workers, self._ready)
        if path == "/metrics":
            refused = await self._refuse(request)
            if refused is not None:
                return refused
            response = await self._scrape(request)
            # With a credential required, this client has shown it may scrape: its connection
            # is never shed for one that has not (endpoint/admission.py).
            credentials = self._client_certificates or self._auth is not None
            return dataclasses.replace(response, authorized=True) if credentials else response
        if path == "/":
            return text(200, "otel-vgpu: /metrics (Prometheus), /healthz, /readyz\n")
        return text(404, "not found; try /metrics\n")

    def credentialed(self, request: Request) -> bool:
        """A request for /metrics whose client certificate (if one is required) and password
        (if one is) are known good: the certificate checked in the handshake, the password
        remembered as having passed."""
        if request.path != "/metrics" or (self._client_certificates and not request.client_certificate):
            return False
        auth = self._auth
        if auth is None:
            return self._client_certificates
        return auth.remembered(request.headers.get("authorization"))

    async def _scrape(self, request: Request) -> Response:
        fmt = negotiate(request.headers.get("accept", ""))
        compress = accepts_gzip(request.headers.get("accept-encoding", ""))
        if no_cache(request.headers):
            return _as(fmt, await self._shared(fmt, compress, fresh=True))
        # Scrapes within --min-interval of each other share the sweep, and the body too; while a
        # reader is stuck past its deadline, each is rendered anew to say so (agent_health.py `AgentHealth.began`).
        cached = self._bodies.get((fmt.body, compress))
        if (
            cached is not None
            and cached[0] is self._sampler.fresh(self._telemetry.min_interval)
            and not self._telemetry.stuck
        ):
            return _as(fmt, cached[1])
        return _as(fmt, await self._shared(fmt, compress))

    async def _refuse(self, request: Request) -> Response | None:
        """Why /metrics is not for this client, or None."""
        if self._client_certificates and not request.client_certificate:
            return text(403, "a client certificate signed by the configured CA is required\n")
        auth = self._auth  # the users file may be reread meanwhile: one version per request
        if auth is None:
            return None
        decided = auth.decide(request.headers.get("authorization"), request.peer)
        if isinstance(decided, Attempt):
            checked = await self._checks.run(functools.partial(auth.verify, decided), request.peer)
            if checked is None:
                # The bcrypt thread's queue is full of checks from clients that have had fewer:
                # no connection waits on it, holding a place under the cap. A credential that
                # passed before never gets here.
                return text(
                    503, "too many password checks at once; try again\n", ("Retry-After", "1"), ("Connection", "close")
                )
            decided = checked
        verdict = decided
        if verdict is Verdict.ALLOW:
            return None
        if verdict is Verdict.THROTTLED:
            wait = str(auth.retry_after(request.peer))
            return text(429, "too many failed logins; try again later\n", ("Retry-After", wait))
        return text(401, "unauthorized\n", ("WWW-Authenticate", 'Basic realm="otel-vgpu"'))

    async def _shared(self, fmt: Format, compress: bool, fresh: bool = False) -> Response:
        """A /metrics response rendered for this scrape or one that arrived
        while it was rendered, for the same format and encoding: N scrapers at
        once cost one sweep and one render, and a joining scrape holds no
        worker. The body is kept for the scrapes that follow until a new sweep
        is due. `fresh` (Cache-Control: no-cache) skips the kept body and
        joins only renders that skip it too."""
        key = (fmt.body, compress, fresh)
        flight = self._flights.get(key)
        if flight is None or flight.future.cancelled():
            loop = asyncio.get_running_loop()
            flight = _Flight(loop.run_in_executor(self.workers, self._metrics, fmt, compress))
            self._flights[key] = flight
            flight.future.add_done_callback(lambda _: self._land(key, flight))
        flight.waiters += 1
        try:
            return (await asyncio.shield(flight.future))[1]
        except asyncio.CancelledError:
            # The client left. A render nobody waits for any more is dropped
            # while still queued for a worker.
            if flight.waiters == 1 and not flight.future.done():
                flight.future.cancel()
            raise
        finally:
            flight.waiters -= 1

    def _land(self, key: tuple[tuple[bool, str], bool, bool], flight: _Flight) -> None:
        """On the loop, as a render ends: keep its body for its snapshot's scrapes."""
        if self._flights.get(key) is flight:
            del self._flights[key]
        if flight.future.cancelled() or flight.future.exception() is not None:
            return
        snapshot, response = flight.future.result()
        # Only bodies of this snapshot stay, and a few formats at most (a
        # client may name any version in Accept).
        bodies = {k: v for k, v in self._bodies.items() if v[0] is snapshot}
        while len(bodies) >= MAX_KEPT_BODIES:
            del bodies[next(iter(bodies))]
        bodies[(key[0], key[1])] = (snapshot, response)
        self._bodies = bodies

    def _metrics(self, fmt: Format, compress: bool) -> tuple[Snapshot, Response]:
        self.renders += 1
        # A gzip body is its snapshot's identity body compressed (telemetry keeps it).
        snapshot, body = self._telemetry.render_snapshot(fmt)
        if compress:
            headers = (("Content-Encoding", "gzip"),)
            return snapshot, Response(200, gzip.compress(body, compresslevel=1), fmt.content_type, headers)
        return snapshot, Response(200, body, fmt.content_type)

    def _ready(self) -> Response:
        # The probe itself may sweep: a node nobody scrapes yet must still
        # become ready, or it would never be discovered and scraped.
        snapshot = self._sampler.snapshot(self._ready_max_age)
        if snapshot.ok and not snapshot.blind and snapshot.gpus:
            return text(200, f"ready: {counted(len(snapshot.gpus), 'GPU')}\n")
        if snapshot.paused:
            reasons = f"NVML released while the GPU driver is upgraded (node label {snapshot.paused})"
        elif snapshot.blind:
            # Serving would publish a node with no pods on it: the pod is
            # not ready until it shares the host's PID namespace.
            reasons = blind_message(snapshot.blind)
        else:
            # Ready means at least one GPU is reported.
            errors = "; ".join(message for _, message in snapshot.errors)
            reasons = "no successful sweep" if not snapshot.ok else "no GPU reported"
            reasons = f"{reasons}: {errors}" if errors else reasons
        return text(503, f"not ready: {reasons}\n")


def _as(fmt: Format, response: Response) -> Response:
    """A shared body with the Content-Type this client's Accept asked for."""
    if response.content_type == fmt.content_type:
        return response
    return dataclasses.replace(response, content_type=fmt.content_type)


@dataclass(slots=True, eq=False)
class _Flight:
    future: asyncio.Future[tuple[Snapshot, Response]]
    waiters: int = 0
