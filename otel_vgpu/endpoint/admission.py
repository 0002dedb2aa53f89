"""Which connection goes when the cap is full and a new one asks for a place: the rule, over
what the server knows of each connection (endpoint/server.py keeps the connections).

In order, the first that finds one:

1. one waiting for a request head with nothing unread for `quiet_after_s` (a client sends
   its request, or its ClientHello, at once), or for `shed_after_s` where it is its
   address's only connection and new (a loaded client may take a few hundred milliseconds
   from its connect to its send, and a scraper's new connection was shed so at 0.25 s); or
   whose head the loop has read part of and has waited `shed_after_s` (a trickler); oldest
   first. One whose bytes all wait unread is no trickler, whatever its age: the loop is only
   busy (a scraper's request unread behind 256 keep-alive connections was shed so);
2. one whose peer has taken nothing of its response for `stall_s`;
3. with credentials required (client certificates, basic auth), one that has never
   presented a valid one and is not presenting one (a password waiting for its check), of
   another address than the newcomer's, holding the most such places and more than the
   newcomer holds, oldest first (of any age where it holds more than the newcomer would):
   a client that has shown it may scrape never waits behind those that have not;
4. one of the network (/24, /64) holding the most places, where it holds more than the
   newcomer's network would (its places plus the newcomer's), else of the address holding
   the most, where it holds more than the newcomer's address would (endpoint/fair_shares.py): the
   cap is shared max-min fairly, so a newcomer is served while anyone holds more than it.
   Every connection of that holder may go, however young, and one in its TLS handshake
   too: a client that opens a fresh connection per request holds only young ones, and
   sparing them left it the whole cap. A client holding one place is never over anyone's
   share, so a scraper's connection that has not sent its request yet stays;
5. the newcomer's own address's oldest connection waiting between requests (behind one
   proxy every client is one address: its new connection takes its oldest idle one's place).

In 3 to 5, a connection waiting between requests with nothing unread goes before one
mid-request; in 3 and 5 none in its TLS handshake or younger than `quiet_after_s` (a
scraper's connection that has not sent its request yet) goes at all.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Iterable
from typing import Protocol

from otel_vgpu.endpoint.fair_shares import over_share
from otel_vgpu.limits import Limits


class Held(Protocol):
    """What the rule reads of a connection that holds a place."""

    source: str
    waiting: bool
    waiting_since: float
    opened: float
    answered: int
    handshaking: bool
    partial: bool
    presenting: bool
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
    shown: bool = False,
) -> Held | None:
    """The connection to shed for a newcomer from address `newcomer` (module docstring), or
    None: the newcomer waits, then gets its 503. `shown`: the newcomer's address has shown
    a valid credential lately."""
    places = collections.Counter(c.source for c in connections)
    old = [
        c
        for c in connections
        if c.waiting
        and (
            (now - c.waiting_since >= _quiet_for(c, places[c.source], limits) and c.quiet())
            or (now - c.waiting_since >= limits.shed_after_s and c.partial)
        )
    ]
    if old:
        return min(old, key=lambda c: c.waiting_since)
    stalled = [c for c in connections if c.stalled(now, limits.stall_s)]
    if stalled:
        return min(stalled, key=lambda c: c.writing_since or now)
    settled = [c for c in connections if not c.handshaking and now - c.opened >= limits.quiet_after_s]
    if credentials:
        found = _anonymous(connections, settled, newcomer, shown)
        if found is not None:
            return found
    return _fairest(connections, newcomer, network_of) or _first(
        [c for c in settled if c.source == newcomer and c.waiting and c.answered and c.quiet()]
    )


def _quiet_for(c: Held, places: int, limits: Limits) -> float:
    """How long a connection waiting for a request head with nothing unread is kept: an
    address's only connection, new, `shed_after_s` (it may be a loaded scraper's, between
    its connect and its send); any other `quiet_after_s`."""
    return limits.shed_after_s if places == 1 and not c.answered else limits.quiet_after_s


def _anonymous(connections: Collection[Held], settled: list[Held], newcomer: str, shown: bool) -> Held | None:
    """One that never presented a valid credential, of the address holding the most such
    places, where it holds more than the newcomer does: settled ones, or any where it holds
    more than the newcomer would with the newcomer's place (a flood of fresh connections
    holds only young ones). Never one of the newcomer's own address: a flood's newcomers
    took each other's places, and no handshake of it ever finished. For a newcomer of an
    address that has shown a valid credential, as if it held none."""
    anonymous = collections.Counter(c.source for c in connections if _anonymous_now(c) and c.source != newcomer)
    most = max(anonymous.values(), default=0)
    mine = 0 if shown else sum(1 for c in connections if c.source == newcomer)
    if most <= mine:
        return None
    pool = settled if most <= mine + 1 else connections
    return _first([c for c in pool if _anonymous_now(c) and anonymous[c.source] == most])


def _anonymous_now(c: Held) -> bool:
    """Never presented a valid credential, and not presenting one now: a request whose
    password waits for its check (a scraper's, after a restart) is not shed as anonymous
    for a flood's newcomers; such requests are few (endpoint/checks.py holds 4)."""
    return not c.credentialed and not c.presenting


def _fairest(connections: Collection[Held], newcomer: str, network_of: Callable[[str], str]) -> Held | None:
    """One of the holder over its share for the newcomer (endpoint/fair_shares.py), of any age."""
    holder = over_share((c.source for c in connections), newcomer, network_of)
    if holder is None:
        return None
    return _first([c for c in connections if holder.holds(c.source, network_of)])


def _first(candidates: Iterable[Held]) -> Held | None:
    """Waiting between requests with nothing unread first, then not writing, oldest first."""
    ranked = [
        (not (c.waiting and c.answered and c.quiet()), c.writing_since is not None, c.waiting_since, c)
        for c in candidates
    ]
    return min(ranked, key=lambda entry: entry[:3])[3] if ranked else None
