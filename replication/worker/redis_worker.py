"""The worker over Redis pub/sub, as Synapse workers follow a cluster (docs/replication.md,
"Redis, as Synapse speaks it" and "The worker").

SUBSCRIBE to the channel named exactly the server name, wait for the confirmation, then
PUBLISH ``REPLICATE `` on a second connection (the other order could miss the POSITION
answers). Each message is one command line: malformed ones are logged and dropped; there are
no direction checks (pub/sub has no sides); RDATA/POSITION of our own instance name are echoes
and ignored. The subscription is :mod:`replication.protocol.redis_session`'s, shared
with the writers' bridge: PINGed after 5 s of silence and dropped after 15 s, so a socket that
died without a FIN is noticed.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio.connection import parse_url as parse_redis_url

from common.url_redaction import redact_url
from replication.protocol.commands import (
    Command,
    PositionCommand,
    RdataCommand,
    RdataRun,
    RemoteProtocolError,
    ReplicateCommand,
    add_rdata_line,
    parse_line,
)
from replication.protocol.redis_session import RedisSubscription, SubscriptionPolicy
from replication.protocol.resp import RespConnection, RespError, message_head, parse_messages
from replication.publish.redis_bridge import redis_channel
from replication.worker.worker_core import BaseReplicationWorker

logger = logging.getLogger(__name__)


class RedisReplicationWorker(BaseReplicationWorker):
    """Follows the cluster through Redis pub/sub, as Synapse workers do.

    ``redis_url`` is a ``redis://``, ``rediss://`` or ``unix://`` URL (its database number
    does not matter: pub/sub channels are server-wide). The channel is ``server_name``
    exactly. The subscription is :class:`~.redis_session.RedisSubscription` (the one the
    writers' bridge keeps too): its own connection, with a second one to publish on (Redis
    allows nothing but (UN)SUBSCRIBE and PING on a subscribed connection), both through
    :class:`~.resp.RespConnection`, not redis-py's ``PubSub``: PubSub silently reconnects and
    resubscribes inside a read, which would hide from us (and from the follower) that
    messages were lost, and would not publish REPLICATE again; and its pure-Python parser
    costs several times what the rest of the worker does per line.

    Session: SUBSCRIBE, wait for the confirmation, then PUBLISH ``REPLICATE ``
    (awaiting its reply) and read messages until the connection is lost, the subscriber has
    been silent for ``ping_timeout`` seconds (it is PINGed every ``ping_interval`` while
    silent), or :meth:`stop`. :meth:`publish` sends a command of the worker's own
    (``REMOTE_SERVER_UP``, ``LOCK_RELEASED``, ``USER_IP``...) to the cluster.
    """

    transport = "redis"

    def __init__(
        self,
        *,
        redis_url: str,
        ping_interval: float | None = None,
        ping_timeout: float | None = None,
        reply_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        defaults = SubscriptionPolicy()
        kwargs.setdefault("reconnect_first_delay", defaults.first_delay)
        kwargs.setdefault("reconnect_max_delay", defaults.max_delay)
        super().__init__(**kwargs)
        if not self.server_name or any(c in self.server_name for c in "\r\n"):
            raise ValueError(f"invalid server name (Redis channel) {self.server_name!r}")
        self.redis_url = redis_url
        self.channel = self.server_name
        parse_redis_url(redis_url)  # ValueError for a bad URL
        self._reply_timeout = reply_timeout or defaults.confirm_timeout
        policy = SubscriptionPolicy(
            ping_interval=ping_interval or defaults.ping_interval,
            silence_timeout=ping_timeout or defaults.silence_timeout,
            confirm_timeout=self._reply_timeout,
            first_delay=self._first_delay, max_delay=self._max_delay)
        self.subscription = RedisSubscription(
            redis_url, [self.channel.encode()], on_subscribed=self._on_subscribed,
            on_chunk=self._on_chunk, on_lost=self._on_lost, policy=policy,
            name=f"Redis replication ({self.name})", clock=self._clock, counters=self._counters)
        self._publisher: RespConnection | None = None
        self._publish_lock = asyncio.Lock()
        self._buf = b""
        self._head = message_head(self.channel.encode())

    def _interrupt(self) -> None:
        self.subscription.stop()

    async def _connect_forever(self) -> None:
        if self._stopping:
            return
        try:
            await self.subscription.run()
        finally:
            if self._publisher is not None:
                await self._publisher.close()
                self._publisher = None

    async def publish(self, cmd: Command) -> int:
        """PUBLISH one command of ours on its Synapse channel; the number of subscribers that
        got it (raises :class:`~.resp.RespError` or TimeoutError if Redis did not take it)."""
        line = cmd.to_line().encode()
        async with self._publish_lock:
            try:
                if self._publisher is None:
                    self._publisher = await RespConnection.open(self.redis_url, self._reply_timeout)
                return await self._publisher.command("PUBLISH", redis_channel(self.channel, line), line,
                                                     timeout=self._reply_timeout)
            except (RespError, OSError, TimeoutError):
                if self._publisher is not None:
                    await self._publisher.close()
                    self._publisher = None
                raise

    async def _on_subscribed(self) -> None:
        # From here on, everything published on the channel reaches us: a new connection
        # for the follower (the last one ended with connection_lost()). Then REPLICATE, and
        # wait until Redis took it.
        self._buf = b""
        async with self._publish_lock:
            if self._publisher is not None:  # of an earlier subscription: maybe a dead socket
                await self._publisher.close()
                self._publisher = None
        self.connected = True
        self._counters["connections"] += 1
        try:
            receivers = await self.publish(ReplicateCommand())
        except TimeoutError:
            raise TimeoutError(f"PUBLISH not answered within {self._reply_timeout}s") from None
        self._counters["replicate_sent"] += 1
        logger.info("replication subscribed to %r at %s as %s; REPLICATE reached %s "
                    "subscriber(s)", self.channel, redact_url(self.redis_url), self.name, receivers)

    def _on_lost(self, reason: str | None) -> None:
        self.connected = False
        self.follower.connection_lost()

    def _on_chunk(self, chunk: bytes) -> None:
        buf = self._buf + chunk if self._buf else chunk
        replies, end = parse_messages(buf, 0, self._head)
        self._buf = buf[end:]
        cmds: list[Command | RdataRun] = []
        messages = 0
        for reply in replies:
            if type(reply) is bytes:
                messages += 1
                if reply.startswith(b"RDATA ") and add_rdata_line(cmds, reply):
                    # The hot path: RDATA gathered in runs per writer, no command object each
                    # (a line it refuses goes to _parse, which names the error).
                    continue
                cmd = self._parse(reply)
                if cmd is not None:
                    cmds.append(cmd)
            elif not (reply and reply[0] == b"pong"):
                logger.debug("Redis reply ignored: %r", reply)
        self._counters["messages"] += messages
        own = sum(len(c.entries) for c in cmds if type(c) is RdataRun and c.instance_name == self.name)
        if own:  # what we published, echoed back
            self._counters["own_echoes"] += own
            cmds = [c for c in cmds if not (type(c) is RdataRun and c.instance_name == self.name)]
        if cmds:
            # A read's worth of messages to the follower at once (the hot path).
            self._dispatch_many(cmds)

    def _parse(self, data: bytes) -> Command | None:
        """One pub/sub message other than well-formed RDATA: one command line, without
        newline. Returns the command for the follower, if it is one for it."""
        try:
            cmd = parse_line(data.decode("utf-8"))
        except (UnicodeDecodeError, RemoteProtocolError) as e:
            self._counters["malformed"] += 1
            text = e.error_text if isinstance(e, RemoteProtocolError) else repr(e)
            logger.warning("dropping malformed replication message on %r: %s (%r)",
                           self.channel, text, data[:200])
            return None
        kind = type(cmd)
        if kind is RdataCommand or kind is PositionCommand:
            if cmd.instance_name == self.name:
                self._counters["own_echoes"] += 1  # what we published, echoed back
                return None
            return cmd
        if isinstance(cmd, ReplicateCommand):
            # Someone (re)subscribed, maybe us: the writers answer it; a worker sources
            # no stream, so it has no position to announce.
            self._counters["replicate_seen"] += 1
            return None
        return cmd
