"""The HTTP server: connections, their bounds, and TLS, for an application (endpoint.py).

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
  one by the rule of export/admission.py (idle or trickling, a stalled reader, one
  that never presented a credential, one of whoever holds more than the newcomer
  would: the cap is shared max-min fairly by address and network); if none can
  go, the new one waits for a place in a queue shared the same way (export/queues.py),
  then gets 503 (on a TLS port, a close before the handshake);
- at most `handshakes` TLS handshakes run at once (each holds OpenSSL's state and a
  read buffer, TLS_READ_BYTES); the others wait, their ClientHello unread in the kernel,
  and the next to start is of the network, then address, with the fewest running;
- only GET and HEAD (405 otherwise); HEAD gets the headers and no body;
  gzip as `Accept-Encoding` asks, q-values and case included;
- with mutual TLS, a client certificate is asked for and checked in the
  handshake, and required on /metrics only: the kubelet's probes send none.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import collections
import contextlib
import fcntl
import logging
import socket
import ssl
import struct
import termios
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, SupportsIndex

import h11

from otel_vgpu.export.admission import victim
from otel_vgpu.export.auth import network_of
from otel_vgpu.export.http import Application, Request, Response, request_of, text
from otel_vgpu.export.memory import trim
from otel_vgpu.export.queues import FairQueue, Waiter
from otel_vgpu.limits import DEFAULT_LIMITS, Limits
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)

# The heap is trimmed at most this often, once this many connections have closed since the last trim.
TRIM_EVERY_S = 5.0
TRIM_AFTER_CLOSED = 32
# How long stopping waits for the connections' tasks to end once cancelled.
STOP_WAIT_S = 2.0
# How often connections waiting for a place look for one that became sheddable.
ADMIT_TICK_S = 0.05
# Connections the kernel queues before the loop accepts them (their SYNs are not dropped in a
# burst, so a scraper's connect does not wait out a retransmission); accepted, they count.
LISTEN_QUEUE = 1024
# How long accepting waits after the system ran out of descriptors or buffers.
ACCEPT_RETRY_S = 1.0
# A response is written this much at a time, each piece once the peer has taken the last.
WRITE_CHUNK = 64 * 1024
# What asyncio's TLS layer reads at a time, and allocates (zeroed) for each TLS connection:
# 256 KiB by default (SSLProtocol.max_size, a class attribute: start_tls builds the protocol
# itself). A request head is 16 KiB at most and a TLS record as much; 32 KiB holds two. A
# flood of handshakes churning those buffers took the agent from 38 to 105 MiB; with 32 KiB,
# to 60 (tests/test_wrk_floods.py): a closed connection's buffer waits in asyncio's cycles
# for a collection (export/memory.py), and a flood's closed connections are many.
TLS_READ_BYTES = 32 * 1024
asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BYTES
# An address that has shown a valid credential is favoured for this long after (a scrape
# interval is a minute at most), and this many such addresses are remembered.
SHOWN_FOR_S = 600.0
SHOWN_REMEMBERED = 1024
# An unexpected error of one kind is logged at most this often.
UNEXPECTED_LOG_EVERY_S = 60.0


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


class _Protocol(asyncio.StreamReaderProtocol):
    """With TLS, a new connection is not read until its handler starts the handshake:
    a ClientHello read before that would land in the stream reader, where the TLS
    layer never sees it (the handshake would hang), and bytes waiting in the kernel
    are what tells a client that has sent its hello from a silent one."""

    def __init__(self, reader: asyncio.StreamReader, serve: Any, loop: asyncio.AbstractEventLoop, hold: bool) -> None:
        super().__init__(reader, serve, loop=loop)
        self._hold = hold

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._hold and isinstance(transport, asyncio.ReadTransport):
            transport.pause_reading()  # start_tls resumes it, for the TLS layer


@dataclass(slots=True, eq=False)
class _Connection:
    writer: asyncio.StreamWriter
    reader: asyncio.StreamReader
    waiting_since: float
    source: str = ""
    """The peer's address; its network is network_of(source)."""
    opened: float = 0.0
    """When it was given its place."""
    credentialed: bool = False
    """It has presented a valid credential (a client certificate, a password): what never
    did is shed before it when credentials are required (export/admission.py)."""
    answered: int = 0
    """Responses sent on it: a kept-alive connection has answered one at least."""
    waiting: bool = True
    """Idle, or receiving a request head: what the cap sheds first."""
    handshaking: bool = False
    """In its TLS handshake or waiting for a handshake slot: shed only when nothing it sent
    waits to be read, or for a newcomer below its holder's share (the handshake has its own deadline)."""
    partial: bool = False
    """The loop has read part of a request head and waits for the rest (a trickler, past `shed_after_s`)."""
    presenting: bool = False
    """Its request, not answered yet, presents a credential (its password may wait for its
    check): not shed as one that never presented one."""
    slot: Waiter | None = None
    """Its place in the queue for a handshake slot, while it waits for one."""
    writing_since: float | None = None
    """When the response being written last made progress (a chunk taken by the peer); None when not writing."""

    def stalled(self, now: float, after_s: float) -> bool:
        """Writing a response the peer has taken nothing of for `after_s`: a reader that does not read."""
        return self.writing_since is not None and now - self.writing_since >= after_s

    def quiet(self) -> bool:
        """Nothing it sent waits to be read, in the reader or in the kernel."""
        return getattr(self.reader, "unread", 0) == 0 and _unread_bytes(self.writer) == 0


@dataclass(slots=True)
class Counters:
    errors: int = 0
    """Unexpected errors in handlers, answered 500."""
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
        self._client_certificates = ssl_context is not None and ssl_context.verify_mode != ssl.CERT_NONE
        self._credentials = credentials or self._client_certificates
        self.tls = ssl_context is not None
        self.limits = limits
        self.counters = Counters()
        self._logged_errors: dict[str, float] = {}
        self._credentials_shown: collections.OrderedDict[str, float] = collections.OrderedDict()
        """Addresses that have shown a valid credential, when they last did, the least recent first."""
        self._queue = FairQueue(limits.admit_queue, network_of, self._shown)
        """New connections waiting for a place under the cap, served fairly (export/queues.py)."""
        self._reserved: collections.Counter[str] = collections.Counter()
        """Places given to waiting connections that have not taken them yet, by address."""
        self._handshaking: set[_Connection] = set()
        """Connections in their TLS handshake (`Limits.handshakes` at most)."""
        self._slots = FairQueue(limits.connections, network_of)
        """Connections under the cap waiting for a handshake slot, served fairly."""
        self._granted: collections.Counter[str] = collections.Counter()
        """Handshake slots given to waiting connections that have not taken them yet, by address."""
        self._ticking = False
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
            return _Protocol(
                _Reader(limit=self.limits.head_bytes, loop=loop), self._serve, loop=loop, hold=self._ssl is not None
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

    def _victim(self, now: float, newcomer: str) -> _Connection | None:
        """A connection to shed for a new one from `newcomer` (export/admission.py)."""
        found = victim(
            self.counters.connections, newcomer, now, self.limits, self._credentials, network_of, self._shown(newcomer)
        )
        return found if isinstance(found, _Connection) else None

    def _note_shown(self, connection: _Connection) -> None:
        """Its address has shown a valid credential (now)."""
        if connection.credentialed:
            self._credentials_shown.pop(connection.source, None)
            self._credentials_shown[connection.source] = time.monotonic()
            while len(self._credentials_shown) > SHOWN_REMEMBERED:
                self._credentials_shown.popitem(last=False)

    def _shown(self, source: str) -> bool:
        """`source` has shown a valid credential within SHOWN_FOR_S: its new connections are
        admitted before, and in place of, those of addresses that have not (the scraper
        among 253 addresses of its /24 was otherwise one waiter of as many)."""
        if not self._credentials:
            return False
        shown = self._credentials_shown.get(source)
        return shown is not None and time.monotonic() - shown < SHOWN_FOR_S

    async def _admit(self, source: str) -> bool:
        """A place under the cap for a new connection from `source`: a free one, one a shed
        connection leaves, or one that frees within `admit_wait_s` (clients that come and go,
        as a flood's do, free places every few milliseconds). Waiters are served fairly
        (export/queues.py), each that a place can be made for. False: refuse it."""
        if self._place_now(source):
            return True
        waiter = self._queue.join(source)
        if waiter is None:
            return False
        self._tick()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter.turn), self.limits.admit_wait_s)
        finally:
            self._queue.leave(waiter)
            served = waiter.turn.done() and waiter.turn.result()
            if served:  # given its place (as the wait ran out, too: it takes it)
                _take_one(self._reserved, source)
            elif not waiter.turn.done():
                waiter.turn.cancel()
        return served

    def _place_now(self, source: str) -> bool:
        """A place for a connection from `source` now, shedding one if need be (the caller takes it at once)."""
        if len(self.counters.connections) + self._reserved.total() < self.limits.connections:
            return True
        shed = self._victim(time.monotonic(), source)
        if shed is None:
            return False
        self.counters.connections.discard(shed)
        shed.writer.transport.abort()
        if shed.slot is not None:  # it waited for a handshake slot: it waits no more
            self._slots.end(shed.slot, served=False)
        self.counters.shed += 1
        return True

    def _dispatch(self) -> None:
        """Give the waiting connections the places there are, fairly: in turn, the waiter whose
        network, then address, holds the fewest places. Where no place is free, one is made
        (a connection shed) for that waiter only: the rule finds one for whoever holds the
        fewest if for anyone, and asking it for each of 128 waiters of 128 addresses took
        the loop's every turn."""
        while len(self._queue):
            held = [c.source for c in self.counters.connections] + list(self._reserved.elements())
            first = self._queue.ranked(held)[0]
            if not self._place_now(first.source):
                return
            self._reserved[first.source] += 1
            self._queue.end(first, served=True)

    def _tick(self) -> None:
        """While connections wait, look for places every ADMIT_TICK_S too: one may become
        sheddable (quiet long enough) without any connection closing."""
        if self._ticking or not len(self._queue):
            return
        self._ticking = True

        def tick() -> None:
            self._ticking = False
            self._dispatch()
            self._tick()

        asyncio.get_running_loop().call_later(ADMIT_TICK_S, tick)

    def _free_place(self) -> None:
        self._dispatch()

    async def _handshake(self, connection: _Connection, context: ssl.SSLContext) -> bool:
        """The TLS handshake, once a slot is free (`Limits.handshakes`), within `handshake_s`
        of the connection's place, its wait for a slot included. False: no slot in time, or
        the connection was shed (a failed handshake raises, as start_tls does)."""
        deadline = connection.opened + self.limits.handshake_s
        if not await self._handshake_slot(connection, deadline):
            return False
        self._handshaking.add(connection)
        connection.waiting_since = time.monotonic()  # from its handshake's start: how long it has been stuck
        try:
            await connection.writer.start_tls(context, ssl_handshake_timeout=max(0.1, deadline - time.monotonic()))
        finally:
            self._handshaking.discard(connection)
            self._next_handshake()
        return True

    async def _handshake_slot(self, connection: _Connection, deadline: float) -> bool:
        """A handshake slot for `connection`: at once if one is free and nobody waits, else
        when `_next_handshake` gives it one. False: shed while waiting, or out of time."""
        running = len(self._handshaking) + self._granted.total()
        if running < self.limits.handshakes and not len(self._slots):
            return True
        slot = self._slots.join(connection.source)
        if slot is None:
            return False
        connection.slot = slot
        take = False
        try:
            while not slot.turn.done() and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(slot.turn), min(ADMIT_TICK_S, deadline - time.monotonic()))
                self._shed_stuck_handshakes()
            take = slot.turn.done() and slot.turn.result() and connection in self.counters.connections
        finally:
            connection.slot = None
            self._slots.leave(slot)
            if slot.turn.done() and slot.turn.result():
                _take_one(self._granted, connection.source)
                if not take:  # given a slot it cannot use: the next waiter's
                    self._next_handshake()
            elif not slot.turn.done():
                slot.turn.cancel()
        return take

    def _shed_stuck_handshakes(self) -> None:
        """While connections wait for a slot, a handshake whose client has sent nothing unread
        for `quiet_after_s` (`shed_after_s` for its address's only one: a loaded client may
        be slow to answer) gives its slot up; a client answers the agent's flight at once.
        300 half-sent ClientHellos held every slot until their deadline, and a scraper of
        their address waited 1.25 s of its 1.5 s."""
        now = time.monotonic()
        running = collections.Counter(c.source for c in self._handshaking)
        limits = self.limits
        for stuck in [
            c
            for c in self._handshaking
            if now - c.waiting_since >= (limits.quiet_after_s if running[c.source] > 1 else limits.shed_after_s)
            and c.quiet()
        ]:
            self.counters.connections.discard(stuck)
            stuck.writer.transport.abort()
            self.counters.shed += 1

    def _next_handshake(self) -> None:
        """Free handshake slots to the waiters whose network, then address, has the fewest running."""
        while len(self._slots) and len(self._handshaking) + self._granted.total() < self.limits.handshakes:
            held = [c.source for c in self._handshaking] + list(self._granted.elements())
            first = self._slots.ranked(held)[0]
            self._granted[first.source] += 1
            self._slots.end(first, served=True)

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
        if not await self._admit(source):
            self.counters.refused += 1
            if self._ssl is None:
                await self._send_and_close(writer, text(503, "too many connections; try again\n"))
            else:
                # Never clear text on a TLS port (a client would read it as a broken
                # handshake, WRONG_VERSION_NUMBER): closed before the handshake, which a
                # refused connection is not worth.
                _close(writer)
            return
        opened = time.monotonic()
        connection = _Connection(writer, reader, opened, source=source, opened=opened)
        connections.add(connection)
        protocol = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.head_bytes)
        try:
            certificate = False
            if self._ssl is not None:
                connection.handshaking = True
                try:
                    if not await self._handshake(connection, self._ssl):
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
                self._note_shown(connection)
            while True:
                connection.waiting, connection.waiting_since = True, time.monotonic()
                event = await self._next_request(reader, protocol, connection)
                connection.partial = False
                if event is None:
                    return
                connection.waiting = False
                request = request_of(event, peer[0] if peer else "", certificate)
                connection.presenting = "authorization" in request.headers
                connection.credentialed = connection.credentialed or self._endpoint.credentialed(request)
                self._note_shown(connection)
                if "content-length" in request.headers and "transfer-encoding" in request.headers:
                    # A request smuggling's shape: answered, then the connection closed (RFC 9112 6.1).
                    raise _HttpError(400, "Content-Length and Transfer-Encoding together")
                # A GET or HEAD has no body: its end is already in h11's buffer.
                # Anything else (a body, another method) is answered, then closed.
                ended = request.method in ("GET", "HEAD") and isinstance(protocol.next_event(), h11.EndOfMessage)
                try:
                    response = await self._answer(reader, protocol, request)
                except Exception as error:  # a handler's bug must not cost the client its answer
                    response = self._unexpected(request, error)
                    ended = False
                if response is None:
                    return  # the client left before its answer was ready
                if not ended:
                    await self._send_and_close(writer, response, protocol)
                    return
                if not await self._send(writer, protocol, response, head=request.method == "HEAD", on=connection):
                    return
                connection.answered += 1
                connection.presenting = False
                connection.credentialed = connection.credentialed or response.authorized
                self._note_shown(connection)
                if protocol.our_state is not h11.DONE or protocol.their_state is not h11.DONE:
                    return  # HTTP/1.0 or Connection: close
                protocol.start_next_cycle()
        except _HttpError as error:
            await self._send_and_close(writer, text(error.status, f"{error}\n"), protocol)
        except (TimeoutError, h11.ProtocolError, ConnectionError, OSError, asyncio.IncompleteReadError):
            pass  # a dropped connection, a failed or slow TLS handshake
        except Exception as error:  # never a traceback per connection, whatever the bytes
            self._note_unexpected("serving a connection", error)
        finally:
            connections.discard(connection)
            self.counters.closed += 1
            _close(writer)
            self._free_place()

    def _unexpected(self, request: Request, error: Exception) -> Response:
        self._note_unexpected(f"answering {request.method} {request.path}", error)
        return text(500, "internal error; the agent's log says more\n")

    def _note_unexpected(self, what: str, error: Exception) -> None:
        """One short line per kind of error a minute at most, never a traceback per request."""
        self.counters.errors += 1
        kind = type(error).__name__
        now = time.monotonic()
        if now - self._logged_errors.get(kind, -UNEXPECTED_LOG_EVERY_S) >= UNEXPECTED_LOG_EVERY_S:
            self._logged_errors[kind] = now
            log.error(
                "unexpected error %s: %s: %s (%d so far; this kind is logged once a minute at most)",
                what,
                kind,
                str(error)[:200],
                self.counters.errors,
            )

    async def _answer(
        self, reader: asyncio.StreamReader, protocol: h11.Connection, request: Request
    ) -> Response | None:
        """The endpoint's response, or None if the connection is reset first:
        its render, still queued for a worker, is then dropped, so scrapers
        that give up cannot leave a backlog of work nobody will read. An end of
        input is no such thing: HTTP/1.0 clients, `nc -N` and `socat` shut
        their write side once the request is sent (a half-close), and a
        request read whole is owed its response; the connection closes after
        it. (A client that closed altogether fails the write instead, and
        renders are shared, so the one it leaves costs no more.) What the
        client sends meanwhile (pipelined requests) is read only while h11's
        buffer has room for a request head: a client pipelining as fast as
        TCP allows fills its socket, not the agent's memory."""
        work = asyncio.ensure_future(self._endpoint.handle(request))
        room = self.limits.head_bytes - len(protocol.trailing_data[0])
        if room <= 0:
            return await work
        watch = asyncio.ensure_future(reader.read(room))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch.done():
                if watch.exception() is not None and not work.done():
                    work.cancel()  # reset: nobody is there to read the answer
                    return None
                data = b"" if watch.exception() is not None else watch.result()
                # A pipelined request, answered next; or b"", the end of input, after which
                # h11 has the connection close once this response is sent.
                protocol.receive_data(data)
            return await work
        finally:
            if not watch.done():
                watch.cancel()

    async def _next_request(
        self, reader: asyncio.StreamReader, protocol: h11.Connection, on: _Connection
    ) -> h11.Request | None:
        """The next request's head, within the limits; None when the client closed. `on.partial`
        while part of it has been read and the rest is awaited."""
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
            on.partial = on.partial or bool(data)
            if data and protocol.their_state is h11.IDLE and not protocol.trailing_data[0]:
                # Empty lines before a request line are ignored (RFC 9112 2.2: a server
                # "SHOULD ignore at least one"); h11 would answer them 400. They count
                # against the head's bound all the same. (b"" is the end of input: h11's.)
                data = data.lstrip(b"\r\n")
                if not data:
                    continue
            if received > self.limits.head_bytes:
                # h11 bounds what it buffers unparsed; this bounds the head whole.
                line_end = (bytes(protocol.trailing_data[0]) + data).find(b"\r\n")
                long_line = line_end < 0 or line_end > self.limits.head_bytes // 2
                raise _HttpError(414 if long_line else 431, "the request head is over the bound")
            protocol.receive_data(data)

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        protocol: h11.Connection,
        response: Response,
        head: bool = False,
        on: _Connection | None = None,
    ) -> bool:
        """Write the response a chunk at a time, each once the peer has taken the last:
        a connection holds at most a chunk and the transport's high-water mark, never a
        body (a shared body is not copied per connection), and one whose peer takes
        nothing is seen to stall (`on.writing_since`)."""
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            *response.headers,
        ]
        body = memoryview(response.body) if response.body and not head else memoryview(b"")

        def pieces() -> Iterator[bytes]:
            # Lazily: a piece is made (a chunk's copy) only when the last one has gone.
            yield protocol.send(h11.Response(status_code=response.status, headers=headers)) or b""
            for start in range(0, len(body), WRITE_CHUNK):
                yield protocol.send(h11.Data(data=bytes(body[start : start + WRITE_CHUNK]))) or b""
            yield protocol.send(h11.EndOfMessage()) or b""

        try:
            for piece in pieces():
                if on is not None:
                    on.writing_since = time.monotonic()
                writer.write(piece)
                await asyncio.wait_for(writer.drain(), self.limits.write_s)
        except (TimeoutError, ConnectionError, OSError):
            return False
        finally:
            if on is not None:
                on.writing_since = None
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


def _take_one(granted: collections.Counter[str], source: str) -> None:
    """One of what was given to `source` and not yet taken is taken (or given back)."""
    granted[source] -= 1
    if granted[source] <= 0:
        del granted[source]


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


def _quiet_exceptions(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A client that drops or botches a connection (a TLS handshake to
    nowhere, a reset) is not the agent's error: debug, not a traceback."""
    error = context.get("exception")
    if isinstance(error, (ConnectionError, OSError, ssl.SSLError, asyncio.TimeoutError)):
        log.debug("connection: %s", context.get("message"))
        return
    loop.default_exception_handler(context)
