"""How late the endpoint's event loop runs: every connection waits while it is busy.

A task sleeps ``interval`` seconds and measures how much later than asked it woke up: the
time the loop spent on other work (or the process waited for a CPU). A wake-up later than
``warn_ms`` is logged, at most once per ``warn_every`` seconds with the worst since the last
line, so that an operator sees a stalled endpoint in its log, and the soak can tell the
endpoint's own stalls from the time its probes spend elsewhere.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


class LoopLag:
    """The pure part: lags fed in, what to log decided (no clock of its own)."""

    def __init__(self, warn_ms: float, warn_every: float) -> None:
        self.warn_ms, self.warn_every = warn_ms, warn_every
        self.worst_ms = 0.0  # since the last warning
        self.late = 0  # wake-ups later than warn_ms since the last warning
        self.samples = 0
        self._last_warning: float | None = None

    def observe(self, lag_ms: float, now: float) -> str | None:
        """Record one wake-up ``lag_ms`` late; the warning to log now, if any."""
        self.samples += 1
        if lag_ms < self.warn_ms:
            return None
        self.late += 1
        self.worst_ms = max(self.worst_ms, lag_ms)
        if self._last_warning is not None and now - self._last_warning < self.warn_every:
            return None
        text = (f"event loop ran late: {self.late} wake-up(s) over {self.warn_ms:.0f} ms, "
                f"worst {self.worst_ms:.0f} ms")
        self._last_warning, self.worst_ms, self.late = now, 0.0, 0
        return text


class GcPauses:
    """Python's garbage collector stops the whole process while it runs: the longest pause of
    each generation since the last look, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.worst_ms = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            ms = (time.perf_counter() - self._started) * 1000
            gen = info.get("generation", 2)
            self.worst_ms[gen] = max(self.worst_ms[gen], ms)

    def take(self) -> str:
        text = ", ".join(f"gen{g} {ms:.0f} ms" for g, ms in enumerate(self.worst_ms) if ms >= 1)
        self.worst_ms = [0.0, 0.0, 0.0]
        return text


def probe_interval(warn_ms: float) -> float:
    """How often to wake up to measure: a fifth of ``warn_ms`` (a stall is seen at most that
    much shorter than it was), between 10 and 100 ms. Each wake-up costs the loop tens of
    microseconds: every 10 ms, that was most of what an idle endpoint spends (1.5 % of a
    core; docs/benchmarks.md, bench_cluster)."""
    return min(0.1, max(0.01, warn_ms / 5000))


async def watch_loop_lag(warn_ms: float = 100.0, warn_every: float = 10.0, interval: float | None = None) -> None:
    """Run until cancelled, logging late wake-ups of the running loop (and the longest
    garbage-collector pauses meanwhile, a cause that is no callback's). ``interval``:
    :func:`probe_interval` of ``warn_ms`` unless given."""
    if interval is None:
        interval = probe_interval(warn_ms)
    lag = LoopLag(warn_ms, warn_every)
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    try:
        while True:
            asked = time.monotonic()
            await asyncio.sleep(interval)
            woke = time.monotonic()
            warning = lag.observe((woke - asked - interval) * 1000, woke)
            if warning:
                collected = pauses.take()
                logger.warning("%s%s", warning, f"; longest GC pauses meanwhile: {collected}" if collected else "")
    finally:
        gc.callbacks.remove(pauses)
