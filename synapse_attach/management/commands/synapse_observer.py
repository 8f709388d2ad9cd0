"""``manage.py synapse_observer``: watches the attached Synapse until stopped (SIGTERM, SIGINT)
and publishes what it finds every few seconds for the dashboard (docs/attach.md, "On the
dashboard"). With ``SYNAPSE_REDIS_URL`` it listens to Synapse's Redis (and reads its database
too when ``SYNAPSE_DATABASE_URL`` is set); with ``SYNAPSE_DATABASE_URL`` alone it reads the
database only, and what only Redis can tell is published as unknown. Read-only: it never
writes to Synapse's database and never publishes on its Redis."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import socket
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from common.url_redaction import redact_url
from synapse_attach.live_status import DATABASE_INTERVAL, PUBLISH_INTERVAL, publish
from synapse_attach.observer import SynapseObserver
from synapse_attach.reader import AttachError, AttachSettings, take_snapshot
from synapse_attach.redis_observer import RedisObserver, redis_settings
from synapse_attach.status import report
from synapse_attach.unreported import UnreportedTracker, observe_report

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = ("Watch the Synapse at SYNAPSE_REDIS_URL (channel SYNAPSE_SERVER_NAME) and/or SYNAPSE_DATABASE_URL "
            "until stopped and publish its streams, positions, processes, stuck writers and unreported IDs "
            "for the dashboard, /status.json and /metrics.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--name", default="", help="the observer's name on the dashboard "
                                                       "(default: SYNAPSE_SERVER_NAME@host, or the database's "
                                                       "name@host without it)")

    def handle(self, *args: Any, **options: Any) -> None:
        values = settings.SYNAPSE_ATTACH
        try:
            url, server_name = observed_redis(values)
            database = DatabaseView(values) if values.get("DATABASE_URL") else None
        except (ValueError, AttachError) as e:
            raise CommandError(str(e)) from None
        label = server_name or database_label(values["DATABASE_URL"])
        name = options["name"] or f"{label}@{socket.gethostname()}"
        if url:
            logger.info("observing %s, channel %s, as %s", redact_url(url), server_name, name)
        else:
            logger.info("reading %s every %g s (no SYNAPSE_REDIS_URL: nothing live), as %s",
                        redact_url(values["DATABASE_URL"]), database_interval(values), name)
        asyncio.run(observe(url, server_name, name, float(values.get("STUCK_AFTER_SECONDS", 10.0)), database,
                            label=label))


def observed_redis(values: dict[str, Any]) -> tuple[str, str]:
    """Synapse's Redis URL and channel when ``SYNAPSE_REDIS_URL`` is set (checked), ``("", "")``
    when only ``SYNAPSE_DATABASE_URL`` is; a ValueError when there is nothing to observe."""
    if values.get("REDIS_URL"):
        return redis_settings(values, "synapse_observer")
    if not values.get("DATABASE_URL"):
        raise ValueError("synapse_observer needs SYNAPSE_DATABASE_URL or SYNAPSE_REDIS_URL (and "
                         "SYNAPSE_SERVER_NAME) to observe a Synapse (docs/attach.md)")
    return "", values.get("SERVER_NAME", "")


def database_label(url: str) -> str:
    """What names a Synapse known by its database only: ``database on host:port`` (no user,
    no password)."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    return f"{parts.path.lstrip('/') or 'postgres'} on {host}{f':{parts.port}' if parts.port else ''}"


def database_interval(values: dict[str, Any]) -> float:
    return max(1.0, float(values.get("DATABASE_INTERVAL_SECONDS", DATABASE_INTERVAL)))


class DatabaseView:
    """Synapse's database as the observer shows it: ``synapse_status``'s report, read at most
    every ``SYNAPSE_DATABASE_INTERVAL_SECONDS`` (the last one kept between reads), and the
    unreported sequence IDs followed across reads. A failed read is shown as its one line."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.settings = AttachSettings.from_settings(values)  # a bad URL: one line, before it starts
        self.interval = database_interval(values)
        self.tracker = UnreportedTracker(float(values.get("UNREPORTED_AFTER_SECONDS", 60.0)))
        self.read_at: float | None = None
        self.last: dict[str, Any] = {"url": redact_url(self.settings.database_url), "read": None}

    def view(self, live_streams: dict[str, Any], now: float) -> dict[str, Any]:
        if self.read_at is None or now - self.read_at >= self.interval:
            self.read_at = now
            try:
                document = report(take_snapshot(self.settings)).as_dict()
            except AttachError as e:
                self.last = {**self.last, "error": str(e)}
            else:
                unreported = observe_report(self.tracker, document["streams"], live_streams, now)
                self.last = {"url": self.last["url"], "read": time.time(), "error": None,
                             "interval_seconds": self.interval,
                             "server_version": document["server_version"],
                             "streams": document["streams"], "findings": document["findings"],
                             "unreported_after_seconds": self.tracker.after,
                             "unreported": [u.as_dict() for u in unreported]}
        return self.last


async def observe(url: str, server_name: str, name: str, stuck_after: float,
                  database_view: DatabaseView | None = None, *, label: str = "") -> None:
    """Until SIGTERM or SIGINT: every :data:`PUBLISH_INTERVAL` seconds, the view published.
    With ``url`` (Synapse's Redis) it is what was heard there, and the database's report when
    ``database_view`` is given; without, the database's report alone (``redis`` is None)."""
    loop = asyncio.get_running_loop()
    observer: SynapseObserver | None = None
    redis: RedisObserver | None = None
    stopped = asyncio.Event()
    stop: Callable[[], None] = stopped.set
    if url:
        observer = SynapseObserver(stuck_after=stuck_after, started=time.monotonic())
        redis = RedisObserver(url, server_name, observer)
        stop = redis.stop
        watching = asyncio.ensure_future(redis.run())
    else:
        watching = asyncio.ensure_future(stopped.wait())
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    sources = (["redis"] if redis else []) + (["database"] if database_view else [])
    failing = False
    # one thread of its own for the database: one connection, never the loop's thread
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="observer-publish") as database:
        while not watching.done():
            view: dict[str, Any] = {"sources": sources, "label": label}
            if observer is not None and redis is not None:
                view.update(observer.as_dict(time.monotonic()))
                view["redis"] = {"url": redact_url(url), "channel": server_name,
                                 "subscriptions": redis.subscriptions}
            else:
                view["redis"] = None  # what only Redis tells is unknown, not empty
            try:
                if database_view is not None:
                    view["database"] = await loop.run_in_executor(
                        database, database_view.view, view.get("streams", {}), time.monotonic())
                subscribed = redis.subscribed if redis is not None else False
                await loop.run_in_executor(database, publish_or_reconnect, name, subscribed, view)
            except Exception as e:  # the dashboard's database away: keep watching, say so once
                if not failing:
                    logger.warning("cannot publish the observer's view (retrying every %g s, quietly): %s",
                                   PUBLISH_INTERVAL, e)
                failing = True
            else:
                if failing:
                    logger.info("the observer's view is published again")
                failing = False
            await asyncio.wait([watching], timeout=PUBLISH_INTERVAL)
    await watching
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Stopping: a second signal (runservice's, after its process group's) ends the process
        # at once. Left to asyncio, the loop's close would shut the signal wakeup pipe before
        # removing its handlers, and a signal in between prints a traceback.
        loop.remove_signal_handler(sig)
        signal.signal(sig, signal.SIG_DFL)


def publish_or_reconnect(name: str, subscribed: bool, view: dict[str, Any]) -> None:
    """:func:`publish`; after a failure the connection is closed, so the next try opens a new
    one (Django reconnects only between requests, and this process serves none)."""
    from django.db import connection

    try:
        publish(name, subscribed, view)
    except Exception:
        connection.close()
        raise
