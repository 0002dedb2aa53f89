"""A clock a test moves by hand, for the simulated node and a sampler: monotonic seconds and
the samples' wall clock in microseconds, one time."""

from __future__ import annotations


class Clock:
    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def monotonic(self) -> float:
        return self.t

    def wall_us(self) -> int:
        return int(self.t * 1_000_000)
