"""TLS handshakes, bounded: at most `Limits.handshakes` run at once, each within
`handshake_s` of its connection's place.

Each handshake holds OpenSSL's state and a read buffer (endpoint/connections.py
TLS_READ_BYTES): the bound is on what a flood of handshakes takes. The others wait, their
ClientHello unread in the kernel, and a freed slot goes to the waiter whose network, then
address, has the fewest running (endpoint/queues.py); while some wait, a handshake whose
client has gone quiet gives its slot up.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import time

from otel_vgpu.endpoint.auth import network_of
from otel_vgpu.endpoint.connections import Connection, Counters
from otel_vgpu.endpoint.queues import ADMIT_TICK_S, FairQueue, take_one
from otel_vgpu.limits import Limits


class Handshakes:
    """The TLS handshakes of a server's connections, and the connections waiting for a slot."""

    def __init__(self, limits: Limits, counters: Counters) -> None:
        self._limits = limits
        self._counters = counters
        self.running: set[Connection] = set()
        """Connections in their TLS handshake (`Limits.handshakes` at most)."""
        self.waiting = FairQueue(limits.connections, network_of)
        """Connections under the cap waiting for a handshake slot, served fairly."""
        self._granted: collections.Counter[str] = collections.Counter()
        """Handshake slots given to waiting connections that have not taken them yet, by address."""

    def withdraw(self, connection: Connection) -> None:
        """`connection`, shed, waits for a slot no more (if it waited)."""
        if connection.slot is not None:
            self.waiting.end(connection.slot, served=False)

    async def handshake(self, connection: Connection, context: ssl.SSLContext) -> bool:
        """The TLS handshake, once a slot is free (`Limits.handshakes`), within `handshake_s`
        of the connection's place, its wait for a slot included. False: no slot in time, or
        the connection was shed (a failed handshake raises, as start_tls does)."""
        deadline = connection.opened + self._limits.handshake_s
        if not await self._slot(connection, deadline):
            return False
        self.running.add(connection)
        connection.waiting_since = time.monotonic()  # from its handshake's start: how long it has been stuck
        try:
            await connection.writer.start_tls(context, ssl_handshake_timeout=max(0.1, deadline - time.monotonic()))
        finally:
            self.running.discard(connection)
            self._next()
        return True

    async def _slot(self, connection: Connection, deadline: float) -> bool:
        """A handshake slot for `connection`: at once if one is free and nobody waits, else
        when `_next` gives it one. False: shed while waiting, or out of time."""
        running = len(self.running) + self._granted.total()
        if running < self._limits.handshakes and not len(self.waiting):
            return True
        slot = self.waiting.join(connection.source)
        if slot is None:
            return False
        connection.slot = slot
        take = False
        try:
            while not slot.turn.done() and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(slot.turn), min(ADMIT_TICK_S, deadline - time.monotonic()))
                self._shed_stuck()
            take = slot.turn.done() and slot.turn.result() and connection in self._counters.connections
        finally:
            connection.slot = None
            self.waiting.leave(slot)
            if slot.turn.done() and slot.turn.result():
                take_one(self._granted, connection.source)
                if not take:  # given a slot it cannot use: the next waiter's
                    self._next()
            elif not slot.turn.done():
                slot.turn.cancel()
        return take

    def _shed_stuck(self) -> None:
        """While connections wait for a slot, a handshake whose client has sent nothing unread
        for `quiet_after_s` (`shed_after_s` for its address's only one: a loaded client may
        be slow to answer) gives its slot up; a client answers the agent's flight at once.
        300 half-sent ClientHellos held every slot until their deadline, and a scraper of
        their address waited 1.25 s of its 1.5 s."""
        now = time.monotonic()
        running = collections.Counter(c.source for c in self.running)
        limits = self._limits
        for stuck in [
            c
            for c in self.running
            if now - c.waiting_since >= (limits.quiet_after_s if running[c.source] > 1 else limits.shed_after_s)
            and c.quiet()
        ]:
            self._counters.connections.discard(stuck)
            stuck.writer.transport.abort()
            self._counters.shed += 1

    def _next(self) -> None:
        """Free handshake slots to the waiters whose network, then address, has the fewest running."""
        while len(self.waiting) and len(self.running) + self._granted.total() < self._limits.handshakes:
            held = [c.source for c in self.running] + list(self._granted.elements())
            first = self.waiting.ranked(held)[0]
            self._granted[first.source] += 1
            self.waiting.end(first, served=True)
