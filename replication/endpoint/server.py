"""One replication endpoint process: its relay, its connections, and how it starts.
See docs/replication.md."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from django.conf import settings

from common.heap_retention import retain_freed_heap
from replication.endpoint.connection_records import connection_snapshot, disconnect_reason, endpoint_started
from replication.endpoint.consumer import ReplicationConsumer
from replication.endpoint.endpoint_record import Endpoint
from replication.endpoint.redis_user_ips import RedisUserIps
from replication.endpoint.relay import ReplicationRelay
from replication.endpoint.tcp import serve
from replication.protocol.commands import PositionCommand
from replication.publish.redis_bridge import SynapseRedisBridge
from streams.conf import repl_setting
from streams.dialect import is_local_file

logger = logging.getLogger(__name__)


class LocalStreams(Protocol):
    """What the endpoint needs of its process's streams (``streams.runtime.StreamRuntime`` is
    one; ``runtime.py`` wires the process together, this module never reaches up to it)."""

    def writer_positions(self) -> dict[tuple[str, str], int]:
        """Wire tokens per (stream, writer) of this process's database-backed streams."""
        ...

    def stream_replication(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Publish this process's writes from ``loop`` (the in-memory layer: this endpoint's)."""
        ...


async def start_endpoint(host: str, port: int, *, streams: LocalStreams,
                         using: str = "default") -> tuple[Endpoint, asyncio.AbstractServer]:
    """Start the relay and listen. Writes made in this process (``streams``) reach the relay
    directly."""

    server_name = repl_setting("SERVER_NAME")
    if settings.REDIS_URL:
        # Every writer's batch (~340 KiB) is received, joined and sent here: reuse freed
        # buffers rather than fault fresh pages in for each (common/heap_retention.py).
        retain_freed_heap()
    # Embedded default: no channel layer reaches other processes, the database does.
    local_scan = not settings.REDIS_URL and is_local_file(using)
    relay = ReplicationRelay(using=using, local_scan=local_scan, local_positions=streams.writer_positions)
    await relay.start()
    bridge: SynapseRedisBridge | None = None
    endpoint: Endpoint | None = None
    if not settings.REDIS_URL:
        # In-memory layer: writes made in this process publish from this loop.
        streams.stream_replication(loop=asyncio.get_running_loop())
    else:
        # Answer REPLICATE on the Synapse channel for writers that have gone quiet, including
        # writers that have exited (write_facts) and so cannot answer themselves.

        async def heard_on_redis(line: str) -> None:
            assert endpoint is not None  # built below, before the bridge starts
            await endpoint.broadcast.heard_on_redis(line)

        bridge = SynapseRedisBridge(
            settings.REDIS_URL, server_name, role="endpoint",
            announce=lambda: [PositionCommand(s, w, t, t) for (s, w), t in sorted(relay.settled_positions().items())],
            # ... and tell when one goes still: a subscriber whose REPLICATE came too early
            # for an answer (the writer had just exited) learns where it stopped.
            volunteer_every=1.0,
            # REMOTE_SERVER_UP / LOCK_RELEASED of Redis workers and Synapse's processes, for
            # this endpoint's TCP workers (broadcast.py).
            on_command=heard_on_redis,
        )
    endpoint = Endpoint.build(server_name, relay, using=using, bridge=bridge)
    endpoint.user_ips.start()
    await endpoint.broadcast.start()
    if bridge is not None:

        bridge.start()
        # USER_IP of Redis workers and Synapse's processes, by one endpoint of the cluster.
        endpoint.redis_user_ips = RedisUserIps(settings.REDIS_URL, server_name, endpoint.user_ips,
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
                                if endpoint.redis_user_ips is not None else None),
        "user_syncs": {"total": endpoint.syncing.total, "refused": endpoint.syncing.refused},
        "history_reads": history_reads(endpoint),
    }


def cluster_commands(endpoint: Endpoint) -> dict[str, int]:
    broadcast, bridge = endpoint.broadcast, endpoint.bridge
    return {"from_workers": broadcast.from_workers, "from_endpoints": broadcast.from_endpoints,
            "from_redis": broadcast.from_redis, "refused_from_redis": broadcast.refused_from_redis,
            "own_echoes": bridge.own_echoes if bridge is not None else 0}


def history_reads(endpoint: Endpoint) -> dict[str, int]:
    """The legacy REPLICATE history reads (started, replaced, cancelled, completed, pages, rows,
    restarted; ``active`` now and ``most_active`` at once) and the peer state held."""
    legacy = endpoint.legacy
    out: dict[str, int] = dict(legacy.counters)
    out["active"], out["most_active"] = legacy.active, legacy.most_active
    return out
