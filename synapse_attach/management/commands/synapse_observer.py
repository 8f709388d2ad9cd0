"""``manage.py synapse_observer``: listens to the attached Synapse's Redis until stopped
(SIGTERM, SIGINT) and publishes what it hears every few seconds for the dashboard
(docs/attach.md, "On the dashboard"). Read-only: it never publishes on Synapse's Redis."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import socket
import time
from typing import Any

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
    help = ("Listen to Synapse's Redis (SYNAPSE_REDIS_URL, channel SYNAPSE_SERVER_NAME) until stopped and "
            "publish the live positions, processes and stuck writers for /status.json and /metrics.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--name", default="", help="the observer's name on the dashboard "
                                                       "(default: SYNAPSE_SERVER_NAME@host)")

    def handle(self, *args: Any, **options: Any) -> None:
        values = settings.SYNAPSE_ATTACH
        try:
            url, server_name = redis_settings(values, "synapse_observer")
        except ValueError as e:
            raise CommandError(str(e)) from None
        name = options["name"] or f"{server_name}@{socket.gethostname()}"
        logger.info("observing %s, channel %s, as %s", redact_url(url), server_name, name)
        database = DatabaseView(values) if values.get("DATABASE_URL") else None
        asyncio.run(observe(url, server_name, name, float(values.get("STUCK_AFTER_SECONDS", 10.0)), database))


class DatabaseView:
    """Synapse's database as the observer shows it: ``synapse_status``'s report, read at most
    every :data:`DATABASE_INTERVAL` seconds (the last one kept between reads), and the
    unreported sequence IDs followed across reads. A failed read is shown as its one line."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.tracker = UnreportedTracker(float(values.get("UNREPORTED_AFTER_SECONDS", 60.0)))
        self.read_at: float | None = None
        self.last: dict[str, Any] = {}

    def view(self, live_streams: dict[str, Any], now: float) -> dict[str, Any]:
        if self.read_at is None or now - self.read_at >= DATABASE_INTERVAL:
            self.read_at = now
            try:
                document = report(take_snapshot(AttachSettings.from_settings(self.values))).as_dict()
            except AttachError as e:
                self.last = {**self.last, "error": str(e)}
            else:
                unreported = observe_report(self.tracker, document["streams"], live_streams, now)
                self.last = {"read": time.time(), "error": None, "server_version": document["server_version"],
                             "streams": document["streams"], "findings": document["findings"],
                             "unreported_after_seconds": self.tracker.after,
                             "unreported": [u.as_dict() for u in unreported]}
        return self.last


async def observe(url: str, server_name: str, name: str, stuck_after: float,
                  database_view: DatabaseView | None = None) -> None:
    loop = asyncio.get_running_loop()
    observer = SynapseObserver(stuck_after=stuck_after, started=time.monotonic())
    redis = RedisObserver(url, server_name, observer)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, redis.stop)
    listening = asyncio.ensure_future(redis.run())
    failing = False
    # one thread of its own for the database: one connection, never the loop's thread
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="observer-publish") as database:
        while not listening.done():
            view = observer.as_dict(time.monotonic())
            view["redis"] = {"url": redact_url(url), "channel": server_name, "subscriptions": redis.subscriptions}
            try:
                if database_view is not None:
                    view["database"] = await loop.run_in_executor(
                        database, database_view.view, view["streams"], time.monotonic())
                await loop.run_in_executor(database, publish_or_reconnect, name, redis.subscribed, view)
            except Exception as e:  # the dashboard's database away: keep listening, say so once
                if not failing:
                    logger.warning("cannot publish the observer's view (retrying every %g s, quietly): %s",
                                   PUBLISH_INTERVAL, e)
                failing = True
            else:
                if failing:
                    logger.info("the observer's view is published again")
                failing = False
            await asyncio.wait([listening], timeout=PUBLISH_INTERVAL)
    await listening


def publish_or_reconnect(name: str, subscribed: bool, view: dict[str, Any]) -> None:
    """:func:`publish`; after a failure the connection is closed, so the next try opens a new
    one (Django reconnects only between requests, and this process serves none)."""
    from django.db import connection

    try:
        publish(name, subscribed, view)
    except Exception:
        connection.close()
        raise
