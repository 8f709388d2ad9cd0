"""The state one endpoint process shares between its connections, as a plain typed record
(docs/replication.md, "The endpoint").

Each field is the concrete part it is (the relay, the legacy streamer, the cluster command
broadcast, the Redis bridge when the cluster has Redis...): the consumer reaches them through
``scope["endpoint"]`` with their types, so a change of one is checked where it is used.
:func:`~replication.endpoint.server.start_endpoint` builds it; nothing here starts or
imports the process's runtime.
"""
from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field

from replication.endpoint.broadcast import CommandBroadcast
from replication.endpoint.connection_records import (
    ConnectionInfo,
    EndpointCounters,
    disconnect_reason,
    record_federation_ack,
)
from replication.endpoint.legacy import LegacyStreamer
from replication.endpoint.redis_user_ips import RedisUserIps
from replication.endpoint.relay import ReplicationRelay
from replication.endpoint.user_activity import SyncingUsers, UserIpRecorder
from replication.protocol.commands import (
    ClearUserSyncCommand,
    FederationAckCommand,
    UserIpCommand,
    UserSyncCommand,
)
from replication.publish.redis_bridge import SynapseRedisBridge
from streams.conf import repl_setting

logger = logging.getLogger(__name__)

RECENT_DISCONNECTS = 100

#: (when, NAME, peer, reason) of a connection that ended
Disconnect = tuple[float, str, str, str]


@dataclass
class Endpoint:
    """Shared state of one endpoint process: its parts and who is connected."""

    server_name: str
    relay: ReplicationRelay
    #: legacy ``REPLICATE <stream> <token>`` subscriptions and their history reads
    legacy: LegacyStreamer
    #: REMOTE_SERVER_UP / LOCK_RELEASED to every instance of the cluster
    broadcast: CommandBroadcast
    #: USER_IP -> the user_ips table, in batches
    user_ips: UserIpRecorder
    #: USER_SYNC state per connection (bounded)
    syncing: SyncingUsers
    #: the Synapse Redis channel (answers REPLICATE for quiet writers), with Redis only
    bridge: SynapseRedisBridge | None = None
    #: USER_IP published on Redis, recorded while this endpoint holds the lease (Redis only)
    redis_user_ips: RedisUserIps | None = None
    connections: dict[str, ConnectionInfo] = field(default_factory=dict)
    close_reason: dict[str, str] = field(default_factory=dict)
    recent_disconnects: collections.deque[Disconnect] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_DISCONNECTS))
    counters: EndpointCounters = field(default_factory=EndpointCounters)

    @classmethod
    def build(cls, server_name: str, relay: ReplicationRelay, *, using: str = "default",
              bridge: SynapseRedisBridge | None = None) -> Endpoint:
        """An endpoint's state with its parts made from the settings (nothing started)."""

        return cls(
            server_name=server_name, relay=relay, legacy=LegacyStreamer(relay.positions, using=using),
            broadcast=CommandBroadcast(bridge),
            user_ips=UserIpRecorder(interval=repl_setting("USER_IP_FLUSH_SECONDS"), using=using,
                                    max_pending=int(repl_setting("REPLICATION_MAX_USER_IPS"))),
            syncing=SyncingUsers(
                max_per_connection=int(repl_setting("REPLICATION_MAX_SYNCING_USERS_PER_CONNECTION")),
                max_total=int(repl_setting("REPLICATION_MAX_SYNCING_USERS"))),
            bridge=bridge)

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

    def user_ip(self, cmd: UserIpCommand) -> None:
        self.user_ips.record(cmd)

    def federation_ack(self, info: ConnectionInfo, cmd: FederationAckCommand) -> None:
        record_federation_ack(info, cmd)

    def user_sync(self, info: ConnectionInfo, cmd: UserSyncCommand) -> bool:
        """False when a cap refused it (the connection stays; the caller warns once)."""
        return self.syncing.user_sync(info.channel_name, cmd)

    def clear_user_sync(self, info: ConnectionInfo, cmd: ClearUserSyncCommand) -> None:
        self.syncing.clear_instance(info.channel_name, cmd.instance_id)
