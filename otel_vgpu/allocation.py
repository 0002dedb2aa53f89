"""vGPU shares: how many of a GPU's vGPUs each pod was given."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

# (pod UID, GPU UUID) -> shares on that GPU.
Shares = Mapping[tuple[str, str], int]


class AllocationSource(Protocol):
    def shares(self) -> Shares:
        """Known allocations. A pod missing here counts one share on each GPU
        it runs processes on."""
        ...


class StaticAllocation:
    """A fixed allocation (the simulated node's)."""

    def __init__(self, shares: Shares) -> None:
        self._shares = dict(shares)

    def shares(self) -> Shares:
        return self._shares


class UnknownAllocation:
    """No allocation source: every pod counts one share where it runs."""

    def shares(self) -> Shares:
        return {}
