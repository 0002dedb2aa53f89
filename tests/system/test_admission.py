"""Admission under the connection cap, in process with a stub endpoint and a cap of one:
what a client that cannot have a place is told; and who gets a TLS handshake slot."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from otel_vgpu.endpoint.http import Request, Response, text
from otel_vgpu.endpoint.paths import Endpoint
from otel_vgpu.endpoint.server import LISTEN_QUEUE, Server
from otel_vgpu.endpoint.tls import tls_context
from otel_vgpu.limits import Limits
from testkit.agent import wait_until
from testkit.certs import make_certs


class Held:
    """An endpoint whose every answer waits until released: its connection is busy, never sheddable."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.asked = threading.Event()

    async def handle(self, request: Request) -> Response:
        self.asked.set()
        while not self.release.is_set():
            await asyncio.sleep(0.02)
        return text(200, "ok\n")

    def credentialed(self, request: Request) -> bool:
        return False

    def close(self) -> None:
        self.release.set()


# One place, nobody waits for it, nothing is shed for age: the second client is refused.
ONE_PLACE = Limits(connections=1, admit_queue=0, admit_wait_s=0.1, quiet_after_s=100, shed_after_s=100, stall_s=100)


@pytest.fixture(params=[False, True], ids=["http", "https"])
def busy_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Server, ssl.SSLContext | None]]:
    endpoint = Held()
    context = None
    client = None
    if request.param:
        certs = make_certs(tmp_path / "pki")
        context = tls_context(certs.cert, certs.key, None)
        client = ssl.create_default_context(cafile=str(certs.ca))
    server = Server("127.0.0.1", 0, cast(Endpoint, endpoint), context, limits=ONE_PLACE)
    server.start()
    try:
        # The one place, taken by a request whose answer is held.
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            held = client.wrap_socket(raw, server_hostname="localhost") if client else raw
            held.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_until(endpoint.asked.is_set, what="the first request being answered")
            yield server, client
            endpoint.release.set()
    finally:
        server.stop()


def test_a_refused_connection_hears_503_in_clear_only_on_a_clear_port(
    busy_server: tuple[Server, ssl.SSLContext | None],
) -> None:
    server, client = busy_server
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        if client is None:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 503 ")
        else:
            # A TLS client gets no clear-text bytes it would take for a broken handshake: the
            # connection is closed before the handshake, and the client says so as a TLS client.
            assert sock.recv(4096) == b""
    if client is not None:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)) as refused:
                client.wrap_socket(raw, server_hostname="localhost")
            assert "WRONG_VERSION_NUMBER" not in str(refused.value)
    assert server.counters.refused >= 1


def test_a_burst_of_connections_waits_in_the_kernels_queue_not_for_a_retransmission() -> None:
    # The listening socket's queue holds LISTEN_QUEUE connections: a burst past the loop's
    # accepts waits there, where a queue of `backlog` (asyncio's listen() as it starts
    # serving) dropped every 65th SYN and made its connect wait out a 1 s retransmission.
    ss = shutil.which("ss")
    assert ss is not None, "ss (iproute2) reads a listening socket's queue"
    server = Server("127.0.0.1", 0, cast(Endpoint, Held()), None)
    server.start()
    try:
        listing = subprocess.run(
            [ss, "-Hltn", f"sport = :{server.port}"], capture_output=True, text=True, check=True
        ).stdout.split()
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
        # For a listening socket, ss's Send-Q column is the queue's depth.
        assert int(listing[2]) == min(LISTEN_QUEUE, somaxconn), listing
    finally:
        server.stop()


def test_accepted_connections_send_without_waiting_for_acks(tmp_path: Path) -> None:
    # TCP_NODELAY on every accepted connection: a response's last piece goes out at once,
    # not after the client's delayed ACK (about 40 ms on each back-to-back request).
    endpoint = Held()
    server = Server("127.0.0.1", 0, cast(Endpoint, endpoint), None, limits=ONE_PLACE)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_until(endpoint.asked.is_set, what="the request being answered")
            (connection,) = server.counters.connections
            accepted = connection.writer.get_extra_info("socket")
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            endpoint.release.set()
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
    finally:
        server.stop()


def test_a_freed_handshake_slot_goes_to_whoever_has_fewest_running(tmp_path: Path) -> None:
    # Two slots, both held by one address's half-sent ClientHellos, two more of it waiting;
    # a client of another network waits behind them. The first slot freed is the newcomer's.
    certs = make_certs(tmp_path / "pki")
    limits = Limits(handshakes=2, connections=8, quiet_after_s=100, shed_after_s=100, handshake_s=20)
    server = Server("127.0.0.1", 0, cast(Endpoint, Held()), tls_context(certs.cert, certs.key, None), limits=limits)
    server.start()
    hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"  # a ClientHello's first bytes, never finished
    flood: list[socket.socket] = []
    try:

        def half_hello() -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(hello)
            flood.append(sock)
            return sock

        first = half_hello()
        half_hello()
        wait_until(lambda: len(server.handshakes.running) == 2, what="both slots taken")
        half_hello()
        half_hello()
        wait_until(lambda: len(server.handshakes.waiting) == 2, what="two waiting")
        done: list[str] = []

        def scraper() -> None:
            client = ssl.create_default_context(cafile=str(certs.ca))
            address = ("127.0.0.1", server.port)
            with (
                socket.create_connection(address, timeout=10, source_address=("127.99.0.50", 0)) as raw,
                client.wrap_socket(raw, server_hostname="localhost"),
            ):
                done.append("handshake")

        thread = threading.Thread(target=scraper, daemon=True)
        thread.start()
        wait_until(lambda: len(server.handshakes.waiting) == 3, what="the scraper waiting too")
        first.close()
        # Had the flood's next waiter taken the freed slot, its half-sent hello would hold
        # it (nothing here is shed for age) and the scraper would wait out its timeout.
        thread.join(timeout=10)
        assert done == ["handshake"]
        wait_until(
            lambda: len(server.handshakes.waiting) == 1, what="the scraper's slot passed on to the flood's next waiter"
        )
    finally:
        for sock in flood:
            sock.close()
        server.stop()
