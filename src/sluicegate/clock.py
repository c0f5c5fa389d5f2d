"""Time sources.

The scheduling core never reads the wall clock itself: it is handed a :class:`Clock`.
The live gateway uses :class:`MonotonicClock`; the discrete-event simulation uses
:class:`ManualClock`, which only moves when the simulation advances it. All times are
seconds as ``float``.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of the current time in seconds (monotonic, arbitrary origin)."""

    def now(self) -> float: ...


class MonotonicClock:
    """The process's monotonic clock (``time.monotonic``), in seconds."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to; used by simulations and tests."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def set(self, t: float) -> None:
        """Move to time ``t`` (seconds); time never goes backwards."""
        if t < self._now:
            raise ValueError(f"clock cannot go backwards: {t} < {self._now}")
        self._now = t

    def advance(self, dt: float) -> None:
        """Move forward by ``dt`` seconds."""
        self.set(self._now + dt)
