"""A connection as the server holds it (`Connection`), its stream, and closing it.

The stream reader counts the bytes it holds unread, and the protocol leaves a TLS connection
unread until its handshake starts: what a client has sent, in the reader or in the kernel, is
what tells one that has sent its request (or ClientHello) from a silent one, which the cap
sheds first (endpoint/admission.py).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import fcntl
import struct
import termios
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, SupportsIndex

from otel_vgpu.endpoint.queues import Waiter

# What asyncio's TLS layer reads at a time, and allocates (zeroed) for each TLS connection:
# 256 KiB by default (SSLProtocol.max_size, a class attribute: start_tls builds the protocol
# itself). A request head is 16 KiB at most and a TLS record as much; 32 KiB holds two. A
# flood of handshakes churning those buffers took the agent from 38 to 105 MiB; with 32 KiB,
# to 60 (tests/system/test_wrk_floods.py): a closed connection's buffer waits in asyncio's cycles
# for a collection (memory.py), and a flood's closed connections are many.
TLS_READ_BYTES = 32 * 1024
asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BYTES


class CountingReader(asyncio.StreamReader):
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


class HeldProtocol(asyncio.StreamReaderProtocol):
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
class Connection:
    """One connection the server holds: its stream, and what the shedding rule reads of it
    (endpoint/admission.py's `Held`)."""

    writer: asyncio.StreamWriter
    reader: asyncio.StreamReader
    waiting_since: float
    source: str = ""
    """The peer's address; its network is network_of(source)."""
    opened: float = 0.0
    """When it was given its place."""
    credentialed: bool = False
    """It has presented a valid credential (a client certificate, a password): what never
    did is shed before it when credentials are required (endpoint/admission.py)."""
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
    """What the server has done to its connections, and those it holds now."""

    errors: int = 0
    """Unexpected errors in handlers, answered 500."""
    closed: int = 0
    shed: int = 0
    refused: int = 0
    timed_out: int = 0
    connections: set[Connection] = field(default_factory=set)


def close(writer: asyncio.StreamWriter) -> None:
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
