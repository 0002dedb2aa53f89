"""A bound on each line of a Kubernetes API watch, below lightkube.

lightkube reads a watch with httpx2's `iter_lines`, which holds a line whole
before lightkube parses it, however long: one line of 200 MB without a newline
took the agent from 47 to 278 MiB. `BoundedWatchLines` wraps the transport that
lightkube's client built (its TLS, its pool) and ends a watch whose line grows
past the bound with a read error, which the list-and-watch loop answers as any
broken watch: it logs one line, counts it, and lists again.
"""

from __future__ import annotations

import contextlib
import socket
import weakref
from collections.abc import Iterator
from typing import Any

import httpx2

# One watch event is one object, which etcd bounds to 1.5 MiB by default
# (--max-request-bytes); a line several times that is no event.
MAX_WATCH_LINE_BYTES = 8 * 1024 * 1024


class WatchLineTooLong(httpx2.ReadError):
    """A watch line over the bound."""


class _BoundedLines(httpx2.SyncByteStream):
    def __init__(self, inner: httpx2.SyncByteStream, most: int) -> None:
        self._inner = inner
        self._most = most

    def __iter__(self) -> Iterator[bytes]:
        run = 0  # bytes since the last newline
        for chunk in self._inner:
            newline = chunk.rfind(b"\n")
            run = len(chunk) - newline - 1 if newline >= 0 else run + len(chunk)
            if run > self._most:
                raise WatchLineTooLong(
                    f"a Kubernetes API watch sent more than {self._most} bytes without a newline, which no one "
                    "event is; the watch is dropped and the pods listed again"
                )
            yield chunk

    def close(self) -> None:
        self._inner.close()


class BoundedWatchLines(httpx2.BaseTransport):
    """`inner`, with each line of every watch response bounded to `most` bytes, and a way
    to wake the threads reading its watches (`interrupt`)."""

    def __init__(self, inner: httpx2.BaseTransport, most: int) -> None:
        self._inner = inner
        self._most = most
        self._watches: weakref.WeakSet[Any] = weakref.WeakSet()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self._inner.handle_request(request)
        if request.url.params.get("watch") in ("true", "1"):
            stream = response.stream
            assert isinstance(stream, httpx2.SyncByteStream)
            response.stream = _BoundedLines(stream, self._most)
            network = response.extensions.get("network_stream")
            if network is not None:
                self._watches.add(network)
        return response

    def interrupt(self) -> None:
        """Shut down the sockets of the watches being read: their readers wake with an end
        of input and close them themselves. Closing them from here instead would free the
        descriptor under a thread still inside a read, for the next socket the process
        opens (a scraper's) to take: that thread's next read then takes its bytes."""
        for network in list(self._watches):
            sock = network.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._inner.close()
