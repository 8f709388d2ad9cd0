"""The live feed behind every dashboard and admin page: one per web process (per event loop).

It listens on the group the replication streamers publish on (``replication.lines``): every
line batch a writer publishes wakes it at once (with Redis, from any process of the
cluster). It then reads where the streams stand from the database — positions, pending IDs
and their age, the endpoints' connections — because that is the one view every process
shares: on the embedded default, writers in other processes (``write_facts``, the demo) and
the replication endpoint share no channel layer with the web process. The same read also
runs every ``FEED_REFRESH_SECONDS`` (default 1 s), which samples facts per second for the
chart, ages pending IDs into "stuck" and shows writers no message reached.

Each refresh goes to the page's WebSocket consumers as one message on this process's group
:data:`LIVE_GROUP` (layer :data:`LOCAL_LAYER`). The browser never polls: it holds one socket.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import logging
import time
import weakref
from datetime import datetime, timezone
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from dashboard.attached_sources import SOURCES
from dashboard.endpoint_status import endpoint_statuses
from dashboard.facts_history import minute_of, record_minute
from dashboard.health import banner_view, readiness
from dashboard.job_panel import recent_job_runs
from dashboard.stream_table import streams_as_served
from replication.publish.streamer import LINES_GROUP
from streams.conf import instance_name, repl_setting
from streams.stream_status import BACKWARDS_NOTE

logger = logging.getLogger(__name__)

LOCAL_LAYER = "dashboard_local"
LIVE_GROUP = "dashboard.live"
#: How much facts/s history the chart shows.
HISTORY_SECONDS = 300
#: A feed with no page open for this long stops (and stops hearing every line batch).
IDLE_STOP_SECONDS = 600.0
#: Facts/s are averaged over this trailing window.
RATE_WINDOW_SECONDS = 5.0
#: A burst of line batches is coalesced into at most one refresh per this many seconds.
MIN_PUSH_INTERVAL = 0.2


def collect_state(now: float | None = None) -> dict[str, Any]:
    """Where everything stands, as the database records it (sync: call off the event loop).

    The feed calls it from a thread of its own that keeps its connection (connecting costs
    more than the reads: docs/benchmarks.md); a failed read drops the connection."""
    from django.db import connection

    try:
        return _collect_state(now)
    except Exception:
        connection.close()
        raise


def writer_json(w: Any) -> dict[str, Any]:
    """A writer's last write and liveness, for the page and ``status.json``."""
    return {"position": w.position, "last_write": w.last_write.timestamp() if w.last_write else None,
            "pid": w.pid, "host": w.host, "alive": w.alive,
            # its process exited cleanly with nothing pending (finished), or is gone without that
            "finished": w.finished, "gone": w.gone}


def _attached_state() -> dict[str, Any]:
    """The attached sources' sections of the page (an attached Synapse's), rendered as the page
    renders them (the page replaces them whole), and their facts/s for the chart."""
    from django.template.loader import render_to_string

    html, rates = [], {}
    for source in SOURCES.values():
        sections = source.page_sections()
        html.append(render_to_string(source.template, {"sections": sections}))
        rates.update(source.chart_rates(sections))
    return {"attached_html": "".join(html), "attached_rates": rates}


def _close_connection() -> None:
    """Close this thread's connection (``connection`` resolves per thread: look it up here)."""
    from django.db import connection

    connection.close()


def _collect_state(now: float | None) -> dict[str, Any]:
    from datetime import datetime, timezone

    now = time.time() if now is None else now
    when = datetime.fromtimestamp(now, timezone.utc)
    streams = []
    for s in streams_as_served(now=when):
        linear = s.linear
        streams.append({
            "name": s.name,
            "db_backed": s.db_backed,
            "backwards": s.backwards,
            "writers": s.writers,
            "positions": s.positions,
            "linear": linear,
            # the writer whose pending ID holds the linear position back (null: none does)
            "laggard": s.laggard,
            # How far each writer is ahead of the linear position (IDs not yet readable by all).
            "ahead": {w.name: w.ahead for w in s.writer_rows if w.ahead is not None and w.name in s.positions},
            "total": max((abs(p) for p in s.positions.values()), default=0),
            "writer_status": {w.name: writer_json(w) for w in s.writer_rows},
            "pending": [
                {"writer": p.instance_name, "stream_ids": p.stream_ids, "age_seconds": round(p.age_seconds, 1),
                 "stuck": p.stuck, "pid": p.pid}
                for p in s.pending
            ],
            "stuck": bool(s.stuck),
            "writers_warning": s.writers_warning,
        })
    attached = _attached_state()
    return {
        "t": now,
        **attached,
        "server_name": repl_setting("SERVER_NAME"),
        "backwards_note": BACKWARDS_NOTE,
        "instance_name": instance_name(),
        "stuck_after": repl_setting("STUCK_AFTER_SECONDS"),
        "streams": streams,
        "endpoints": endpoint_statuses(now=when),
        "jobs": recent_job_runs(),
    }


class LiveFeed:
    def __init__(self, refresh: float | None = None) -> None:
        self.refresh = settings.DASHBOARD["FEED_REFRESH_SECONDS"] if refresh is None else refresh
        self.idle_stop = IDLE_STOP_SECONDS
        self.history: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=max(1, int(HISTORY_SECONDS / self.refresh)))
        self.state: dict[str, Any] | None = None
        #: the latest readiness (dashboard.health.banner_view): the page's Live banner
        self.health: dict[str, Any] | None = None
        self.batches_heard = 0
        self.refreshes = 0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._window: collections.deque[tuple[float, dict[str, int]]] = collections.deque()
        self._started = asyncio.Event()
        #: the one thread (and so the one connection) the feed reads the database with
        self._db = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dashboard-feed-db")
        self.clients = 0
        self.stopping = False
        self._idle_since: float | None = None
        self._recorded_minute: datetime | None = None

    # -- life -------------------------------------------------------------------------------

    async def start(self) -> None:
        listening = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._listen(listening), name="dashboard-feed-listen"),
            asyncio.create_task(self._run(), name="dashboard-feed"),
        ]
        await listening.wait()
        await self._started.wait()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._close_db()

    async def _close_db(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._db, _close_connection)
        finally:
            self._db.shutdown(wait=False)

    async def ready(self) -> None:
        await self._started.wait()

    def join(self) -> None:
        self.clients += 1
        self._idle_since = None

    def leave(self) -> None:
        self.clients -= 1
        if self.clients <= 0:
            self._idle_since = asyncio.get_running_loop().time()

    def _idle_too_long(self, now: float) -> bool:
        return self.clients <= 0 and self._idle_since is not None and now - self._idle_since >= self.idle_stop

    # -- input: the replication group -------------------------------------------------------

    async def _listen(self, listening: asyncio.Event) -> None:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(LINES_GROUP, channel)
        listening.set()
        try:
            while True:
                try:
                    await layer.receive(channel)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # Redis away: the periodic refresh still shows everything, a little later.
                    logger.warning("dashboard feed: replication.lines unavailable", exc_info=True)
                    await asyncio.sleep(1.0)
                    continue
                self.batches_heard += 1
                self._wake.set()
        finally:
            try:
                await layer.group_discard(LINES_GROUP, channel)
            except Exception:
                pass

    # -- output: refreshes ------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            now = loop.time()
            if now < next_tick and not self._wake.is_set():
                try:
                    await asyncio.wait_for(self._wake.wait(), next_tick - now)
                except asyncio.TimeoutError:
                    pass
            self._wake.clear()
            tick = loop.time() >= next_tick
            if tick:
                next_tick = max(next_tick + self.refresh, loop.time() + self.refresh / 2)
            try:
                await self.refresh_once(tick)
            except Exception:
                logger.exception("dashboard feed: refresh failed")
            if tick or self.health is None:
                # Even when the refresh failed (the database is down): the banner says why.
                try:
                    await self.check_health()
                except Exception:
                    logger.exception("dashboard feed: health check failed")
            if self._idle_too_long(loop.time()):
                # Nobody watches: stop listening. The next page starts a new feed.
                self.stopping = True
                if _feeds.get(loop) is self:
                    del _feeds[loop]
                for task in self._tasks:
                    if task is not asyncio.current_task():
                        task.cancel()
                await self._close_db()
                return
            if not tick:
                await asyncio.sleep(MIN_PUSH_INTERVAL)

    async def refresh_once(self, sample: bool) -> None:
        state = await asyncio.get_running_loop().run_in_executor(self._db, collect_state)
        minute = minute_of(datetime.fromtimestamp(state["t"], timezone.utc))
        if sample and minute != self._recorded_minute:
            # Also recorded by the endpoint; the first process each minute wins.
            totals = {s["name"]: s["total"] for s in state["streams"] if s["db_backed"]}
            try:
                self._recorded_minute = await asyncio.get_running_loop().run_in_executor(
                    self._db, functools.partial(record_minute, totals=totals))
            except Exception:
                logger.exception("dashboard feed: could not record the facts per minute")
        if sample:
            point = self._sample(state)
            if point is not None:
                self.history.append(point)
                state["sample"] = point
        self.state = state
        self.refreshes += 1
        self._started.set()
        await get_channel_layer(LOCAL_LAYER).group_send(LIVE_GROUP, {"type": "dashboard.update", "payload": state})

    async def check_health(self) -> None:
        """Run the readiness checks (on the feed's database thread) and push the result to
        the pages, so their banner turns red with the reason when a part is down."""

        results = await asyncio.get_running_loop().run_in_executor(self._db, readiness)
        self.health = banner_view(results)
        self._started.set()
        await get_channel_layer(LOCAL_LAYER).group_send(
            LIVE_GROUP, {"type": "dashboard.health", "payload": self.health})

    def _sample(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """Facts per second per stream over the last :data:`RATE_WINDOW_SECONDS` (a trickle
        of single facts would otherwise draw a comb). A stream's IDs come from one sequence
        whatever the writer, so the highest completed ID counts its facts."""
        totals = {s["name"]: s["total"] for s in state["streams"] if s["db_backed"]}
        t = state["t"]
        window = self._window
        while len(window) > 1 and t - window[1][0] >= RATE_WINDOW_SECONDS:
            window.popleft()
        window.append((t, totals))
        t0, base = window[0]
        if t <= t0:
            return None
        return {"t": t, "rates": {**{name: round(max(0, total - base.get(name, total)) / (t - t0), 2)
                                     for name, total in totals.items()},
                                  # an attached Synapse's: its observer's rate over its last minute
                                  **state.get("attached_rates", {})}}

    def snapshot(self) -> dict[str, Any]:
        """What a newly connected page gets: the latest state and the chart's history."""
        return {**(self.state or {}), "history": list(self.history), "health": self.health}


_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LiveFeed] = weakref.WeakKeyDictionary()


async def live_feed() -> LiveFeed:
    """This event loop's feed, started on first use and kept running while pages are open
    (and :data:`IDLE_STOP_SECONDS` after, so a page reopened soon finds the chart's history)."""
    loop = asyncio.get_running_loop()
    feed = _feeds.get(loop)
    if feed is not None and not feed.stopping:
        await feed.ready()
        return feed
    feed = _feeds[loop] = LiveFeed()
    await feed.start()
    return feed


async def stop_live_feed() -> None:
    """Stop this loop's feed now (tests)."""
    feed = _feeds.pop(asyncio.get_running_loop(), None)
    if feed is not None:
        await feed.stop()
