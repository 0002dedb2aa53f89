"""The HTTP endpoint: /metrics for Prometheus, /healthz and /readyz for probes."""

from __future__ import annotations

import gzip
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import choose_encoder

from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.export.auth import BasicAuth
from otel_vgpu.export.telemetry import Telemetry
from otel_vgpu.gpu.pidns import blind_message

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
# A connection that sends nothing for this long is closed, so idle or
# half-open clients cannot hold a thread for ever.
CONNECTION_TIMEOUT_S = 30


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's backlog of 5 makes the sixth client waiting to be
    # accepted wait for SYN retries (a second or more each); the kernel caps
    # this at net.core.somaxconn.
    request_queue_size = 128
    ssl_context: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake runs here, in the connection's own thread, so a
        # client that connects and says nothing cannot stall the others.
        if self.ssl_context is not None:
            request.settimeout(CONNECTION_TIMEOUT_S)
            try:
                request = self.ssl_context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return  # plain HTTP, a bad client certificate, a dropped handshake
        super().finish_request(request, client_address)


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = CONNECTION_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        # A scrape every few seconds is not news.
        pass


def make_app(
    telemetry: Telemetry, sampler: Sampler, ready_max_age: float, auth: BasicAuth | None = None
) -> Callable[..., Iterable[bytes]]:
    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            # Probes stay open (they reveal nothing); the figures need credentials.
            if auth is not None and not auth.check(environ.get("HTTP_AUTHORIZATION")):
                headers = [
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("WWW-Authenticate", 'Basic realm="otel-vgpu"'),
                ]
                return _respond(start_response, "401 Unauthorized", b"unauthorized\n", headers)
            encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
            body = telemetry.render(encoder)
            headers = [("Content-Type", content_type)]
            if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
                body = gzip.compress(body, compresslevel=1)
                headers.append(("Content-Encoding", "gzip"))
            return _respond(start_response, "200 OK", body, headers)
        if path == "/healthz":
            return _respond(start_response, "200 OK", b"ok\n")
        if path == "/readyz":
            # The probe itself may sweep: a node nobody scrapes yet must still
            # become ready, or it would never be discovered and scraped.
            snapshot = sampler.snapshot(ready_max_age)
            if snapshot.ok and not snapshot.blind:
                return _respond(start_response, "200 OK", f"ready: {len(snapshot.gpus)} GPUs\n".encode())
            if snapshot.blind:
                # Serving would publish a node with no pods on it: the pod is
                # not ready until it shares the host's PID namespace.
                reasons = blind_message(snapshot.blind)
            else:
                reasons = "; ".join(message for _, message in snapshot.errors) or "no successful sweep"
            return _respond(start_response, "503 Service Unavailable", f"not ready: {reasons}\n".encode())
        if path == "/":
            body = b"otel-vgpu: /metrics (Prometheus), /healthz, /readyz\n"
            return _respond(start_response, "200 OK", body)
        return _respond(start_response, "404 Not Found", b"not found; try /metrics\n")

    return app


def _respond(
    start_response: StartResponse, status: str, body: bytes, headers: list[tuple[str, str]] | None = None
) -> list[bytes]:
    headers = headers or [("Content-Type", "text/plain; charset=utf-8")]
    start_response(status, [*headers, ("Content-Length", str(len(body)))])
    return [body]


def tls_context(cert_file: Path, key_file: Path, client_ca_file: Path | None) -> ssl.SSLContext:
    """A server context; with a client CA, clients must present a certificate it signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file is not None:
        context.load_verify_locations(client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class Server:
    """The endpoint, serving from a background thread."""

    def __init__(
        self,
        address: str,
        port: int,
        app: Callable[..., Iterable[bytes]],
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        server_class: type[_ThreadingServer] = _ThreadingServer6 if ":" in address else _ThreadingServer
        # OSError (port in use, address not available) reaches the caller.
        self._server = make_server(address, port, app, server_class=server_class, handler_class=_QuietHandler)
        self._server.ssl_context = ssl_context
        self.tls = ssl_context is not None
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
