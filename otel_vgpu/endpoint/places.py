"""Places under the connection cap (`Limits.connections`): a new connection takes a free
one, or one a connection shed for it leaves (endpoint/admission.py's rule), or waits up to
`admit_wait_s` in a queue shared max-min fairly by network and address (endpoint/queues.py),
else is refused. Addresses that have shown a valid credential lately are admitted first.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

from otel_vgpu.endpoint.admission import victim
from otel_vgpu.endpoint.auth import network_of
from otel_vgpu.endpoint.connections import Connection, Counters
from otel_vgpu.endpoint.handshakes import Handshakes
from otel_vgpu.endpoint.queues import ADMIT_TICK_S, FairQueue, take_one
from otel_vgpu.limits import Limits

# An address that has shown a valid credential is favoured for this long after (a scrape
# interval is a minute at most), and this many such addresses are remembered.
SHOWN_FOR_S = 600.0
SHOWN_REMEMBERED = 1024


class Places:
    """The places of a server's connections, and the connections waiting for one."""

    def __init__(self, limits: Limits, counters: Counters, credentials: bool, handshakes: Handshakes) -> None:
        """`credentials`: the server requires one (a client certificate, a password), so that a
        connection that never presented one is shed first; `handshakes`: where a connection
        shed for a newcomer may be waiting for a slot."""
        self._limits = limits
        self._counters = counters
        self._credentials = credentials
        self._handshakes = handshakes
        self._credentials_shown: collections.OrderedDict[str, float] = collections.OrderedDict()
        """Addresses that have shown a valid credential, when they last did, the least recent first."""
        self._queue = FairQueue(limits.admit_queue, network_of, self._shown)
        """New connections waiting for a place under the cap, served fairly (endpoint/queues.py)."""
        self._reserved: collections.Counter[str] = collections.Counter()
        """Places given to waiting connections that have not taken them yet, by address."""
        self._ticking = False

    def _victim(self, now: float, newcomer: str) -> Connection | None:
        """A connection to shed for a new one from `newcomer` (endpoint/admission.py)."""
        found = victim(
            self._counters.connections,
            newcomer,
            now,
            self._limits,
            self._credentials,
            network_of,
            self._shown(newcomer),
        )
        return found if isinstance(found, Connection) else None

    def note_shown(self, connection: Connection) -> None:
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

    async def admit(self, source: str) -> bool:
        """A place under the cap for a new connection from `source`: a free one, one a shed
        connection leaves, or one that frees within `admit_wait_s` (clients that come and go,
        as a flood's do, free places every few milliseconds). Waiters are served fairly
        (endpoint/queues.py), each that a place can be made for. False: refuse it."""
        if self._place_now(source):
            return True
        waiter = self._queue.join(source)
        if waiter is None:
            return False
        self._tick()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter.turn), self._limits.admit_wait_s)
        finally:
            self._queue.leave(waiter)
            served = waiter.turn.done() and waiter.turn.result()
            if served:  # given its place (as the wait ran out, too: it takes it)
                take_one(self._reserved, source)
            elif not waiter.turn.done():
                waiter.turn.cancel()
        return served

    def _place_now(self, source: str) -> bool:
        """A place for a connection from `source` now, shedding one if need be (the caller takes it at once)."""
        if len(self._counters.connections) + self._reserved.total() < self._limits.connections:
            return True
        shed = self._victim(time.monotonic(), source)
        if shed is None:
            return False
        self._counters.connections.discard(shed)
        shed.writer.transport.abort()
        self._handshakes.withdraw(shed)  # it may have waited for a handshake slot: it waits no more
        self._counters.shed += 1
        return True

    def dispatch(self) -> None:
        """Give the waiting connections the places there are, fairly: in turn, the waiter whose
        network, then address, holds the fewest places. Where no place is free, one is made
        (a connection shed) for that waiter only: the rule finds one for whoever holds the
        fewest if for anyone, and asking it for each of 128 waiters of 128 addresses took
        the loop's every turn."""
        while len(self._queue):
            held = [c.source for c in self._counters.connections] + list(self._reserved.elements())
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
            self.dispatch()
            self._tick()

        asyncio.get_running_loop().call_later(ADMIT_TICK_S, tick)
