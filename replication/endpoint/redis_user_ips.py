"""``USER_IP`` published on Redis into ``user_ips``, by one endpoint of the cluster at a time
(docs/replication.md).

Synapse's workers publish each client sighting on ``<server_name>/USER_IP``, a channel only
Synapse's main process subscribes to, and the main process records it. Our cluster has no
main process but N endpoints on one Redis. Had every endpoint recorded what it heard there,
each sighting would be written N times (the upsert is idempotent, so the table would end the
same, but the database would do N times the work for nothing). So exactly one endpoint
subscribes to that channel: the one holding a lease in Redis (``SET <key> <id> NX PX``,
renewed every third of its life with a compare-and-renew script). Any endpoint can take over
when the holder goes, with no configuration to keep in step with the deployment.

It records through the endpoint's batched :class:`~.user_activity.UserIpRecorder`, the same
path as ``USER_IP`` from TCP workers (which never go onto Redis, so nothing is counted
twice). Trade-offs, as with Synapse's main process: while nobody holds the lease (up to
``LEASE_SECONDS`` after a holder died without releasing it, or while Redis is away) the
sightings published meanwhile are not recorded (the client's next request refreshes them);
during a handover two endpoints may briefly both record, which the upsert absorbs.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from replication.endpoint.validation import check_inbound
from replication.protocol.commands import RemoteProtocolError, UserIpCommand, parse_line
from replication.protocol.redis_session import (
    CONFIRM_TIMEOUT,
    OutageNotice,
    RedisSubscription,
    SubscriptionPolicy,
)
from replication.protocol.resp import RespConnection, RespError, parse_messages

logger = logging.getLogger(__name__)

LEASE_SECONDS = 15.0
_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
          "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end")
_RELEASE = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
            "return redis.call('del', KEYS[1]) else return 0 end")


def lease_key(server_name: str) -> str:
    return f"synapse_repl:user_ip_recorder:{server_name}"


class RedisUserIps:
    """While this endpoint holds the lease: ``<server_name>/USER_IP`` -> ``recorder``."""

    def __init__(self, redis_url: str, server_name: str, recorder: Any, *,
                 lease_seconds: float = LEASE_SECONDS, policy: SubscriptionPolicy = SubscriptionPolicy()) -> None:
        self.url = redis_url
        self.server_name = server_name
        self.recorder = recorder
        self.key = lease_key(server_name)
        self.channel = f"{server_name}/USER_IP".encode()
        self.holder_id = uuid.uuid4().hex
        self.lease_seconds = lease_seconds
        self.policy = policy
        self.holding = False
        self.heard = 0
        self.refused = 0
        self.subscribed = asyncio.Event()
        self._conn: RespConnection | None = None
        self._subscription: RedisSubscription | None = None
        self._outage = OutageNotice("USER_IP lease on Redis")
        self._subscription_task: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._buf = b""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="redis-user-ips")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._unsubscribe()
        if self.holding and self._conn is not None:
            try:  # let another endpoint take over at once
                await self._conn.command("EVAL", _RELEASE, 1, self.key, self.holder_id, timeout=1.0)
            except (RespError, OSError, TimeoutError):
                pass
        self.holding = False
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    def counters(self) -> dict[str, Any]:
        return {"holding": self.holding, "heard": self.heard, "refused": self.refused}

    async def _run(self) -> None:
        while True:
            try:
                holding = await self._hold()
                notice = self._outage.up(time.monotonic())
            except (RespError, OSError, TimeoutError) as e:
                notice = self._outage.failed(time.monotonic(), str(e) or type(e).__name__,
                                             was_up=self._outage.down_since is None)
                holding = False
                if self._conn is not None:
                    await self._conn.close()
                    self._conn = None
            if notice is not None:
                logger.log(*notice)
            if holding != self.holding:
                logger.info("this endpoint %s records USER_IP published on Redis",
                            "now" if holding else "no longer")
            self.holding = holding
            if holding and self._subscription is None:
                self._subscribe()
            elif not holding and self._subscription is not None:
                await self._unsubscribe()
            await asyncio.sleep(self.lease_seconds / 3)

    async def _hold(self) -> bool:
        """Take the lease, or renew it if it is ours; whether we hold it now."""
        if self._conn is None:
            self._conn = await RespConnection.open(self.url, CONFIRM_TIMEOUT)
        ms = int(self.lease_seconds * 1000)
        if self.holding:
            renewed = await self._conn.command("EVAL", _RENEW, 1, self.key, self.holder_id, ms,
                                               timeout=CONFIRM_TIMEOUT)
            if renewed == 1:
                return True
        taken = await self._conn.command("SET", self.key, self.holder_id, "NX", "PX", ms, timeout=CONFIRM_TIMEOUT)
        return bool(taken == b"OK")

    def _subscribe(self) -> None:
        self._subscription = RedisSubscription(
            self.url, [self.channel], on_subscribed=self._on_subscribed, on_chunk=self._on_chunk,
            on_lost=lambda reason: self.subscribed.clear(), policy=self.policy,
            name=f"Redis subscription to {self.channel.decode()}")
        self._subscription_task = asyncio.get_running_loop().create_task(
            self._subscription.run(), name="redis-user-ips-subscription")

    async def _unsubscribe(self) -> None:
        if self._subscription is not None:
            self._subscription.stop()
        if self._subscription_task is not None:
            await asyncio.gather(self._subscription_task, return_exceptions=True)
        self._subscription = self._subscription_task = None
        self.subscribed.clear()

    async def _on_subscribed(self) -> None:
        self._buf = b""
        self.subscribed.set()

    def _on_chunk(self, chunk: bytes) -> None:
        buf = self._buf + chunk if self._buf else chunk
        replies, end = parse_messages(buf)
        self._buf = buf[end:]
        for reply in replies:
            if type(reply) is bytes:
                self._on_message(reply)

    def _on_message(self, data: bytes) -> None:
        try:
            cmd = parse_line(data.decode("utf-8"))
            if not isinstance(cmd, UserIpCommand):
                raise RemoteProtocolError(f"not USER_IP: {data[:40]!r}")
            cmd = check_inbound(cmd)
        except (UnicodeDecodeError, RemoteProtocolError) as e:
            self.refused += 1
            text = e.error_text if isinstance(e, RemoteProtocolError) else repr(e)
            logger.warning("ignoring a message on %s: %s", self.channel.decode(), text)
            return
        self.heard += 1
        if not self.recorder.record(cmd):
            self.refused += 1
