"""Commands every worker of the cluster must hear: ``REMOTE_SERVER_UP`` and ``LOCK_RELEASED``
(docs/replication.md).

Synapse's main process relays each to all its other connections (``send_command(cmd,
ignore_conn=conn)``); with Redis every process hears it on the shared channel. Here a
worker's command reaches an endpoint, which hands it on three ways:

* to its other connections (this process's layer, group ``replication.connections``);
* to the other endpoints (the cluster channel layer, group ``replication.broadcast``, tagged
  with this endpoint's ID so that it does not come back), which give it to their connections;
* onto the Synapse Redis channel (``<server_name>``), for workers that follow over Redis and
  for Synapse's own processes.

Commands published on the Synapse channel by others (a Redis worker, a Synapse process) are
not relayed to TCP workers (docs/replication.md).
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from channels.layers import get_channel_layer

from .relay import CONNECTIONS_GROUP, LOCAL_LAYER

logger = logging.getLogger(__name__)

#: Cluster-wide group of the endpoints, for commands one of them heard from a worker.
BROADCAST_GROUP = "replication.broadcast"


class CommandBroadcast:
    """One endpoint's part in spreading ``REMOTE_SERVER_UP`` / ``LOCK_RELEASED``."""

    def __init__(self, endpoint: Any, *, cluster_layer: Any = None, local_layer: Any = None) -> None:
        self.endpoint = endpoint
        self.endpoint_id = uuid.uuid4().hex
        self.cluster_layer = cluster_layer or get_channel_layer()
        self.local_layer = local_layer or get_channel_layer(LOCAL_LAYER)
        self.from_workers = 0
        self.from_endpoints = 0
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        channel = await self.cluster_layer.new_channel()
        await self.cluster_layer.group_add(BROADCAST_GROUP, channel)
        self._task = asyncio.get_running_loop().create_task(self._listen(channel), name="command-broadcast")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def from_worker(self, origin: str, line: str) -> None:
        """``line`` came from the connection ``origin`` of this endpoint: pass it on."""
        self.from_workers += 1
        await self._to_connections(line, origin)
        try:
            await self.cluster_layer.group_send(BROADCAST_GROUP, {
                "type": "replication.broadcast", "line": line, "origin": self.endpoint_id,
            })
        except Exception:
            logger.exception("could not pass %r on to the other endpoints", line[:100])
        bridge = self.endpoint.bridge
        if bridge is not None and not await bridge.publish_command_lines([line]):
            logger.warning("could not publish %r on Redis", line[:100])

    async def _listen(self, channel: str) -> None:
        while True:
            message = await self.cluster_layer.receive(channel)
            if message.get("origin") == self.endpoint_id:
                continue  # our own, already handed out
            line = message.get("line")
            if not isinstance(line, str) or "\n" in line:
                logger.warning("ignoring a malformed broadcast message %r", message)
                continue
            self.from_endpoints += 1
            try:
                await self._to_connections(line, None)
            except Exception:
                logger.exception("relaying a broadcast command failed")

    async def _to_connections(self, line: str, origin: str | None) -> None:
        await self.local_layer.group_send(CONNECTIONS_GROUP, {
            "type": "replication.relay_command", "data": (line + "\n").encode(), "origin": origin,
        })
