"""What an endpoint can tell operators about its connections: who is connected (NAME,
address, since when, last PING, outbound queue, streams followed, syncing users), who left
and why, and how many RDATA/POSITION lines it sent. Pure bookkeeping, no I/O.

The consumer records here (a connection's outbound queue is read from the TCP adapter,
``scope["protocol"]``); :func:`endpoint_snapshot` turns an endpoint's state into plain data.
Other processes learn it from whoever handles :data:`endpoint_started`
(the dashboard app stores snapshots in a table, see ``dashboard/endpoint_status.py``): the
endpoint is a process of its own (``runreplication``), and on the embedded default it shares
no channel layer with the web process.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from django.dispatch import Signal

from streams.registry import STREAMS

if TYPE_CHECKING:
    from replication.endpoint.user_activity import SyncingUsers
    from replication.protocol.commands import FederationAckCommand

#: Sent by ``start_endpoint`` once it listens: ``endpoint=Endpoint, host=str, port=int``.
#: Receivers run on the endpoint's event loop (they may start tasks there).
endpoint_started = Signal()

#: The reasons a connection ends, as operators see them (and as /metrics labels them).
DISCONNECT_REASONS = ("ping timeout", "failed to keep up", "bad line", "shut down", "connection lost",
                      "handshake timeout", "line timeout", "evicted", "command rate exceeded")

#: Syncing users listed per connection in a snapshot (the count is always exact).
MAX_USERS_LISTED = 50
#: USER_SYNC entries (user, device, syncing process) per connection in a snapshot, for the
#: per-user page; a worker reporting more shows only the first ones (by user ID).
MAX_SYNCS_LISTED = 1000
#: Federation senders whose last FEDERATION_ACK a connection keeps (a worker runs one).
MAX_FEDERATION_ACKS = 16


def disconnect_reason(text: str) -> str:
    """``"connection lost: [Errno 104] ..."`` -> ``"connection lost"``; known reasons as is."""
    for reason in DISCONNECT_REASONS:
        if text.startswith(reason):
            return reason
    return text


@dataclass
class ConnectionInfo:
    """What the endpoint knows about one connected worker (for operators)."""

    channel_name: str
    peer: str
    connected_at: float
    name: str = "anon"
    last_ping_at: float | None = None
    replicating: bool = False
    legacy_streams: dict[str, str] = field(default_factory=dict)
    federation_acks: dict[str, int] = field(default_factory=dict)
    commands_in: int = 0
    lines_out: int = 0
    #: a USER_SYNC was refused by a cap (warned once per connection)
    warned_syncing_cap: bool = False
    #: the transport side (``pending_commands``: its outbound queue), for operators
    outbound: Any = field(default=None, repr=False)


def record_federation_ack(info: ConnectionInfo, cmd: FederationAckCommand) -> None:
    """Kept for operators only: Synapse's main process trims its in-memory ``federation``
    stream queue to the lowest ack, and this project has no federation stream
    (docs/replication.md)."""
    acks = info.federation_acks
    if not (0 < len(cmd.instance_name) <= 255 and cmd.instance_name.isprintable()):
        return  # shown in the snapshot (a JSON column): no NUL, no control characters
    if cmd.instance_name in acks or len(acks) < MAX_FEDERATION_ACKS:
        acks[cmd.instance_name] = cmd.token


@dataclass
class EndpointCounters:
    """Totals since the endpoint started (closed connections included)."""

    started_at: float = field(default_factory=time.time)
    connections: int = 0
    rdata_sent: int = 0
    position_sent: int = 0
    other_sent: int = 0
    #: times a connection's history read waited for its command budget (HISTORY_PAGE_COST)
    throttled: int = 0
    disconnects: collections.Counter[str] = field(default_factory=collections.Counter)

    def batch_sent(self, counts: Mapping[str, int]) -> None:
        """A batch went out to one connection: its counts, from where its lines were made
        (``line_batch.py``). A legacy subscriber's RDATA and POSITION (history pages, live
        lines rewritten) count as RDATA and POSITION: the same facts in the older form."""
        for name, n in counts.items():
            if name == "RDATA":
                self.rdata_sent += n
            elif name == "POSITION":
                self.position_sent += n
            else:
                self.other_sent += n

    def commands_sent(self, names: Iterable[str]) -> None:
        for name in names:
            if name == "RDATA":
                self.rdata_sent += 1
            elif name == "POSITION":
                self.position_sent += 1
            else:
                self.other_sent += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at, "connections": self.connections,
            "rdata_sent": self.rdata_sent, "position_sent": self.position_sent,
            "other_sent": self.other_sent, "throttled": self.throttled, "disconnects": dict(self.disconnects),
        }


def connection_snapshot(info: ConnectionInfo, syncing: SyncingUsers | None = None) -> dict[str, Any]:
    """One connection for operators; ``syncing``: the endpoint's USER_SYNC state."""
    if syncing is not None:
        users = sorted(syncing.users_of_connection(info.channel_name))
        syncs = syncing.of_connection(info.channel_name, MAX_SYNCS_LISTED)
    else:
        users, syncs = [], []
    if info.replicating:
        streams = sorted(STREAMS)
    else:
        streams = sorted(info.legacy_streams)
    outbound = getattr(info, "outbound", None)
    return {
        "name": info.name,
        "peer": info.peer,
        "connected_at": info.connected_at,
        "last_ping_at": info.last_ping_at,
        "outbound_queue": getattr(outbound, "pending_commands", 0),
        "streams": streams,
        "syncing_users": users[:MAX_USERS_LISTED],
        "syncing_user_count": len(users),
        # per (user, device, syncing process): the dashboard's per-user page reads these
        "syncing": syncs,
        "federation_acks": dict(info.federation_acks),
        "commands_in": info.commands_in,
        "lines_out": info.lines_out,
    }
