"""One run at a time, its result shared: the decision core of the readiness probe
(:class:`dashboard.health.ReadinessProbe`), which a flood of anonymous probes must not
turn into a flood of checks.

A caller asks :meth:`SingleFlight.next_step` with the time now and gets one of three answers:
:class:`Reuse` the last result (it finished less than ``fresh_for`` seconds ago), :class:`Join`
the run already in flight, or :class:`Start` the run (this caller alone is told so, until it
reports :meth:`~SingleFlight.finished`). No I/O, no clock of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Reuse(Generic[T]):
    """The last run's result is fresh: answer with it."""

    result: T


@dataclass(frozen=True)
class Join:
    """A run is in flight: wait for its result."""


@dataclass(frozen=True)
class Start:
    """Nothing fresh and nothing in flight: run now (and report :meth:`SingleFlight.finished`)."""


class SingleFlight(Generic[T]):
    """At most one run in flight; a finished run's result answers every caller for
    ``fresh_for`` seconds after it finished (times in seconds, from one monotonic clock)."""

    def __init__(self, fresh_for: float) -> None:
        if fresh_for < 0:
            raise ValueError(f"fresh_for must be >= 0, not {fresh_for}")
        self.fresh_for = fresh_for
        self.running = False
        self._last: tuple[T, float] | None = None  #: the last result, and when it finished

    def next_step(self, now: float) -> Reuse[T] | Join | Start:
        if self._last is not None and 0 <= now - self._last[1] < self.fresh_for:
            return Reuse(self._last[0])
        if self.running:
            return Join()
        self.running = True
        return Start()

    def finished(self, result: T, now: float) -> None:
        """The run in flight ended with ``result`` at ``now``."""
        self.running = False
        self._last = (result, now)
