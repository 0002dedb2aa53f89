"""Which connection goes when the cap is full and a new one asks for a place: the rule, over
what the server knows of each connection (export/server.py keeps the connections).

In order, the first that finds one:

1. one waiting for a request head that has sent nothing the loop has not read for
   `quiet_after_s` (a client sends its request, or its ClientHello, at once), or that has
   waited `shed_after_s` (a trickler; never a handshake whose bytes wait to be read: the
   loop is only busy); quiet ones first, oldest first;
2. one whose peer has taken nothing of its response for `stall_s`;
3. with credentials required (client certificates, basic auth), one that has never
   presented a valid one, of the address holding the most such places, oldest first: a
   client that has shown it may scrape never waits behind those that have not;
4. one of the network (/24, /64) holding the most places, where it holds more than the
   newcomer's network would (its places plus the newcomer's), else of the address holding
   the most, where it holds more than the newcomer's address would: the cap is shared
   max-min fairly, so a newcomer is served while anyone holds more than it;
5. the newcomer's own address's oldest connection waiting between requests (behind one
   proxy every client is one address: its new connection takes its oldest idle one's place).

In 3 to 5, a connection waiting between requests with nothing unread goes before one
mid-request, and none in its TLS handshake or younger than `quiet_after_s` (a scraper's
connection that has not sent its request yet) goes at all.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Iterable
from typing import Protocol

from otel_vgpu.config import Limits


class Held(Protocol):
    """What the rule reads of a connection that holds a place."""

    source: str
    waiting: bool
    waiting_since: float
    opened: float
    answered: int
    handshaking: bool
    writing_since: float | None
    credentialed: bool

    def quiet(self) -> bool: ...

    def stalled(self, now: float, after_s: float) -> bool: ...


def victim(
    connections: Collection[Held],
    newcomer: str,
    now: float,
    limits: Limits,
    credentials: bool,
    network_of: Callable[[str], str],
) -> Held | None:
    """The connection to shed for a newcomer from address `newcomer` (module docstring), or
    None: the newcomer waits, then gets its 503."""
    old = []
    for c in connections:
        if not c.waiting:
            continue
        age = now - c.waiting_since
        quiet = c.quiet()
        if (quiet and age >= limits.quiet_after_s) or (age >= limits.shed_after_s and not c.handshaking):
            old.append((not quiet, c.waiting_since, c))
    if old:
        return min(old, key=lambda entry: entry[:2])[2]
    stalled = [c for c in connections if c.stalled(now, limits.stall_s)]
    if stalled:
        return min(stalled, key=lambda c: c.writing_since or now)
    settled = [c for c in connections if not c.handshaking and now - c.opened >= limits.quiet_after_s]
    if credentials:
        anonymous = [c for c in settled if not c.credentialed]
        if anonymous:
            most = collections.Counter(c.source for c in anonymous).most_common(1)[0][0]
            return _first([c for c in anonymous if c.source == most])
    return _fairest(connections, settled, newcomer, network_of) or _first(
        [c for c in settled if c.source == newcomer and c.waiting and c.answered and c.quiet()]
    )


def _fairest(
    connections: Collection[Held], settled: list[Held], newcomer: str, network_of: Callable[[str], str]
) -> Held | None:
    """One of the network, else the address, holding the most places, where it holds more
    than the newcomer's would with the newcomer's place."""
    by_address = collections.Counter(c.source for c in connections)
    by_network: collections.Counter[str] = collections.Counter()
    for address, held in by_address.items():
        by_network[network_of(address)] += held
    mine = network_of(newcomer)
    network, most = max(by_network.items(), key=lambda item: item[1], default=("", 0))
    if network != mine and most > by_network[mine] + 1:
        return _first([c for c in settled if network_of(c.source) == network])
    address, most = max(by_address.items(), key=lambda item: item[1], default=("", 0))
    if address != newcomer and most > by_address[newcomer] + 1:
        return _first([c for c in settled if c.source == address])
    return None


def _first(candidates: Iterable[Held]) -> Held | None:
    """Waiting between requests with nothing unread first, then not writing, oldest first."""
    ranked = [
        (not (c.waiting and c.answered and c.quiet()), c.writing_since is not None, c.waiting_since, c)
        for c in candidates
    ]
    return min(ranked, key=lambda entry: entry[:3])[3] if ranked else None
