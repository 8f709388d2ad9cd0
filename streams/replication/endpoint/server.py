"""One replication endpoint process: its relay, its connections, and how it starts.
See docs/replication.md."""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from streams.conf import repl_setting
from streams.replication.endpoint.bookkeeping import (
    ConnectionInfo,
    EndpointCounters,
    connection_snapshot,
    disconnect_reason,
    endpoint_started,
)
from streams.replication.endpoint.relay import ReplicationRelay
from streams.replication.endpoint.user_activity import SyncingUsers, UserIpRecorder

logger = logging.getLogger(__name__)

RECENT_DISCONNECTS = 100
#: Federation senders whose last FEDERATION_ACK a connection keeps (a worker runs one).
MAX_FEDERATION_ACKS = 16


@dataclass
class Endpoint:
    """Shared state of one endpoint process: the relay and who is connected."""

    server_name: str
    relay: ReplicationRelay
    connections: dict[str, ConnectionInfo] = field(default_factory=dict)
    close_reason: dict[str, str] = field(default_factory=dict)
    recent_disconnects: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RECENT_DISCONNECTS))
    #: USER_IP -> the user_ips table, in batches; USER_SYNC state per connection
    user_ips: UserIpRecorder = field(default_factory=UserIpRecorder)
    syncing: SyncingUsers = field(default_factory=lambda: SyncingUsers(
        max_per_connection=int(repl_setting("REPLICATION_MAX_SYNCING_USERS_PER_CONNECTION")),
        max_total=int(repl_setting("REPLICATION_MAX_SYNCING_USERS"))))
    legacy: Any = None
    broadcast: Any = None  #: CommandBroadcast (REMOTE_SERVER_UP, LOCK_RELEASED)
    bridge: Any = None
    #: RedisUserIps: USER_IP published on Redis, recorded while this endpoint holds the lease
    redis_user_ips: Any = None
    counters: EndpointCounters = field(default_factory=EndpointCounters)

    async def stop(self) -> None:
        """What must end in order before the process exits: the broadcast subscription, the
        Redis USER_IP listener, then the USER_IP sightings not yet written go to the table."""
        await self.broadcast.stop()
        if self.redis_user_ips is not None:
            await self.redis_user_ips.stop()
        await self.user_ips.stop()

    def disconnected(self, info: ConnectionInfo, reason: str) -> None:
        self.connections.pop(info.channel_name, None)
        self.syncing.connection_lost(info.channel_name)  # its workers' syncs end with it
        reason = self.close_reason.pop(info.channel_name, reason)
        self.counters.disconnects[disconnect_reason(reason)] += 1
        self.recent_disconnects.append((time.time(), info.name, info.peer, reason))
        logger.info("replication %s (%s) disconnected: %s", info.name, info.peer, reason)

    def user_ip(self, cmd: Any) -> None:
        self.user_ips.record(cmd)

    def federation_ack(self, info: ConnectionInfo, cmd: Any) -> None:
        """Kept for operators only: Synapse's main process trims its in-memory ``federation``
        stream queue to the lowest ack, and this project has no federation stream
        (docs/replication.md)."""
        acks = info.federation_acks
        if not (0 < len(cmd.instance_name) <= 255 and cmd.instance_name.isprintable()):
            return  # shown in the snapshot (a JSON column): no NUL, no control characters
        if cmd.instance_name in acks or len(acks) < MAX_FEDERATION_ACKS:
            acks[cmd.instance_name] = cmd.token

    def user_sync(self, info: ConnectionInfo, cmd: Any) -> bool:
        """False when a cap refused it (the connection stays; the caller warns once)."""
        return self.syncing.user_sync(info.channel_name, cmd)

    def clear_user_sync(self, info: ConnectionInfo, cmd: Any) -> None:
        self.syncing.clear_instance(info.channel_name, cmd.instance_id)


async def start_endpoint(host: str, port: int, *, using: str = "default") -> tuple[Endpoint, asyncio.AbstractServer]:
    """Start the relay and listen. Writes made in this process reach the relay directly."""
    from asgiref.sync import sync_to_async

    from streams.dialect import is_local_file
    from streams.replication.endpoint.broadcast import CommandBroadcast
    from streams.replication.endpoint.consumer import ReplicationConsumer
    from streams.replication.endpoint.legacy import LegacyStreamer
    from streams.replication.endpoint.tcp import serve
    from streams.runtime import runtime

    # Embedded default: no channel layer reaches other processes, the database does.
    local_scan = not settings.REDIS_URL and is_local_file(using)
    relay = ReplicationRelay(using=using, local_scan=local_scan)
    await relay.start()
    endpoint = Endpoint(server_name=repl_setting("SERVER_NAME"), relay=relay)
    endpoint.legacy = LegacyStreamer(relay.positions, using=using)
    endpoint.user_ips = UserIpRecorder(interval=repl_setting("USER_IP_FLUSH_SECONDS"), using=using,
                                        max_pending=int(repl_setting("REPLICATION_MAX_USER_IPS")))
    endpoint.user_ips.start()
    rt = await sync_to_async(runtime, thread_sensitive=False)()
    if not settings.REDIS_URL:
        # In-memory layer: writes made in this process publish from this loop.
        rt.stream_replication(loop=asyncio.get_running_loop())
    else:
        # Answer REPLICATE on the Synapse channel for writers that have gone quiet, including
        # writers that have exited (write_facts) and so cannot answer themselves.
        from streams.replication.protocol.commands import PositionCommand
        from streams.replication.publish.redis_bridge import SynapseRedisBridge

        endpoint.bridge = SynapseRedisBridge(
            settings.REDIS_URL, endpoint.server_name,
            announce=lambda: [PositionCommand(s, w, t, t) for (s, w), t in sorted(relay.settled_positions().items())],
            # ... and tell when one goes still: a subscriber whose REPLICATE came too early
            # for an answer (the writer had just exited) learns where it stopped.
            volunteer_every=1.0,
            # REMOTE_SERVER_UP / LOCK_RELEASED of Redis workers and Synapse's processes, for
            # this endpoint's TCP workers (broadcast.py).
            on_command=lambda line: endpoint.broadcast.heard_on_redis(line),
        )
    endpoint.broadcast = CommandBroadcast(endpoint)
    await endpoint.broadcast.start()
    if endpoint.bridge is not None:
        from streams.replication.endpoint.redis_user_ips import RedisUserIps

        endpoint.bridge.start()
        # USER_IP of Redis workers and Synapse's processes, by one endpoint of the cluster.
        endpoint.redis_user_ips = RedisUserIps(settings.REDIS_URL, endpoint.server_name, endpoint.user_ips,
                                               lease_seconds=float(repl_setting("USER_IP_LEASE_SECONDS")))
        endpoint.redis_user_ips.start()
    server = await serve(endpoint, host, port, ReplicationConsumer.as_asgi())
    # Operators' tools (the dashboard) publish the endpoint's connections from here.
    for receiver, error in endpoint_started.send_robust(Endpoint, endpoint=endpoint, host=host, port=port):
        if error is not None:
            logger.error("endpoint_started receiver %r failed: %r", receiver, error)
    return endpoint, server


def endpoint_snapshot(endpoint: Endpoint) -> dict[str, Any]:
    """Everything operators see of one endpoint, as JSON-able data."""
    return {
        "server_name": endpoint.server_name,
        "connections": sorted((connection_snapshot(i, endpoint.syncing) for i in list(endpoint.connections.values())),
                              key=lambda c: (c["connected_at"], c["peer"])),
        "recent_disconnects": [
            {"at": at, "name": name, "peer": peer, "reason": disconnect_reason(reason), "detail": reason}
            for at, name, peer, reason in reversed(endpoint.recent_disconnects)
        ],
        "counters": endpoint.counters.as_dict(),
        # USER_IP: received, written to user_ips, upsert statements, refused, waiting
        "user_ips": endpoint.user_ips.counters(),
        # REMOTE_SERVER_UP / LOCK_RELEASED: from this endpoint's workers, from the other
        # endpoints (channel layer), heard on Redis (and refused), our own echoes dropped
        "cluster_commands": cluster_commands(endpoint),
        # USER_IP published on Redis: whether this endpoint holds the recording lease, heard
        "user_ips_from_redis": (endpoint.redis_user_ips.counters()
                                if getattr(endpoint, "redis_user_ips", None) is not None else None),
        "user_syncs": {"total": endpoint.syncing.total, "refused": endpoint.syncing.refused},
        "history_reads": history_reads(endpoint),
    }


def cluster_commands(endpoint: Endpoint) -> dict[str, int]:
    broadcast, bridge = getattr(endpoint, "broadcast", None), getattr(endpoint, "bridge", None)
    counts = {name: getattr(broadcast, name, 0)
              for name in ("from_workers", "from_endpoints", "from_redis", "refused_from_redis")}
    counts["own_echoes"] = getattr(bridge, "own_echoes", 0)
    return counts


def history_reads(endpoint: Endpoint) -> dict[str, int]:
    """The legacy REPLICATE history reads (started, replaced, cancelled, completed, pages, rows,
    restarted; ``active`` now and ``most_active`` at once) and the peer state held."""
    legacy = getattr(endpoint, "legacy", None)
    out: dict[str, int] = {}
    if legacy is not None:
        out.update(legacy.counters)
        out["active"], out["most_active"] = legacy.active, legacy.most_active
    return out
