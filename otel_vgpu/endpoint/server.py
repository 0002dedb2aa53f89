"""The HTTP server: the listening socket, its event loop, and each connection's life from its
place under the cap to its close, for an application (paths.py). The places are
endpoint/places.py's, the TLS handshakes endpoint/handshakes.py's, each request and response
endpoint/exchange.py's, and what the server holds of a connection endpoint/connections.py's.

Every client is held to bounds, whoever it is and whatever it sends
(`Limits`; docs/endpoint.md and docs/reliability.md state them):

- one event loop reads every connection (asyncio; h11 parses HTTP/1.1), so a
  connection costs a socket and a few kilobytes, never a thread; responses
  are rendered by a fixed pool of worker threads, and bcrypt checks by one
  thread of their own, so a flood of wrong passwords cannot take the workers;
- a request head is at most `head_bytes`, received within `head_deadline_s`
  of its first byte (a client trickling a header line every few seconds is
  cut), and a connection that sends nothing is closed after `idle_s`;
- at most `connections` connections are open; past that, one is shed for the new
  one by the rule of endpoint/admission.py (idle or trickling, a stalled reader, one
  that never presented a credential, one of whoever holds more than the newcomer
  would: the cap is shared max-min fairly by address and network); if none can
  go, the new one waits for a place in a queue shared the same way (endpoint/queues.py),
  then gets 503 (on a TLS port, a close before the handshake);
- at most `handshakes` TLS handshakes run at once (each holds OpenSSL's state and a
  read buffer, endpoint/connections.py TLS_READ_BYTES); the others wait, their
  ClientHello unread in the kernel, and the next to start is of the network, then
  address, with the fewest running;
- only GET and HEAD (405 otherwise); HEAD gets the headers and no body;
  gzip as `Accept-Encoding` asks, q-values and case included;
- with mutual TLS, a client certificate is asked for and checked in the
  handshake, and required on /metrics only: the kubelet's probes send none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import h11

from otel_vgpu.endpoint.connections import Connection, Counters, CountingReader, HeldProtocol, close
from otel_vgpu.endpoint.exchange import HttpError, answer, next_request, send, send_and_close
from otel_vgpu.endpoint.handshakes import Handshakes
from otel_vgpu.endpoint.http import Application, Request, Response, request_of, text
from otel_vgpu.endpoint.places import Places
from otel_vgpu.limits import DEFAULT_LIMITS, Limits
from otel_vgpu.logs import LogLimit
from otel_vgpu.memory import trim
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)

# The heap is trimmed at most this often, once this many connections have closed since the last trim.
TRIM_EVERY_S = 5.0
TRIM_AFTER_CLOSED = 32
# How long stopping waits for the connections' tasks to end once cancelled.
STOP_WAIT_S = 2.0
# Connections the kernel queues before the loop accepts them (their SYNs are not dropped in a
# burst, so a scraper's connect does not wait out a retransmission); accepted, they count.
LISTEN_QUEUE = 1024
# How long accepting waits after the system ran out of descriptors or buffers.
ACCEPT_RETRY_S = 1.0
# An unexpected error of one kind is logged at most this often.
UNEXPECTED_LOG_EVERY_S = 60.0


class Server:
    """The endpoint, serving from an event loop on a background thread."""

    def __init__(
        self,
        address: str,
        port: int,
        endpoint: Application,
        ssl_context: ssl.SSLContext | None = None,
        limits: Limits = DEFAULT_LIMITS,
        credentials: bool = False,
    ) -> None:
        """`credentials`: the endpoint requires one (basic auth) beside any client certificate
        the TLS context asks for."""
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        # Bound now, so a port in use fails the start (OSError reaches the caller).
        # IPPROTO_TCP said, not left 0: asyncio sets TCP_NODELAY on accepted connections
        # only where sock.proto is IPPROTO_TCP (base_events._set_nodelay). Without it Nagle
        # held each response's last piece for the client's delayed ACK: about 40 ms on
        # every request after the first on a keep-alive connection.
        self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((address, port))
            self._socket.listen(LISTEN_QUEUE)
        except OSError:
            self._socket.close()
            raise
        self._endpoint = endpoint
        self._ssl = ssl_context
        client_certificates = ssl_context is not None and ssl_context.verify_mode != ssl.CERT_NONE
        self.tls = ssl_context is not None
        self.limits = limits
        self.counters = Counters()
        self._logged_errors = LogLimit(every_s=UNEXPECTED_LOG_EVERY_S)
        self.handshakes = Handshakes(limits, self.counters)
        """The TLS handshakes running, and the connections waiting for a slot (endpoint/handshakes.py)."""
        self._places = Places(limits, self.counters, credentials or client_certificates, self.handshakes)
        """The places under the cap, and the connections waiting for one (endpoint/places.py)."""
        self._closed_at_trim = 0
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(_quiet_exceptions)
        self._started = threading.Event()
        self._accepting: asyncio.Task[None] | None = None
        self._opening: set[asyncio.Task[None]] = set()
        self._room: asyncio.Semaphore | None = None
        """Sockets the loop may hold open: a place under the cap, in the admission queue, or
        accepted and not yet admitted or refused (`Limits.backlog`). Past that, new connections
        wait in the kernel's queue (LISTEN_QUEUE) until one closes."""
        self._thread = NamedThread(target=self._run, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def use_tls(self, context: ssl.SSLContext) -> None:
        """A renewed certificate (or key, or client CA), for the handshakes that follow."""
        self._ssl = context

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
            return HeldProtocol(
                CountingReader(limit=self.limits.head_bytes, loop=loop),
                self._serve,
                loop=loop,
                hold=self._ssl is not None,
            )

        # TLS is started by each connection's handler (StreamWriter.start_tls),
        # not by the listener: a handshake in progress is then a connection
        # like any other, under the cap and shed first when idle, and the
        # memory of handshakes is bounded by it and by `Limits.handshakes`.
        limits = self.limits
        self._room = asyncio.Semaphore(limits.connections + limits.admit_queue + limits.backlog)
        self._socket.setblocking(False)
        self._accepting = loop.create_task(self._accept(protocol))
        self._started.set()
        loop.call_later(TRIM_EVERY_S, self._trim_after_bursts)
        try:
            self._loop.run_forever()
        finally:
            for connection in list(self.counters.connections):
                connection.writer.transport.abort()
            # Cancel and wait out every connection's task, as asyncio.run does on
            # its way out: a task left pending when the loop closes is logged at
            # ERROR ("Task was destroyed but it is pending!") when it is collected.
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(
                    asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), STOP_WAIT_S)
                )
            self._loop.close()

    async def _accept(self, protocol: Callable[[], asyncio.Protocol]) -> None:
        """Accept connections while there is room for their sockets.

        asyncio's own server (loop.create_server) accepts whenever the listening socket
        is readable, however many sockets the loop holds, and listens with its `backlog`
        as the kernel's queue: in a burst of a thousand connections, every 65th SYN was
        dropped (its connect waited out a 1 s retransmission), and once the queue was
        deeper the loop held 800 sockets at once. Here the kernel queues a burst
        (LISTEN_QUEUE), and the loop takes from it what it has room for."""
        assert self._room is not None
        loop = asyncio.get_running_loop()
        accepted = 0
        while True:
            await self._room.acquire()
            try:
                sock, _ = await loop.sock_accept(self._socket)
            except OSError as error:
                self._room.release()
                if self._socket.fileno() < 0:
                    return
                # Out of descriptors or buffers (EMFILE, ENFILE, ENOBUFS, ENOMEM): wait, as
                # asyncio's own accept does, rather than spin on the readable socket.
                self._note_unexpected("accepting a connection", error)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            opening = loop.create_task(self._open(loop, protocol, sock))
            self._opening.add(opening)  # held until done: the loop keeps only weak references
            opening.add_done_callback(self._opening.discard)
            accepted += 1
            if accepted % self.limits.backlog == 0:
                await asyncio.sleep(0)  # a burst is taken `backlog` at a time, the loop's other work between

    async def _open(
        self, loop: asyncio.AbstractEventLoop, protocol: Callable[[], asyncio.Protocol], sock: socket.socket
    ) -> None:
        """The connection's transport and protocol; its handler (`_serve`) gives its room back."""
        try:
            await loop.connect_accepted_socket(protocol, sock)
        except (OSError, RuntimeError):
            sock.close()
            if self._room is not None:
                self._room.release()

    def _trim_after_bursts(self) -> None:
        """Once the connections of a burst have closed, give their memory back."""
        closed = self.counters.closed
        if closed - self._closed_at_trim >= TRIM_AFTER_CLOSED and len(self.counters.connections) < 8:
            self._closed_at_trim = closed
            trim()
        self._loop.call_later(TRIM_EVERY_S, self._trim_after_bursts)

    # --- one connection --------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The task the protocol runs per connection. Stopping cancels it, and it then ends
        # normally, not cancelled: Python 3.11's StreamReaderProtocol calls task.exception()
        # when it is done, which raises on a cancelled task (logged at ERROR by the loop).
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await self._connection(reader, writer)
        finally:
            # The socket closes once what is written has gone (a close, never an abort,
            # which would drop a last answer); its room is for the next connection.
            transport = writer.transport
            if transport is not None and not transport.is_closing():
                transport.close()
            if self._room is not None:
                self._room.release()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections = self.counters.connections
        peer = writer.get_extra_info("peername")
        source = peer[0] if peer else ""
        if not await self._places.admit(source):
            self.counters.refused += 1
            if self._ssl is None:
                await send_and_close(writer, text(503, "too many connections; try again\n"), self.limits)
            else:
                # Never clear text on a TLS port (a client would read it as a broken
                # handshake, WRONG_VERSION_NUMBER): closed before the handshake, which a
                # refused connection is not worth.
                close(writer)
            return
        opened = time.monotonic()
        connection = Connection(writer, reader, opened, source=source, opened=opened)
        connections.add(connection)
        protocol = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.head_bytes)
        try:
            certificate = False
            if self._ssl is not None:
                connection.handshaking = True
                try:
                    if not await self.handshakes.handshake(connection, self._ssl):
                        return
                except AttributeError:
                    # asyncio (3.11, 3.12) when the connection was shed or
                    # dropped mid-handshake: start_tls gets no TLS transport back.
                    return
                finally:
                    connection.handshaking = False
                if writer.transport is None:  # the client left as the handshake ended
                    return
                tls_object = writer.get_extra_info("ssl_object")
                certificate = bool(tls_object.getpeercert()) if tls_object is not None else False
                connection.credentialed = certificate
                self._places.note_shown(connection)
            while True:
                connection.waiting, connection.waiting_since = True, time.monotonic()
                event = await next_request(reader, protocol, connection, self.limits, self.counters)
                connection.partial = False
                if event is None:
                    return
                connection.waiting = False
                request = request_of(event, peer[0] if peer else "", certificate)
                connection.presenting = "authorization" in request.headers
                connection.credentialed = connection.credentialed or self._endpoint.credentialed(request)
                self._places.note_shown(connection)
                if "content-length" in request.headers and "transfer-encoding" in request.headers:
                    # A request smuggling's shape: answered, then the connection closed (RFC 9112 6.1).
                    raise HttpError(400, "Content-Length and Transfer-Encoding together")
                # A GET or HEAD has no body: its end is already in h11's buffer.
                # Anything else (a body, another method) is answered, then closed.
                ended = request.method in ("GET", "HEAD") and isinstance(protocol.next_event(), h11.EndOfMessage)
                try:
                    response = await answer(reader, protocol, request, self._endpoint, self.limits)
                except Exception as error:  # a handler's bug must not cost the client its answer
                    response = self._unexpected(request, error)
                    ended = False
                if response is None:
                    return  # the client left before its answer was ready
                if not ended:
                    await send_and_close(writer, response, self.limits, protocol)
                    return
                if not await send(
                    writer, protocol, response, self.limits, head=request.method == "HEAD", on=connection
                ):
                    return
                connection.answered += 1
                connection.presenting = False
                connection.credentialed = connection.credentialed or response.authorized
                self._places.note_shown(connection)
                if protocol.our_state is not h11.DONE or protocol.their_state is not h11.DONE:
                    return  # HTTP/1.0 or Connection: close
                protocol.start_next_cycle()
        except HttpError as error:
            await send_and_close(writer, text(error.status, f"{error}\n"), self.limits, protocol)
        except (TimeoutError, h11.ProtocolError, ConnectionError, OSError, asyncio.IncompleteReadError):
            pass  # a dropped connection, a failed or slow TLS handshake
        except Exception as error:  # never a traceback per connection, whatever the bytes
            self._note_unexpected("serving a connection", error)
        finally:
            connections.discard(connection)
            self.counters.closed += 1
            close(writer)
            self._places.dispatch()

    def _unexpected(self, request: Request, error: Exception) -> Response:
        self._note_unexpected(f"answering {request.method} {request.path}", error)
        return text(500, "internal error; the agent's log says more\n")

    def _note_unexpected(self, what: str, error: Exception) -> None:
        """One short line per kind of error a minute at most, never a traceback per request."""
        self.counters.errors += 1
        kind = type(error).__name__
        if self._logged_errors.due(kind):
            log.error(
                "unexpected error %s: %s: %s (%d so far; this kind is logged once a minute at most)",
                what,
                kind,
                str(error)[:200],
                self.counters.errors,
            )


def _quiet_exceptions(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A client that drops or botches a connection (a TLS handshake to
    nowhere, a reset) is not the agent's error: debug, not a traceback."""
    error = context.get("exception")
    if isinstance(error, (ConnectionError, OSError, ssl.SSLError, asyncio.TimeoutError)):
        log.debug("connection: %s", context.get("message"))
        return
    loop.default_exception_handler(context)
