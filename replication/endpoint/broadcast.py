"""Commands every worker of the cluster must hear: ``REMOTE_SERVER_UP`` and ``LOCK_RELEASED``
(docs/replication.md).

Synapse's main process relays each to all its other connections (``send_command(cmd,
ignore_conn=conn)``); with Redis every process hears it on the shared channel. Here an
endpoint's TCP workers hear every such command of the cluster exactly once, and the sender
never hears its own back:

* **From one of its TCP workers**, an endpoint hands the command to its other connections,
  and publishes it on the Synapse Redis channel (``<server_name>``) when it has a Redis
  bridge: the other endpoints, Redis workers and Synapse's own processes hear it there.
  Without Redis (no bridge) it goes to the other endpoints through the cluster channel layer
  (group ``replication.broadcast``, tagged with this endpoint's ID so that it does not come
  back).
* **Heard on Redis** (published by a Redis worker, a Synapse process, or another endpoint),
  an endpoint hands it to its own connections only, never on to anyone else; its own
  publications coming back (Redis delivers a publisher's message to its own subscription
  too) are recognised and dropped by the bridge (``SynapseRedisBridge.publish_command_lines``
  remembers what it published until the echo arrives, at most 10 s).

Why exactly once. A TCP worker is connected to one endpoint, and a command reaches each
endpoint through exactly one medium: Redis when the cluster has Redis (every endpoint is
subscribed, and hears each publication once per subscription), the channel layer when it does
not (then there is no Redis to hear it on). Had the endpoints used both -- the channel layer
between themselves and Redis for everyone else -- each would receive an endpoint's command
twice and could not tell the Redis copy from a Redis worker's identical command, since a
Redis message carries no sender. Nor does an endpoint pass a Redis-heard command on to the
other endpoints: they heard it themselves. Where it can fail: an endpoint whose subscription
is down at that moment misses it for its workers (as a Synapse worker whose Redis connection
is down does), and a command identical to one this endpoint published less than 10 s ago,
arriving while that echo is still expected (its subscription was being renewed), is taken
for the echo.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from channels.layers import get_channel_layer

from replication.endpoint.relay import CONNECTIONS_GROUP, LOCAL_LAYER
from replication.endpoint.validation import check_inbound
from replication.protocol.commands import (
    Command,
    LockReleasedCommand,
    RemoteProtocolError,
    RemoteServerUpCommand,
    parse_line,
)
from replication.protocol.line_batch import LineBatch

if TYPE_CHECKING:
    from replication.publish.redis_bridge import SynapseRedisBridge

logger = logging.getLogger(__name__)

#: Cluster-wide group of the endpoints, for commands one of them heard from a worker, when
#: the cluster has no Redis bridge.
BROADCAST_GROUP = "replication.broadcast"


class CommandBroadcast:
    """One endpoint's part in spreading ``REMOTE_SERVER_UP`` / ``LOCK_RELEASED``."""

    def __init__(self, bridge: SynapseRedisBridge | None, *, cluster_layer: Any = None,
                 local_layer: Any = None) -> None:
        """``bridge``: the endpoint's Synapse Redis channel, when the cluster has Redis (the
        other endpoints hear us there); otherwise the cluster channel layer carries it."""
        self.bridge = bridge
        self.endpoint_id = uuid.uuid4().hex
        self.cluster_layer = cluster_layer or get_channel_layer()
        self.local_layer = local_layer or get_channel_layer(LOCAL_LAYER)
        self.from_workers = 0
        self.from_endpoints = 0
        self.from_redis = 0
        self.refused_from_redis = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.bridge is not None:
            return  # the other endpoints hear our publications on Redis
        channel = await self.cluster_layer.new_channel()
        await self.cluster_layer.group_add(BROADCAST_GROUP, channel)
        self._task = asyncio.get_running_loop().create_task(self._listen(channel), name="command-broadcast")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def from_worker(self, origin: str, cmd: Command) -> None:
        """``cmd`` came from the connection ``origin`` of this endpoint: pass it on."""
        self.from_workers += 1
        await self._to_connections(cmd, origin)
        line = cmd.to_line()
        bridge = self.bridge
        if bridge is not None:
            if not await bridge.publish_command_lines([line]):
                logger.warning("could not publish %r on Redis", line[:100])
            return
        try:
            await self.cluster_layer.group_send(BROADCAST_GROUP, {
                "type": "replication.broadcast", "line": line, "origin": self.endpoint_id,
            })
        except Exception:
            logger.exception("could not pass %r on to the other endpoints", line[:100])

    async def heard_on_redis(self, line: str) -> None:
        """``line`` was published on the Synapse channel by someone else (the bridge has
        dropped our own echoes): to this endpoint's connections, if it is a well-formed
        cluster command (what a TCP worker would be sent must parse there)."""
        try:
            cmd = check_inbound(parse_line(line))
            if not isinstance(cmd, (RemoteServerUpCommand, LockReleasedCommand)):
                raise RemoteProtocolError(f"not a cluster command: {line[:40]!r}")
        except RemoteProtocolError as e:
            self.refused_from_redis += 1
            logger.warning("ignoring a command heard on Redis: %s", e.error_text)
            return
        self.from_redis += 1
        await self._to_connections(cmd, None)

    async def _listen(self, channel: str) -> None:
        while True:
            message = await self.cluster_layer.receive(channel)
            if message.get("origin") == self.endpoint_id:
                continue  # our own, already handed out
            line = message.get("line")
            if not isinstance(line, str) or "\n" in line:
                logger.warning("ignoring a malformed broadcast message %r", message)
                continue
            try:
                cmd = parse_line(line)
            except RemoteProtocolError as e:
                logger.warning("ignoring a malformed broadcast command: %s", e.error_text)
                continue
            self.from_endpoints += 1
            try:
                await self._to_connections(cmd, None)
            except Exception:
                logger.exception("relaying a broadcast command failed")

    async def _to_connections(self, cmd: Command, origin: str | None) -> None:
        batch = LineBatch.of_commands([cmd])
        await self.local_layer.group_send(CONNECTIONS_GROUP, {
            "type": "replication.relay_command", "data": batch.data, "counts": dict(batch.counts), "origin": origin,
        })
