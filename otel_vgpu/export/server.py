"""The HTTP endpoint: /metrics for Prometheus, /healthz and /readyz for probes.

Every client is held to bounds, whoever it is and whatever it sends
(`Limits`; the README and docs/reliability.md state them):

- one event loop reads every connection (asyncio; h11 parses HTTP/1.1), so a
  connection costs a socket and a few kilobytes, never a thread; responses
  are rendered by a fixed pool of worker threads, and bcrypt checks by one
  thread of their own, so a flood of wrong passwords cannot take the workers;
- a request head is at most `head_bytes`, received within `head_deadline_s`
  of its first byte (a client trickling a header line every few seconds is
  cut), and a connection that sends nothing is closed after `idle_s`;
- at most `connections` connections are open; past that, the one that has
  waited longest for a request head (idle or trickling) is shed for the new
  one, and if every connection is busy with a response the new one gets 503;
- only GET and HEAD (405 otherwise); HEAD gets the headers and no body;
  gzip as `Accept-Encoding` asks, q-values and case included;
- with mutual TLS, a client certificate is asked for and checked in the
  handshake, and required on /metrics only: the kubelet's probes send none.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gzip
import logging
import socket
import ssl
import struct
import termios
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, SupportsIndex

import h11

from otel_vgpu.collect.aggregate import Snapshot
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.export.auth import Attempt, BasicAuth, Verdict
from otel_vgpu.export.exposition import Format, negotiate
from otel_vgpu.export.memory import trim
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.gpu.pidns import blind_message
from otel_vgpu.wording import counted

log = logging.getLogger(__name__)

# Rendered bodies kept for the current snapshot: one per format and encoding asked for.
MAX_KEPT_BODIES = 4
# The heap is trimmed at most this often, once this many connections have closed since the last trim.
TRIM_EVERY_S = 5.0
TRIM_AFTER_CLOSED = 32


@dataclass(frozen=True, slots=True)
class Limits:
    connections: int = 64
    """Open connections at most (TLS handshakes in progress aside, each bounded by handshake_s)."""
    head_bytes: int = 16 * 1024
    """A request line and headers, together."""
    head_deadline_s: float = 10.0
    """From a request's first byte to the end of its head."""
    idle_s: float = 30.0
    """A connection that sends nothing for this long is closed."""
    handshake_s: float = 10.0
    write_s: float = 30.0
    """To hand a response to a slow reader."""
    workers: int = 4
    """Threads rendering responses (sweeps are shared, so more would only queue on them)."""
    shed_after_s: float = 1.0
    """Quiet connections that have waited this long are shed before younger ones: a client
    sends its request (or ClientHello) right after connecting."""
    backlog: int = 64
    """Connections the kernel queues for accepting, and that the loop accepts at a time: with
    `connections`, the bound on open sockets (a shed one closes on the loop's next turn)."""
    stuck_after_s: float = 120.0
    """/healthz fails once a sweep has run this long: liveness restarts an agent stuck in a read."""


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]
    """Lower-case names; a repeated header's values joined with ", "."""
    peer: str
    client_certificate: bool


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


def text(status: int, body: str, *headers: tuple[str, str]) -> Response:
    return Response(status, body.encode(), headers=headers)


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
        self.workers = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="http-worker")
        self._auth_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="http-auth")
        self._flights: dict[tuple[Format, bool, bool], _Flight] = {}
        self._bodies: dict[tuple[Format, bool], tuple[Snapshot, Response]] = {}
        self.renders = 0
        """Bodies rendered (each shared by every scrape of its snapshot)."""

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
            fmt = negotiate(request.headers.get("accept", ""))
            compress = accepts_gzip(request.headers.get("accept-encoding", ""))
            if no_cache(request.headers):
                return await self._shared(fmt, compress, fresh=True)
            # Scrapes within --min-interval of each other share the sweep, and the body too.
            cached = self._bodies.get((fmt, compress))
            if cached is not None and cached[0] is self._sampler.fresh(self._telemetry.min_interval):
                return cached[1]
            return await self._shared(fmt, compress)
        if path == "/":
            return text(200, "otel-vgpu: /metrics (Prometheus), /healthz, /readyz\n")
        return text(404, "not found; try /metrics\n")

    async def _refuse(self, request: Request) -> Response | None:
        """Why /metrics is not for this client, or None."""
        if self._client_certificates and not request.client_certificate:
            return text(403, "a client certificate signed by the configured CA is required\n")
        if self._auth is None:
            return None
        verdict = self._auth.decide(request.headers.get("authorization"), request.peer)
        if isinstance(verdict, Attempt):
            loop = asyncio.get_running_loop()
            verdict = await loop.run_in_executor(self._auth_worker, self._auth.verify, verdict)
        if verdict is Verdict.ALLOW:
            return None
        if verdict is Verdict.THROTTLED:
            wait = str(self._auth.retry_after(request.peer))
            return text(429, "too many failed logins; try again later\n", ("Retry-After", wait))
        return text(401, "unauthorized\n", ("WWW-Authenticate", 'Basic realm="otel-vgpu"'))

    async def _shared(self, fmt: Format, compress: bool, fresh: bool = False) -> Response:
        """A /metrics response rendered for this scrape or one that arrived
        while it was rendered, for the same format and encoding: N scrapers at
        once cost one sweep and one render, and a joining scrape holds no
        worker. The body is kept for the scrapes that follow until a new sweep
        is due. `fresh` (Cache-Control: no-cache) skips the kept body and
        joins only renders that skip it too."""
        key = (fmt, compress, fresh)
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

    def _land(self, key: tuple[Format, bool, bool], flight: _Flight) -> None:
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


@dataclass(slots=True, eq=False)
class _Flight:
    future: asyncio.Future[tuple[Snapshot, Response]]
    waiters: int = 0


def no_cache(headers: Mapping[str, str]) -> bool:
    """Whether the request asks for a fresh render (RFC 9111: Cache-Control no-cache, or
    Pragma: no-cache from HTTP/1.0 clients)."""
    directives = {d.strip().split("=", 1)[0].lower() for d in headers.get("cache-control", "").split(",")}
    return "no-cache" in directives or "no-cache" in headers.get("pragma", "").lower()


def accepts_gzip(header: str) -> bool:
    """Whether an Accept-Encoding value accepts gzip (RFC 9110: names are
    case-insensitive; q=0 means "not acceptable"; `*` stands for any other)."""
    weights: dict[str, float] = {}
    for item in header.split(","):
        name, *params = (part.strip() for part in item.split(";"))
        if not name:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        weights[name.lower()] = q
    weight = weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0)))
    return weight > 0


def tls_context(cert_file: Path, key_file: Path, client_ca_file: Path | None) -> ssl.SSLContext:
    """A server context. With a client CA, a client certificate is asked for
    and, if sent, must be signed by it; /metrics then requires one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file is not None:
        context.load_verify_locations(client_ca_file)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Reader(asyncio.StreamReader):
    """A stream reader that counts the bytes it holds unread."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.unread = 0

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        if isinstance(data, bytes | bytearray | memoryview):
            self.unread += len(data)
        super().feed_data(data)

    async def read(self, n: int = -1) -> bytes:
        data = await super().read(n)
        self.unread = max(0, self.unread - len(data))
        return data


@dataclass(slots=True, eq=False)
class _Connection:
    writer: asyncio.StreamWriter
    reader: asyncio.StreamReader
    waiting_since: float
    waiting: bool = True
    """Idle, or receiving a request head: what the cap sheds first."""

    def quiet(self) -> bool:
        """Nothing it sent waits to be read, in the reader or in the kernel."""
        return getattr(self.reader, "unread", 0) == 0 and _unread_bytes(self.writer) == 0


@dataclass(slots=True)
class Counters:
    closed: int = 0
    shed: int = 0
    refused: int = 0
    timed_out: int = 0
    connections: set[_Connection] = field(default_factory=set)


class Server:
    """The endpoint, serving from an event loop on a background thread."""

    def __init__(
        self,
        address: str,
        port: int,
        endpoint: Endpoint,
        ssl_context: ssl.SSLContext | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        # Bound now, so a port in use fails the start (OSError reaches the caller).
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((address, port))
            self._socket.listen(limits.backlog)
        except OSError:
            self._socket.close()
            raise
        self._endpoint = endpoint
        self._ssl = ssl_context
        self._client_certificates = ssl_context is not None and ssl_context.verify_mode != ssl.CERT_NONE
        self.tls = ssl_context is not None
        self.limits = limits
        self.counters = Counters()
        self._closed_at_trim = 0
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(_quiet_exceptions)
        self._started = threading.Event()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def start(self) -> None:
        self._thread.start()
        self._started.wait(10)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._endpoint.close()
        self._socket.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        loop = self._loop

        def protocol() -> asyncio.StreamReaderProtocol:
            # What asyncio.start_server builds, with a reader that notes when bytes arrive.
            return asyncio.StreamReaderProtocol(
                _Reader(limit=self.limits.head_bytes, loop=loop), self._serve, loop=loop
            )

        # TLS is started by each connection's handler (StreamWriter.start_tls),
        # not by the listener: a handshake in progress is then a connection
        # like any other, under the cap and shed first when idle, and the
        # memory of handshakes (a 256 KiB buffer each) is bounded by it.
        self._server = loop.run_until_complete(
            loop.create_server(protocol, sock=self._socket, backlog=self.limits.backlog)
        )
        self._started.set()
        loop.call_later(TRIM_EVERY_S, self._trim_after_bursts)
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            for connection in list(self.counters.connections):
                connection.writer.transport.abort()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    def _trim_after_bursts(self) -> None:
        """Once the connections of a burst have closed, give their memory back."""
        closed = self.counters.closed
        if closed - self._closed_at_trim >= TRIM_AFTER_CLOSED and len(self.counters.connections) < 8:
            self._closed_at_trim = closed
            trim()
        self._loop.call_later(TRIM_EVERY_S, self._trim_after_bursts)

    # --- one connection --------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections = self.counters.connections
        if len(connections) >= self.limits.connections:
            # Shed a connection that is waiting with nothing to read: idle,
            # or trickling a head whose bytes are all consumed. One whose
            # request has arrived (in the kernel or the reader) is not idle.
            # Those that have waited `shed_after_s` go first, oldest first;
            # with none to shed, the new one is refused.
            now = time.monotonic()
            waiting = [c for c in connections if c.waiting]
            old = [c for c in waiting if now - c.waiting_since >= self.limits.shed_after_s]
            quiet = [c for c in waiting if c.quiet()]
            # Then, if none is quiet, one that has been receiving its head for
            # over `shed_after_s`: a client sends a head at once, a trickler does not.
            idle = [c for c in quiet if c in old] or quiet or old
            if not idle:
                self.counters.refused += 1
                await self._send_and_close(writer, text(503, "too many connections; try again\n"))
                return
            victim = min(idle, key=lambda c: c.waiting_since)
            connections.discard(victim)
            victim.writer.transport.abort()
            self.counters.shed += 1
        connection = _Connection(writer, reader, time.monotonic())
        connections.add(connection)
        peer = writer.get_extra_info("peername")
        protocol = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.head_bytes)
        try:
            certificate = False
            if self._ssl is not None:
                try:
                    await writer.start_tls(self._ssl, ssl_handshake_timeout=self.limits.handshake_s)
                except AttributeError:
                    # asyncio (3.11, 3.12) when the connection was shed or
                    # dropped mid-handshake: start_tls gets no TLS transport back.
                    return
                if writer.transport is None:  # the client left as the handshake ended
                    return
                tls_object = writer.get_extra_info("ssl_object")
                certificate = bool(tls_object.getpeercert()) if tls_object is not None else False
            while True:
                connection.waiting, connection.waiting_since = True, time.monotonic()
                event = await self._next_request(reader, protocol)
                if event is None:
                    return
                connection.waiting = False
                request = _request(event, peer[0] if peer else "", certificate)
                # A GET or HEAD has no body: its end is already in h11's buffer.
                # Anything else (a body, another method) is answered, then closed.
                ended = request.method in ("GET", "HEAD") and isinstance(protocol.next_event(), h11.EndOfMessage)
                response = await self._answer(reader, protocol, request)
                if response is None:
                    return  # the client left before its answer was ready
                if not ended:
                    await self._send_and_close(writer, response, protocol)
                    return
                if not await self._send(writer, protocol, response, head=request.method == "HEAD"):
                    return
                if protocol.our_state is not h11.DONE or protocol.their_state is not h11.DONE:
                    return  # HTTP/1.0 or Connection: close
                protocol.start_next_cycle()
        except _HttpError as error:
            await self._send_and_close(writer, text(error.status, f"{error}\n"), protocol)
        except (TimeoutError, h11.ProtocolError, ConnectionError, OSError, asyncio.IncompleteReadError):
            pass  # a dropped connection, a failed or slow TLS handshake
        finally:
            connections.discard(connection)
            self.counters.closed += 1
            _close(writer)

    async def _answer(
        self, reader: asyncio.StreamReader, protocol: h11.Connection, request: Request
    ) -> Response | None:
        """The endpoint's response, or None if the client closes first: its
        render, still queued for a worker, is then dropped, so scrapers that
        time out cannot leave a backlog of work nobody will read."""
        work = asyncio.ensure_future(self._endpoint.handle(request))
        watch = asyncio.ensure_future(reader.read(self.limits.head_bytes))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch.done():
                data = b"" if watch.exception() is not None else watch.result()
                if not data and not work.done():
                    work.cancel()
                    return None
                protocol.receive_data(data)  # a pipelined request, answered next (or the close)
            return await work
        finally:
            if not watch.done():
                watch.cancel()

    async def _next_request(self, reader: asyncio.StreamReader, protocol: h11.Connection) -> h11.Request | None:
        """The next request's head, within the limits; None when the client closed."""
        deadline: float | None = None
        received = len(protocol.trailing_data[0])  # pipelined bytes already in h11's buffer
        while True:
            try:
                event = protocol.next_event()
            except h11.RemoteProtocolError as error:
                status = error.error_status_hint
                if status == 431 and b"\r\n" not in bytes(protocol.trailing_data[0])[: self.limits.head_bytes]:
                    status = 414  # the request line alone is over the bound
                raise _HttpError(status, str(error)) from None
            if isinstance(event, h11.Request):
                if event.http_version not in (b"1.0", b"1.1"):
                    raise _HttpError(505, f"HTTP/{event.http_version.decode()} is not served; use HTTP/1.1")
                return event
            if isinstance(event, h11.ConnectionClosed):
                return None
            if event is not h11.NEED_DATA:
                continue  # the end of the previous message
            now = time.monotonic()
            timeout = self.limits.idle_s if deadline is None else deadline - now
            if timeout <= 0:
                self.counters.timed_out += 1
                raise _HttpError(408, "the request head took too long")
            try:
                data = await asyncio.wait_for(reader.read(8192), timeout)
            except TimeoutError:
                if deadline is None:
                    return None  # idle: close quietly
                self.counters.timed_out += 1
                raise _HttpError(408, "the request head took too long") from None
            if deadline is None and data:
                deadline = time.monotonic() + self.limits.head_deadline_s
            received += len(data)
            if received > self.limits.head_bytes:
                # h11 bounds what it buffers unparsed; this bounds the head whole.
                line_end = (bytes(protocol.trailing_data[0]) + data).find(b"\r\n")
                long_line = line_end < 0 or line_end > self.limits.head_bytes // 2
                raise _HttpError(414 if long_line else 431, "the request head is over the bound")
            protocol.receive_data(data)

    async def _send(
        self, writer: asyncio.StreamWriter, protocol: h11.Connection, response: Response, head: bool = False
    ) -> bool:
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            *response.headers,
        ]
        data = protocol.send(h11.Response(status_code=response.status, headers=headers))
        if response.body and not head:
            data += protocol.send(h11.Data(data=response.body))
        data += protocol.send(h11.EndOfMessage())
        writer.write(data)
        try:
            await asyncio.wait_for(writer.drain(), self.limits.write_s)
        except (TimeoutError, ConnectionError, OSError):
            return False
        return True

    async def _send_and_close(
        self, writer: asyncio.StreamWriter, response: Response, protocol: h11.Connection | None = None
    ) -> None:
        closing = Response(
            response.status, response.body, response.content_type, (*response.headers, ("Connection", "close"))
        )
        try:
            if protocol is not None and protocol.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await self._send(writer, protocol, closing)
            else:
                fresh = h11.Connection(h11.SERVER)
                fresh.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                fresh.next_event()
                await self._send(writer, fresh, closing)
        except (h11.ProtocolError, ConnectionError, OSError):
            pass
        _close(writer)


def _close(writer: asyncio.StreamWriter) -> None:
    """Close, whatever state a failed TLS handshake left the writer in."""
    transport = writer.transport
    if transport is None:
        # asyncio (3.11) leaves a writer whose start_tls failed without a
        # transport; its __del__ would then raise. The socket is closed already.
        writer._transport = _CLOSED
        return
    if transport.is_closing():
        transport.abort()
    else:
        writer.close()


class _ClosedTransport(asyncio.Transport):
    def is_closing(self) -> bool:
        return True


_CLOSED = _ClosedTransport()


def _unread_bytes(writer: asyncio.StreamWriter) -> int:
    """Bytes the kernel holds for this connection that the loop has not read yet."""
    sock = writer.get_extra_info("socket")
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, AttributeError, ValueError):
        return 0
    return int(struct.unpack("i", raw)[0])


def _request(event: h11.Request, peer: str, certificate: bool) -> Request:
    headers: dict[str, str] = {}
    for name, value in event.headers:
        key = name.decode("latin-1").lower()
        decoded = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {decoded}" if key in headers else decoded
    target = event.target.decode("latin-1")
    path = target.split("?", 1)[0]
    if path.startswith(("http://", "https://")):  # absolute form
        path = "/" + path.split("/", 3)[3] if path.count("/") >= 3 else "/"
    return Request(event.method.decode("latin-1").upper(), _normalise(path), headers, peer, certificate)


def _normalise(path: str) -> str:
    """`/metrics/`, `//metrics`, `/./metrics` and `/a/../metrics` are `/metrics`."""
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return "/" + "/".join(parts)


def _quiet_exceptions(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A client that drops or botches a connection (a TLS handshake to
    nowhere, a reset) is not the agent's error: debug, not a traceback."""
    error = context.get("exception")
    if isinstance(error, (ConnectionError, OSError, ssl.SSLError, asyncio.TimeoutError)):
        log.debug("connection: %s", context.get("message"))
        return
    loop.default_exception_handler(context)


Handler = Callable[[Request], Awaitable[Response]]
