"""HTTP messages as the endpoint sees them: a request, a response, and the header rules.

Pure functions over h11's events and plain data; no sockets, no loop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import h11


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
    authorized: bool = False
    """It answers a request that presented a valid credential (the connection has shown it may scrape)."""


def text(status: int, body: str, *headers: tuple[str, str]) -> Response:
    return Response(status, body.encode(), headers=headers)


class Application(Protocol):
    """What a server serves: an answer to each request, and a close when it stops."""

    async def handle(self, request: Request) -> Response: ...

    def credentialed(self, request: Request) -> bool:
        """Whether the request presents a credential already known to be valid (cheap: no
        check is made): its connection is then never shed for one that has shown none."""
        ...

    def close(self) -> None: ...


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


def request_of(event: h11.Request, peer: str, certificate: bool) -> Request:
    headers: dict[str, str] = {}
    for name, value in event.headers:
        key = name.decode("latin-1").lower()
        decoded = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {decoded}" if key in headers else decoded
    target = event.target.decode("latin-1")
    path = target.split("?", 1)[0]
    if path[:8].lower().startswith(("http://", "https://")):  # absolute form; the scheme is case-insensitive
        path = "/" + path.split("/", 3)[3] if path.count("/") >= 3 else "/"
    # Percent-encoded unreserved characters are the characters (RFC 3986 6.2.2.2): /%6detrics is /metrics.
    path = _UNRESERVED_ESCAPE.sub(_unescape_unreserved, path)
    # Methods are case-sensitive (RFC 9110 9.1): `head` is no HEAD, and gets 405.
    return Request(event.method.decode("latin-1"), _normalise(path), headers, peer, certificate)


_UNRESERVED_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _unescape_unreserved(match: re.Match[str]) -> str:
    char = chr(int(match.group(1), 16))
    return char if char in _UNRESERVED else match.group(0)


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
