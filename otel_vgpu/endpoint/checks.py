"""Password checks, one at a time on a thread of their own, shared fairly between clients.

A bcrypt check costs what it costs on purpose (endpoint/auth.py), so the thread that makes
them is what a flood of wrong passwords fights over. At most `limit` checks run or wait at
once, and the next to run is the waiting one (`rank`):

1. whose address has failed the fewest checks: a scraper whose password is not remembered
   yet (after a restart, or a users file's rotation) has failed none, nor has an address
   that passed before, whatever it was checked; an attacker's address fails at its first
   check, and auth.py then holds it to its network's throttle;
2. whose network (/24, /64) has had the fewest checks lately (halved every
   NETWORK_HALF_LIFE_S): a fresh address of a flooding network goes after one of a quiet
   network, where its own count of nothing ranked it first (1,012 fresh addresses of 4
   /24s outranked a scraper that had had a check before a rotation);
3. whose address first asked the longest ago, of the asks not checked yet (a claim kept
   when it is refused): fresh addresses that come after the scraper never go before it.

When the queue is full, a newcomer takes the place of the waiting check that would run
last, where its own would run sooner than that one; else it gets no place (the endpoint
answers 503 at once, holding nothing), and its claim stays for its next ask.

The bound, as an adversary sees it: nothing tells a scraper's first check from a fresh
address's of its own network, since neither has any history; but each fresh address gets
one check, then has failed one. So a scraper whose credential is not remembered gets its
check within as many checks as its network has other addresses that have failed none and
asked before it, plus the queue: in IPv4 at most 253 + 4 (a /24), once per agent start (at
bcrypt cost 10, 70 ms each, about 18 s); an IPv6 /64 has more addresses than any memory,
and there no bound holds. docs/endpoint.md says what to do about it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

# Addresses and networks whose checks are counted, and claims, at most (the least recent forgotten).
REMEMBERED = 4096
# A network's checks count half as much after this long: a network that flooded a minute ago
# is not held back for it forever.
NETWORK_HALF_LIFE_S = 60.0


def decayed(count: float, since: float, now: float) -> float:
    """`count` as it stands `now`, counted at `since` (halved every NETWORK_HALF_LIFE_S)."""
    return float(count * 0.5 ** (max(0.0, now - since) / NETWORK_HALF_LIFE_S))


def _remember(table: OrderedDict[str, T], key: str, value: T) -> None:
    """Set `key`, now the most recent; the least recent forgotten past REMEMBERED."""
    table.pop(key, None)
    table[key] = value
    while len(table) > REMEMBERED:
        table.popitem(last=False)


@dataclass(eq=False)
class _Waiting:
    peer: str
    network: str
    order: int
    check: Callable[[], object]
    done: asyncio.Future[object] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class CheckQueue:
    """Runs checks on `executor` (one thread) one at a time, fairly; on the event loop."""

    def __init__(
        self,
        executor: Executor,
        limit: int,
        network_of: Callable[[str], str],
        passed: Callable[[object], bool] = bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`passed`: whether a check's result is a pass."""
        self._executor = executor
        self._limit = limit
        self._network_of = network_of
        self._passed = passed
        self._clock = clock
        self._failed: OrderedDict[str, int] = OrderedDict()
        """Failed checks of each address since its last pass, the least recent first."""
        self._networks: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """Each network's checks lately, and when counted (`decayed`)."""
        self._claims: OrderedDict[str, int] = OrderedDict()
        """Each address's first ask that no check has answered yet (its order)."""
        self._waiting: list[_Waiting] = []
        self._running = False
        self._order = itertools.count()

    @property
    def pending(self) -> int:
        """Checks running or waiting."""
        return len(self._waiting) + int(self._running)

    async def run(self, check: Callable[[], T], peer: str) -> T | None:
        """`check()` once its turn comes; None where it got no place (or lost it to a client
        with fewer checks behind it)."""
        order = next(self._order)
        if peer not in self._claims:
            _remember(self._claims, peer, order)
        mine = _Waiting(peer, self._network_of(peer), order, check)
        if self.pending >= self._limit:
            now = self._clock()  # one instant for every rank compared: a network's count decays
            last = max(self._waiting, key=lambda waiting: self._rank(waiting, now), default=None)
            if last is None or self._rank(last, now) <= self._rank(mine, now):
                return None
            self._waiting.remove(last)
            last.done.set_result(None)
        self._waiting.append(mine)
        self._next()
        try:
            result = await mine.done
        except asyncio.CancelledError:
            # The client left while waiting: its check is not made for nobody.
            if mine in self._waiting:
                self._waiting.remove(mine)
            raise
        return result  # type: ignore[return-value]

    def _rank(self, waiting: _Waiting, now: float) -> tuple[int, float, int]:
        """Sooner for fewer failed checks of its address, then fewer checks of its network
        lately, then for its address's claim being older (module docstring)."""
        count, since = self._networks.get(waiting.network, (0.0, 0.0))
        claim = self._claims.get(waiting.peer, waiting.order)
        return (self._failed.get(waiting.peer, 0), decayed(count, since, now), claim)

    def _next(self) -> None:
        if self._running or not self._waiting:
            return
        now = self._clock()
        turn = min(self._waiting, key=lambda waiting: self._rank(waiting, now))
        self._waiting.remove(turn)
        self._running = True
        count, since = self._networks.get(turn.network, (0.0, now))
        _remember(self._networks, turn.network, (decayed(count, since, now) + 1, now))
        self._claims.pop(turn.peer, None)  # answered: its next ask is a new claim
        ran = asyncio.get_running_loop().run_in_executor(self._executor, turn.check)

        def finished(future: asyncio.Future[object]) -> None:
            self._running = False
            if not turn.done.done():
                if future.cancelled():
                    turn.done.cancel()
                elif future.exception() is not None:
                    turn.done.set_exception(future.exception())  # type: ignore[arg-type]
                else:
                    turn.done.set_result(future.result())
            if not future.cancelled() and future.exception() is None:
                if self._passed(future.result()):
                    self._failed.pop(turn.peer, None)
                else:
                    _remember(self._failed, turn.peer, self._failed.get(turn.peer, 0) + 1)
            self._next()

        ran.add_done_callback(finished)
