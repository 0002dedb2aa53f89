"""Max-min fair shares of one bounded thing (places under the connection cap, the admission
queue, TLS handshakes in flight) among clients, by network (/24, /64) and then address.

Pure functions over who holds what: each holding is the address of its holder, once per
unit held. A network's addresses share its part, so one client cannot take more by
spreading over the addresses of its /24, and an address cannot take more by opening more
connections. The I/O around them (which connection, which waiter) is endpoint/places.py's and
endpoint/handshakes.py's.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Holder:
    """A network, or one address of it (`address` None: the whole network)."""

    network: str
    address: str | None = None

    def holds(self, source: str, network_of: Callable[[str], str]) -> bool:
        return source == self.address if self.address is not None else network_of(source) == self.network


@dataclass(frozen=True, slots=True)
class Tally:
    """How much each network and each address holds."""

    by_network: collections.Counter[str]
    by_address: collections.Counter[str]

    @classmethod
    def of(cls, held: Iterable[str], network_of: Callable[[str], str]) -> Tally:
        by_address = collections.Counter(held)
        by_network: collections.Counter[str] = collections.Counter()
        for address, count in by_address.items():
            by_network[network_of(address)] += count
        return cls(by_network, by_address)

    def rank(self, source: str, network_of: Callable[[str], str]) -> tuple[int, int]:
        """Sooner for less held by the source's network, then by the source itself."""
        return self.by_network[network_of(source)], self.by_address[source]


def over_share(held: Iterable[str], newcomer: str, network_of: Callable[[str], str]) -> Holder | None:
    """Who gives way to `newcomer`: the network holding the most, where it holds more than
    the newcomer's would with the newcomer's one more; else, the address holding the most,
    where it holds more than the newcomer's would. None: nobody holds more than the
    newcomer would, and the newcomer waits (max-min: served while anyone holds more)."""
    tally = Tally.of(held, network_of)
    mine = network_of(newcomer)
    network, most = max(tally.by_network.items(), key=lambda item: item[1], default=("", 0))
    if network != mine and most > tally.by_network[mine] + 1:
        return Holder(network)
    address, most = max(tally.by_address.items(), key=lambda item: item[1], default=("", 0))
    if address != newcomer and most > tally.by_address[newcomer] + 1:
        return Holder(network_of(address), address)
    return None
