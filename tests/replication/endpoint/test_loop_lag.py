"""The endpoint's loop-lag watch: what it logs, and that it notices a real stall."""
from __future__ import annotations

import asyncio
import logging
import time

from replication.endpoint.loop_lag import LoopLag, watch_loop_lag


def test_lags_under_the_threshold_say_nothing():
    lag = LoopLag(warn_ms=100, warn_every=10)
    assert [lag.observe(ms, now) for now, ms in enumerate([1, 50, 99.9])] == [None, None, None]
    assert lag.samples == 3


def test_late_wakeups_are_logged_once_per_period_with_the_worst():
    lag = LoopLag(warn_ms=100, warn_every=10)
    assert lag.observe(150, now=0.0) == "event loop ran late: 1 wake-up(s) over 100 ms, worst 150 ms"
    assert lag.observe(400, now=1.0) is None  # within the period: counted, not logged
    assert lag.observe(120, now=5.0) is None
    assert lag.observe(110, now=10.5) == "event loop ran late: 3 wake-up(s) over 100 ms, worst 400 ms"


def test_a_blocked_loop_is_logged(caplog):
    async def run():
        task = asyncio.create_task(watch_loop_lag(warn_ms=50, warn_every=10, interval=0.005))
        await asyncio.sleep(0.05)
        time.sleep(0.2)  # the loop is blocked: every connection would wait
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level(logging.WARNING, logger="replication.endpoint.loop_lag"):
        asyncio.run(run())
    assert any("event loop ran late" in r.getMessage() for r in caplog.records)


def test_garbage_collector_pauses_are_measured():
    import gc

    from replication.endpoint.loop_lag import GcPauses

    pauses = GcPauses()
    gc.callbacks.append(pauses)
    try:
        garbage = [[i] for i in range(200_000)]
        del garbage
        gc.collect(2)
    finally:
        gc.callbacks.remove(pauses)
    assert pauses.worst_ms[2] > 0
    text = pauses.take()
    assert pauses.worst_ms == [0.0, 0.0, 0.0]
    assert text == "" or "gen2" in text


def test_probe_interval_follows_the_warning_threshold():
    """Wake-ups cost CPU whatever the endpoint does: not more often than a fifth of the
    threshold needs (a stall is then seen at most a fifth shorter), within 10-100 ms."""
    from replication.endpoint.loop_lag import probe_interval

    assert probe_interval(100.0) == 0.02
    assert probe_interval(20.0) == 0.01  # the soak's threshold: as often as before
    assert probe_interval(1.0) == 0.01
    assert probe_interval(10_000.0) == 0.1
