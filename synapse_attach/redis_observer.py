"""Listens to a Synapse's Redis and feeds what it hears to :class:`SynapseObserver`: the I/O
adapter of the live picture (docs/attach.md, "Watching Synapse's Redis").

It subscribes as Synapse's own processes do (``synapse/replication/tcp/redis.py``): the
channel named after the server (``SYNAPSE_SERVER_NAME``) and its ``/USER_IP`` sub-channel,
with the project's Redis subscription (``RedisSubscription``: PING when silent, reconnection
with back-off after Redis restarts or drops it). It never publishes, not even the
``REPLICATE`` a Synapse worker sends on connecting, so it needs a Redis user with SUBSCRIBE
and PING only; what a writer announced before the observer connected is learned from its
next write or ``POSITION``.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from common.url_redaction import redact_url
from replication.protocol.redis_session import RedisSubscription, SubscriptionPolicy
from replication.protocol.resp import parse_messages

from .observer import SynapseObserver


def synapse_channels(server_name: str) -> list[bytes]:
    """The channels Synapse's processes publish on: the server's, and its USER_IP one."""
    return [server_name.encode(), f"{server_name}/USER_IP".encode()]


class RedisObserver:
    """One subscription to a Synapse's Redis, feeding ``observer`` (run with :meth:`run`,
    from one asyncio loop; :meth:`stop` from the same loop)."""

    def __init__(self, url: str, server_name: str, observer: SynapseObserver, *,
                 clock: Callable[[], float] = time.monotonic,
                 policy: SubscriptionPolicy = SubscriptionPolicy()) -> None:
        self.observer = observer
        self._clock = clock
        self._buf = b""
        self.last_loss: str | None = None
        self.subscription = RedisSubscription(
            url, synapse_channels(server_name), on_subscribed=self._subscribed, on_chunk=self._chunk,
            on_lost=self._lost, policy=policy, name="Synapse's Redis", clock=clock)

    @property
    def subscribed(self) -> bool:
        return self.subscription.established

    @property
    def subscriptions(self) -> int:
        """How many times it has subscribed (more than 1: it reconnected)."""
        return self.subscription.counters["subscriptions"]

    async def _subscribed(self) -> None:
        self._buf = b""  # publishes nothing: Synapse's writers are heard as they write

    def _lost(self, reason: str | None) -> None:
        self.last_loss = reason

    def _chunk(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        replies, end = parse_messages(buf)
        self._buf = buf[end:]
        # a message's payload is bytes (a list: a PONG, a confirmation)
        lines = [r.decode("utf-8", "replace") for r in replies if type(r) is bytes]
        if lines:
            self.observer.observe_lines(lines, self._clock())

    async def run(self) -> None:
        await self.subscription.run()

    def stop(self) -> None:
        self.subscription.stop()


def check_redis_url(url: str) -> None:
    """A clear error for a URL that is no Redis URL (ValueError, message without the password)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"SYNAPSE_REDIS_URL={redact_url(url)}: expected redis://user:password@host:6379 "
                         "(Synapse's Redis)")


def redis_settings(values: dict[str, Any], needed_by: str) -> tuple[str, str]:
    """Synapse's Redis URL and channel from ``SYNAPSE_ATTACH``, both set and the URL a Redis
    URL; else a ValueError naming what ``needed_by`` needs (message without the password)."""
    url, server_name = values.get("REDIS_URL", ""), values.get("SERVER_NAME", "")
    if not url or not server_name:
        raise ValueError(f"{needed_by} needs SYNAPSE_REDIS_URL and SYNAPSE_SERVER_NAME (Synapse's Redis and "
                         "its server_name, docs/attach.md)")
    check_redis_url(url)
    return url, server_name


def listen(url: str, server_name: str, seconds: float, *, stuck_after: float) -> tuple[SynapseObserver, RedisObserver]:
    """Listen for ``seconds``, then stop: what was heard, and the subscription's state."""
    import asyncio

    async def run() -> tuple[SynapseObserver, RedisObserver]:
        observer = SynapseObserver(stuck_after=stuck_after, started=time.monotonic())
        redis = RedisObserver(url, server_name, observer)
        task = asyncio.ensure_future(redis.run())
        try:
            await asyncio.sleep(seconds)
        finally:
            redis.stop()
            await task
        return observer, redis

    return asyncio.run(run())
