"""The endpoint's bounds on every client (`Limits`), which endpoint/server.py and the modules
beside it apply: docs/endpoint.md and docs/reliability.md state them."""

from __future__ import annotations

from dataclasses import dataclass


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
    """A connection whose head the loop has read part of and that has waited this long for
    the rest may be shed (a trickler), and so may an address's only new connection silent
    this long (endpoint/admission.py)."""
    quiet_after_s: float = 0.25
    """A connection that has sent nothing unread for this long may be shed: a client sends
    its request (or ClientHello) right after connecting."""
    backlog: int = 64
    """Sockets accepted and not yet admitted or refused, at most, and how many one turn of the
    loop accepts: with `connections` and `admit_queue`, the bound on the sockets the agent
    holds (256); a burst past it waits in the kernel's queue (endpoint/server.py LISTEN_QUEUE)."""
    stuck_after_s: float = 120.0
    """/healthz fails once a sweep has run this long: liveness restarts an agent stuck in a read."""
    admit_wait_s: float = 2.0
    """A new connection over the cap waits this long for a place before its 503."""
    admit_queue: int = 128
    """New connections waiting for a place at most; past that, the newest waiter of whoever
    waits most (by network, then address) is refused for a newcomer, or the newcomer is."""
    handshakes: int = 16
    """TLS handshakes running at once; the rest wait (their ClientHello unread in the kernel),
    the next started of whoever has the fewest running. Each holds OpenSSL's state and a
    read buffer (endpoint/connections.py TLS_READ_BYTES): this bounds what a flood of handshakes takes."""
    stall_s: float = 2.0
    """A connection whose peer has taken nothing of its response for this long may be shed for a new one."""
    password_checks: int = 4
    """Password checks (bcrypt) running or queued at once; past that, 503 and the connection closed."""


DEFAULT_LIMITS = Limits()
