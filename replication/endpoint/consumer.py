"""The server side of one replication connection, as a Channels consumer (scope type
``replication``). See docs/replication.md.

The TCP adapter (:mod:`replication.endpoint.tcp`) turns socket events into
``replication.connect`` / ``replication.receive`` / ``replication.disconnect``; the relay's
batches arrive by a call each (:meth:`ReplicationConsumer.relayed`, a numbered
:class:`~replication.protocol.line_batch.LineBatch`). Parsing, direction checks and
keepalive decisions are :class:`ReplicationConnection`'s; this class only acts on them.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.consumer import AsyncConsumer, get_handler_name

from replication.endpoint.connection_records import ConnectionInfo
from replication.endpoint.endpoint_record import Endpoint
from replication.endpoint.ratelimit import TokenBucket, command_cost
from replication.endpoint.relay import CONNECTIONS_GROUP, LOCAL_LAYER, replicate_positions
from replication.endpoint.validation import check_inbound
from replication.protocol.commands import (
    ClearUserSyncCommand,
    Command,
    ErrorCommand,
    FederationAckCommand,
    LegacyReplicateCommand,
    LockReleasedCommand,
    NameCommand,
    PingCommand,
    PositionCommand,
    RemoteProtocolError,
    RemoteServerUpCommand,
    ReplicateCommand,
    ServerCommand,
    UserIpCommand,
    UserSyncCommand,
)
from replication.protocol.connection import ReplicationConnection
from replication.protocol.legacy_rewrite import to_legacy
from replication.protocol.line_batch import LineBatch
from streams.conf import instance_name, repl_setting, stream_writers

logger = logging.getLogger(__name__)

#: How often the keepalive decisions are taken (PING due after 5 s idle, timeout after 25 s).
TICK_SECONDS = 1.0
#: How much of a peer's ERROR text is logged.
MAX_LOGGED_ERROR = 200


class ReplicationConsumer(AsyncConsumer):  # type: ignore[misc]  # Channels is opaque to the CI's mypy
    channel_layer_alias = LOCAL_LAYER

    async def dispatch(self, message: dict[str, Any]) -> None:
        # This consumer never touches the database: skip Channels' per-message
        # close_old_connections() thread hop (measured: half the per-delivery cost).
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            logger.error("replication consumer: no handler for %r", message.get("type"))
            return
        await handler(message)

    async def replication_connect(self, event: dict[str, Any]) -> None:
        self.endpoint: Endpoint = self.scope["endpoint"]
        now = time.time()
        self.conn = ReplicationConnection(
            "server", now=now, handshake_timeout=float(repl_setting("REPLICATION_HANDSHAKE_TIMEOUT")),
            line_timeout=float(repl_setting("REPLICATION_LINE_TIMEOUT")))
        #: The admission ticket (replication.endpoint.admission): tells the caps whether this
        #: connection is still in its handshake, and so may be evicted for a newcomer.
        self.ticket = self.scope.get("admission")
        self.legacy_reads: dict[str, Any] = {}  # stream -> legacy.HistoryRead in flight
        # Inbound command rate limit (docs/security.md); past it: ERROR and close.
        self.bucket = TokenBucket(repl_setting("REPLICATION_COMMAND_RATE"),
                                  int(repl_setting("REPLICATION_COMMAND_BURST")), time.monotonic())
        self.rate_exceeded = False
        self.info = ConnectionInfo(self.channel_name, event.get("peer", "?"), now,
                                   outbound=self.scope.get("protocol"))
        self.endpoint.connections[self.channel_name] = self.info
        self.endpoint.counters.connections += 1
        self.expected_seq: int | None = None
        await self.channel_layer.group_add(CONNECTIONS_GROUP, self.channel_name)
        self.endpoint.relay.attach(self.channel_name, self.relayed)
        await self.send_commands([ServerCommand(self.endpoint.server_name), PingCommand(str(int(now * 1000)))])
        self.ticker = asyncio.create_task(self._tick())

    async def replication_receive(self, event: dict[str, Any]) -> None:
        if self.rate_exceeded:
            return  # closing: read nothing more from a flooding peer
        now = time.time()
        self.conn.receive_data(event["bytes"], now)
        while True:
            try:
                received = self.conn.next_event(now)
                if not isinstance(received, Command):  # NEED_DATA or CLOSED
                    return
                cmd = check_inbound(received)
            except RemoteProtocolError as e:
                logger.warning("replication %s (%s): %s", self.info.name, self.info.peer, e.error_text)
                await self.error_and_close(e.error_text, reason="bad line")
                return
            if not self.bucket.take(time.monotonic(), command_cost(cmd)):
                self.rate_exceeded = True
                logger.warning("replication %s (%s): more than %s commands/s, disconnecting",
                               self.info.name, self.info.peer, self.bucket.rate)
                await self.error_and_close("Too many commands", reason="command rate exceeded")
                return
            self.info.commands_in += 1
            await self._handle(cmd, now)

    async def replication_disconnect(self, event: dict[str, Any]) -> None:
        self.endpoint.relay.detach(self.channel_name)
        self.endpoint.legacy.stop_all(self)
        self.endpoint.disconnected(self.info, event.get("reason", "connection lost"))
        task = getattr(self, "ticker", None)
        if task is not None:
            task.cancel()
        await self.channel_layer.group_discard(CONNECTIONS_GROUP, self.channel_name)
        from channels.exceptions import StopConsumer

        raise StopConsumer()

    # -- commands from the worker ---------------------------------------------------------------

    async def _handle(self, cmd: Command, now: float) -> None:
        if self.ticket is not None:
            self.ticket.update(handshake_done=self.conn.handshake_done, pings=self.conn.peer_sends_pings)
        if isinstance(cmd, PingCommand):
            self.info.last_ping_at = now
        elif isinstance(cmd, NameCommand):
            self.info.name = cmd.data
        elif isinstance(cmd, ReplicateCommand):
            self.info.replicating = True
            positions = replicate_positions(self.endpoint.relay.positions(), stream_writers(), instance_name())
            await self.send_commands([
                PositionCommand(stream, writer, token, token) for (stream, writer), token in sorted(positions.items())
            ])
        elif isinstance(cmd, LegacyReplicateCommand):
            await self.endpoint.legacy.subscribe(self, cmd)
        elif isinstance(cmd, UserSyncCommand):
            if not self.endpoint.user_sync(self.info, cmd) and not self.info.warned_syncing_cap:
                self.info.warned_syncing_cap = True
                logger.warning("replication %s (%s): syncing users over the cap (%d per connection, "
                               "%d in all): further USER_SYNC starts are dropped", self.info.name,
                               self.info.peer, self.endpoint.syncing.max_per_connection,
                               self.endpoint.syncing.max_total)
        elif isinstance(cmd, ClearUserSyncCommand):
            self.endpoint.clear_user_sync(self.info, cmd)
        elif isinstance(cmd, FederationAckCommand):
            self.endpoint.federation_ack(self.info, cmd)
        elif isinstance(cmd, UserIpCommand):
            self.endpoint.user_ip(cmd)
        elif isinstance(cmd, (RemoteServerUpCommand, LockReleasedCommand)):
            # Every instance of the cluster must hear of it (broadcast.py).
            await self.endpoint.broadcast.from_worker(self.channel_name, cmd)
        elif isinstance(cmd, ErrorCommand):
            logger.warning("replication %s (%s) reported error: %r", self.info.name, self.info.peer,
                           cmd.data[:MAX_LOGGED_ERROR])

    # -- lines from the relay ---------------------------------------------------------------

    async def relayed(self, seq: int, batch: LineBatch) -> None:
        """The relay's batch number ``seq``, for this connection as it subscribed."""
        if self.expected_seq is not None and seq != self.expected_seq:
            # A batch never reached us: this worker would miss facts. Close; it catches up
            # on reconnect.
            await self.error_and_close("Failed to keep up", reason="failed to keep up")
            return
        self.expected_seq = seq + 1
        for read in self.legacy_reads.values():
            read.offer(batch.parts)  # lines of a stream whose history is being read wait for it
        if self.info.legacy_streams:
            await self._send_batch(to_legacy(batch.parts, self.info.legacy_streams))
        elif self.info.replicating:
            await self._send_batch(batch)

    async def replication_relay_command(self, event: dict[str, Any]) -> None:
        """A cluster command from another worker or endpoint (broadcast.py): ``data`` and
        ``counts`` of its LineBatch."""
        if event["origin"] != self.channel_name:
            await self._send_batch(LineBatch(event["data"], event["counts"]))

    # -- helpers ----------------------------------------------------------------------------

    async def send_commands(self, cmds: list[Command]) -> None:
        if cmds:
            data = self.conn.send_many(cmds, time.time())
            self.info.lines_out += len(cmds)
            self.endpoint.counters.commands_sent(c.NAME for c in cmds)
            await self.send({"type": "replication.send", "bytes": data, "count": len(cmds)})

    async def _send_batch(self, batch: LineBatch) -> None:
        """Lines encoded elsewhere, through the connection's state (``last_sent``: no PING
        while lines flow) and counted by their counts."""
        count = batch.count
        if count:
            data = self.conn.send_batch(batch, time.time())
            self.info.lines_out += count
            self.endpoint.counters.batch_sent(batch.counts)
            await self.send({"type": "replication.send", "bytes": data, "count": count})

    async def send_lines(self, batch: LineBatch) -> None:
        """Lines already encoded (a page of legacy history)."""
        await self._send_batch(batch)

    async def writable(self) -> None:
        """Returns once the transport has room (nothing waits in its queue)."""
        await self.send({"type": "replication.drain"})

    async def pay(self, cost: int) -> None:
        """Spend ``cost`` tokens of this connection's command budget on work the endpoint does
        for it, waiting for them (never below a tenth of the burst, kept for its commands)."""
        bucket = self.bucket
        cost = max(1, min(cost, bucket.burst // 2))
        keep = bucket.burst // 10
        while not bucket.take(time.monotonic(), cost, keep):
            self.endpoint.counters.throttled += 1
            await asyncio.sleep(bucket.wait_time(time.monotonic(), cost, keep))

    async def error_and_close(self, text: str, *, reason: str) -> None:
        try:
            await self.send_commands([ErrorCommand(text)])
        finally:
            self.endpoint.close_reason[self.channel_name] = reason
            await self.send({"type": "replication.close"})

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            now = time.time()
            if self.conn.timed_out(now):
                await self.error_and_close("ping timeout", reason="ping timeout")
                return
            if self.conn.handshake_overdue(now):
                await self.error_and_close("handshake timeout", reason="handshake timeout")
                return
            if self.conn.line_overdue(now):
                await self.error_and_close("line timeout", reason="line timeout")
                return
            if self.conn.ping_due(now):
                await self.send_commands([PingCommand(str(int(now * 1000)))])
