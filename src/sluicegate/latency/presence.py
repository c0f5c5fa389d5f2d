"""Which hardware classes a pool has *now*: the classes seen among recent candidates.

Some behaviour applies only on a pool that mixes hardware classes (the TTFT calibration
per prediction size and at the first token, :mod:`sluicegate.latency.calibration`; the
latency scorer's ``load`` strategy). "Two classes were ever seen" would keep a pool whose
A100s were all drained mixed for the rest of the process, and would keep a departed
class's calibration slot forever. A class counts as present while it appeared among a
decision's candidates in the last ``window_s`` seconds (:data:`PRESENCE_WINDOW_S`): a
class still in the pool appears in nearly every decision, and a filter narrowing one
decision to one class (an affinity filter) does not make the pool look homogeneous.

State is bounded: at most ``max_classes`` classes are remembered; a new class beyond
that takes the place of one not seen within the window, else it is not recorded (a
hostile or misconfigured fleet naming thousands of classes cannot grow it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

PRESENCE_WINDOW_S = 60.0
"""Seconds a class counts as present after it last appeared among the candidates."""

MAX_PRESENT_CLASSES = 16
"""Default bound on the classes remembered (as the predictor's ``max_classes``)."""


@dataclass(slots=True)
class ClassPresence:
    """The last time (clock s) each hardware class appeared among a decision's candidates."""

    window_s: float = PRESENCE_WINDOW_S
    max_classes: int = MAX_PRESENT_CLASSES
    last_seen: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.window_s > 0.0:
            raise ValueError(f"window_s must be > 0 s, got {self.window_s!r}")
        if self.max_classes < 1:
            raise ValueError(f"max_classes must be >= 1, got {self.max_classes!r}")

    def see(self, classes: Iterable[str | None], now: float) -> None:
        """Record the candidates' classes (None: unnamed, not counted) at ``now`` (s)."""
        last = self.last_seen
        for cls in classes:
            if cls is None:
                continue
            if cls in last or len(last) < self.max_classes or self._make_room(now):
                last[cls] = now

    def present(self, cls: str, now: float) -> bool:
        """Whether ``cls`` appeared within the window before ``now``."""
        seen = self.last_seen.get(cls)
        return seen is not None and now - seen <= self.window_s

    def mixed(self, now: float) -> bool:
        """Whether two or more classes are present at ``now``."""
        window = self.window_s
        return sum(now - t <= window for t in self.last_seen.values()) >= 2

    def _make_room(self, now: float) -> bool:
        """Forget one class not seen within the window; False if every class is present."""
        last = self.last_seen
        oldest = min(last, key=last.__getitem__)
        if now - last[oldest] <= self.window_s:
            return False
        del last[oldest]
        return True


__all__ = ["MAX_PRESENT_CLASSES", "PRESENCE_WINDOW_S", "ClassPresence"]
