"""HTTP/1.1 on one connection, within the bounds (`Limits`): a request head read whole
within `head_bytes` and `head_deadline_s`, the endpoint's answer awaited while the
connection is watched for a reset, and a response written a chunk at a time.

h11 parses and writes the messages; the rules here are the bounds h11 leaves to its user.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import h11

from otel_vgpu.endpoint.connections import Connection, Counters, close
from otel_vgpu.endpoint.http import Application, Request, Response
from otel_vgpu.limits import Limits

# A response is written this much at a time, each piece once the peer has taken the last.
WRITE_CHUNK = 64 * 1024


class HttpError(Exception):
    """A request answered with `status` and the message, then the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def answer(
    reader: asyncio.StreamReader, protocol: h11.Connection, request: Request, endpoint: Application, limits: Limits
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
    work = asyncio.ensure_future(endpoint.handle(request))
    room = limits.head_bytes - len(protocol.trailing_data[0])
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


async def next_request(
    reader: asyncio.StreamReader, protocol: h11.Connection, on: Connection, limits: Limits, counters: Counters
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
            if status == 431 and b"\r\n" not in bytes(protocol.trailing_data[0])[: limits.head_bytes]:
                status = 414  # the request line alone is over the bound
            raise HttpError(status, str(error)) from None
        if isinstance(event, h11.Request):
            if event.http_version not in (b"1.0", b"1.1"):
                raise HttpError(505, f"HTTP/{event.http_version.decode()} is not served; use HTTP/1.1")
            return event
        if isinstance(event, h11.ConnectionClosed):
            return None
        if event is not h11.NEED_DATA:
            continue  # the end of the previous message
        now = time.monotonic()
        timeout = limits.idle_s if deadline is None else deadline - now
        if timeout <= 0:
            counters.timed_out += 1
            raise HttpError(408, "the request head took too long")
        try:
            data = await asyncio.wait_for(reader.read(8192), timeout)
        except TimeoutError:
            if deadline is None:
                return None  # idle: close quietly
            counters.timed_out += 1
            raise HttpError(408, "the request head took too long") from None
        if deadline is None and data:
            deadline = time.monotonic() + limits.head_deadline_s
        received += len(data)
        on.partial = on.partial or bool(data)
        if data and protocol.their_state is h11.IDLE and not protocol.trailing_data[0]:
            # Empty lines before a request line are ignored (RFC 9112 2.2: a server
            # "SHOULD ignore at least one"); h11 would answer them 400. They count
            # against the head's bound all the same. (b"" is the end of input: h11's.)
            data = data.lstrip(b"\r\n")
            if not data:
                continue
        if received > limits.head_bytes:
            # h11 bounds what it buffers unparsed; this bounds the head whole.
            line_end = (bytes(protocol.trailing_data[0]) + data).find(b"\r\n")
            long_line = line_end < 0 or line_end > limits.head_bytes // 2
            raise HttpError(414 if long_line else 431, "the request head is over the bound")
        protocol.receive_data(data)


async def send(
    writer: asyncio.StreamWriter,
    protocol: h11.Connection,
    response: Response,
    limits: Limits,
    head: bool = False,
    on: Connection | None = None,
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
            await asyncio.wait_for(writer.drain(), limits.write_s)
    except (TimeoutError, ConnectionError, OSError):
        return False
    finally:
        if on is not None:
            on.writing_since = None
    return True


async def send_and_close(
    writer: asyncio.StreamWriter, response: Response, limits: Limits, protocol: h11.Connection | None = None
) -> None:
    closing = Response(
        response.status, response.body, response.content_type, (*response.headers, ("Connection", "close"))
    )
    try:
        if protocol is not None and protocol.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await send(writer, protocol, closing, limits)
        else:
            fresh = h11.Connection(h11.SERVER)
            fresh.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            fresh.next_event()
            await send(writer, fresh, closing, limits)
    except (h11.ProtocolError, ConnectionError, OSError):
        pass
    close(writer)
