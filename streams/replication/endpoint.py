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

from ..conf import repl_setting
from .connections import EndpointCounters, disconnect_reason, endpoint_started
from .consumer import ConnectionInfo
from .peer_state import RecentUserIps, SyncingUsersBudget
from .relay import ReplicationRelay

logger = logging.getLogger(__name__)

RECENT_DISCONNECTS = 100


@dataclass
class Endpoint:
    """Shared state of one endpoint process: the relay and who is connected."""

    server_name: str
    relay: ReplicationRelay
    connections: dict[str, ConnectionInfo] = field(default_factory=dict)
    close_reason: dict[str, str] = field(default_factory=dict)
    recent_disconnects: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RECENT_DISCONNECTS))
    #: the latest USER_IP per user, at most REPLICATION_MAX_USER_IPS users
    user_ips: RecentUserIps = field(default_factory=lambda: RecentUserIps(int(repl_setting("REPLICATION_MAX_USER_IPS"))))
    #: syncing (user, device) pairs of every connection, against REPLICATION_MAX_SYNCING_USERS
    syncing_budget: SyncingUsersBudget = field(
        default_factory=lambda: SyncingUsersBudget(int(repl_setting("REPLICATION_MAX_SYNCING_USERS"))))
    legacy: Any = None
    bridge: Any = None
    counters: EndpointCounters = field(default_factory=EndpointCounters)

    def disconnected(self, info: ConnectionInfo, reason: str) -> None:
        self.connections.pop(info.channel_name, None)
        reason = self.close_reason.pop(info.channel_name, reason)
        self.counters.disconnects[disconnect_reason(reason)] += 1
        self.recent_disconnects.append((time.time(), info.name, info.peer, reason))
        logger.info("replication %s (%s) disconnected: %s", info.name, info.peer, reason)

    def user_ip(self, cmd: Any) -> None:
        self.user_ips.add(cmd)



async def start_endpoint(host: str, port: int, *, using: str = "default") -> tuple[Endpoint, asyncio.AbstractServer]:
    """Start the relay and listen. Writes made in this process reach the relay directly."""
    from asgiref.sync import sync_to_async

    from ..runtime import runtime
    from .legacy import LegacyStreamer
    from .tcp import serve

    relay = ReplicationRelay(using=using)
    await relay.start()
    endpoint = Endpoint(server_name=repl_setting("SERVER_NAME"), relay=relay)
    endpoint.legacy = LegacyStreamer(endpoint, using=using)
    rt = await sync_to_async(runtime, thread_sensitive=False)()
    if not settings.REDIS_URL:
        # In-memory layer: writes made in this process publish from this loop.
        rt.stream_replication(loop=asyncio.get_running_loop())
    else:
        # Answer REPLICATE on the Synapse channel for writers that have gone quiet, including
        # writers that have exited (write_facts) and so cannot answer themselves.
        from .commands import PositionCommand
        from .redis import SynapseRedisBridge

        endpoint.bridge = SynapseRedisBridge(
            settings.REDIS_URL, endpoint.server_name,
            announce=lambda: [PositionCommand(s, w, t, t) for (s, w), t in sorted(relay.settled_positions().items())],
            # ... and tell when one goes still: a subscriber whose REPLICATE came too early
            # for an answer (the writer had just exited) learns where it stopped.
            volunteer_every=1.0,
        )
        endpoint.bridge.start()
    server = await serve(endpoint, host, port)
    # Operators' tools (the dashboard) publish the endpoint's connections from here.
    for receiver, error in endpoint_started.send_robust(Endpoint, endpoint=endpoint, host=host, port=port):
        if error is not None:
            logger.error("endpoint_started receiver %r failed: %r", receiver, error)
    return endpoint, server
