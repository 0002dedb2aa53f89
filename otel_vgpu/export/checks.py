"""Password checks, one at a time on a thread of their own, shared fairly between clients.

A bcrypt check costs what it costs on purpose (export/auth.py), so the thread that makes
them is what a flood of wrong passwords fights over. At most `limit` checks run or wait at
once, and the next to run is always the waiting one whose address has had the fewest
checks, then whose network (/24, /64) has: a scraper whose password is not remembered yet
(after a restart, or a users file's rotation) has had none, so its check runs next, however
many addresses of other networks keep the queue full. When the queue is full, a newcomer
takes the place of the waiting check that would run last, where its own would run sooner
than that one; else it gets no place (the endpoint answers 503 at once, holding nothing).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

# Addresses and networks whose checks are counted, at most (the least recent forgotten).
REMEMBERED = 4096


@dataclass(eq=False)
class _Waiting:
    peer: str
    network: str
    order: int
    check: Callable[[], object]
    done: asyncio.Future[object] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class CheckQueue:
    """Runs checks on `executor` (one thread) one at a time, fairly; on the event loop."""

    def __init__(self, executor: Executor, limit: int, network_of: Callable[[str], str]) -> None:
        self._executor = executor
        self._limit = limit
        self._network_of = network_of
        self._checks: OrderedDict[str, int] = OrderedDict()
        """Checks made for each address and each network, the least recent first."""
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
        mine = _Waiting(peer, self._network_of(peer), next(self._order), check)
        if self.pending >= self._limit:
            last = max(self._waiting, key=self._rank, default=None)
            if last is None or self._rank(last) <= self._rank(mine):
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

    def _rank(self, waiting: _Waiting) -> tuple[int, int, int]:
        """Sooner for fewer checks of its address, then of its network, then for waiting longer."""
        return (self._checks.get(waiting.peer, 0), self._checks.get(waiting.network, 0), waiting.order)

    def _next(self) -> None:
        if self._running or not self._waiting:
            return
        turn = min(self._waiting, key=self._rank)
        self._waiting.remove(turn)
        self._running = True
        for who in {turn.peer, turn.network}:
            self._checks[who] = self._checks.pop(who, 0) + 1
        while len(self._checks) > REMEMBERED:
            self._checks.popitem(last=False)
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
            self._next()

        ran.add_done_callback(finished)
