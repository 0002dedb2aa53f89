"""Waiters for something bounded (a place under the connection cap, a TLS handshake slot),
served max-min fairly by network and then address (endpoint/fair_shares.py); on the event loop.

First come first served let one client that opens connections as fast as they are answered
fill the queue: the scraper's connection waited behind 128 of its, or found the queue full
and got its 503 at once. Here the next served is the waiter whose network, then address,
holds the least of the thing waited for; and a full queue makes room for a newcomer by
refusing the newest waiter of the network (else address) with the most waiters, where it
has more than the newcomer's would: the newcomer is refused only when nobody waits more.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from otel_vgpu.endpoint.fair_shares import Tally, over_share

# How often connections waiting for a place look for one that became sheddable (and those
# waiting for a handshake slot, for a handshake gone quiet).
ADMIT_TICK_S = 0.05


@dataclass(eq=False)
class Waiter:
    source: str
    order: int
    turn: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    """True once served; False once refused to make room for another."""


class FairQueue:
    """At most `limit` waiters."""

    def __init__(
        self, limit: int, network_of: Callable[[str], str], favoured: Callable[[str], bool] = lambda source: False
    ) -> None:
        """`favoured`: sources served before the rest, and given room before them (addresses
        that have shown a valid credential)."""
        self._limit = limit
        self._network_of = network_of
        self._favoured = favoured
        self._waiting: list[Waiter] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._waiting)

    def join(self, source: str) -> Waiter | None:
        """A place in the queue for `source`, or None: full of waiters none of whom waits
        more than the newcomer would."""
        if len(self._waiting) >= self._limit:
            others = [w for w in self._waiting if not self._favoured(w.source)]
            if self._favoured(source) and others:
                holder = over_share((w.source for w in others), "", self._network_of)
            else:
                others = self._waiting
                holder = over_share((w.source for w in others), source, self._network_of)
            if holder is None and others is self._waiting:
                return None
            # Its newest: the one that has waited least for its turn.
            held = [w for w in others if holder is None or holder.holds(w.source, self._network_of)]
            self.end(max(held, key=lambda w: w.order), served=False)
        waiter = Waiter(source, next(self._order))
        self._waiting.append(waiter)
        return waiter

    def ranked(self, held: Iterable[str]) -> list[Waiter]:
        """The waiters, the next to serve first: the least held (`held`: a source per unit
        its holder holds now) by the waiter's network, then by its address, then the oldest;
        the favoured before all."""
        tally = Tally.of(held, self._network_of)
        return sorted(
            self._waiting,
            key=lambda w: (not self._favoured(w.source), *tally.rank(w.source, self._network_of), w.order),
        )

    def end(self, waiter: Waiter, served: bool) -> None:
        """Serve or refuse `waiter`; nothing if it has left the queue already."""
        if waiter in self._waiting:
            self._waiting.remove(waiter)
            if not waiter.turn.done():
                waiter.turn.set_result(served)

    def leave(self, waiter: Waiter) -> None:
        """The waiter gave up (its wait ran out, or its client left)."""
        if waiter in self._waiting:
            self._waiting.remove(waiter)


def take_one(granted: collections.Counter[str], source: str) -> None:
    """One of what was given to `source` and not yet taken is taken (or given back)."""
    granted[source] -= 1
    if granted[source] <= 0:
        del granted[source]
