"""Who may open a TCP replication connection, decided before any byte is read or written
(docs/security.md).

:class:`PeerPolicy` (no I/O) holds the rules: the peer's address must be in
``REPLICATION_ALLOWED_NETWORKS`` (default loopback only), and at most
``REPLICATION_MAX_CONNECTIONS`` connections in all and
``REPLICATION_MAX_CONNECTIONS_PER_ADDRESS`` per peer address may be open.

:class:`AdmissionProtocol` applies them to each accepted socket: a peer outside the networks
is closed without a byte; a peer over a cap gets ``ERROR Too many connections`` and is closed;
everybody else is upgraded to TLS if configured (after the check, so a refused peer never
sees a TLS handshake either) and handed to the replication protocol, every event then passed
through as is.

Connections that squat the caps must not lock workers out: each admitted connection
holds a :class:`Ticket` that the replication consumer keeps up to date. When a cap is reached,
the newcomer takes the place of the oldest connection still in its handshake (no REPLICATE
yet), or else of the oldest that never sent a PING (Synapse's workers PING at once; a netcat
session does not); that one gets ``ERROR Too many connections`` and is closed. A worker
finishes its handshake within milliseconds, so squatters cannot push it out. And the last
tenth of ``REPLICATION_MAX_CONNECTIONS`` is kept for addresses that hold fewer than a tenth of
``REPLICATION_MAX_CONNECTIONS_PER_ADDRESS``: a few addresses that hold many connections each
cannot take every slot from a new worker host.
"""
from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import socket
import ssl
import time
from typing import Any, Callable, NamedTuple, cast

from django.core.exceptions import ImproperlyConfigured

from streams.conf import repl_setting

logger = logging.getLogger(__name__)

#: Refusals and evictions are logged at most this often per kind, with how many there were:
#: a flood of connections must not become a flood of log lines (each a synchronous write).
LOG_EVERY_SECONDS = 10.0


class ThrottledLog:
    """One warning per kind at most every ``every`` seconds, counting what it held back."""

    def __init__(self, every: float = LOG_EVERY_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.clock = every, clock
        self._last: dict[str, float] = {}
        self._held: collections.Counter[str] = collections.Counter()

    def warning(self, kind: str, message: str, *args: Any) -> bool:
        """Log ``message % args`` now, or count it; True if it was logged."""
        now = self.clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.every:
            self._held[kind] += 1
            return False
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        suffix = f" ({held} more like it in the last {now - last:.0f} s)" if held and last is not None else ""
        logger.warning(message + "%s", *args, suffix)
        return True


_throttled = ThrottledLog()

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Answers of :meth:`PeerPolicy.admit`.
ADMITTED = "admitted"
NOT_ALLOWED = "address not allowed"
TOO_MANY = "too many connections"
TOO_MANY_FROM_ADDRESS = "too many connections from this address"


def parse_networks(text: str) -> list[IPNetwork]:
    """``"127.0.0.0/8, ::1/128"`` → networks; ImproperlyConfigured names a bad entry."""
    networks = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError as e:
            raise ImproperlyConfigured(f"REPLICATION_ALLOWED_NETWORKS: {e}") from None
    return networks


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 zone
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:127.0.0.1 on a dual-stack socket
    return address


class Ticket:
    """One admitted connection as the caps see it: its address, whether it finished its
    handshake and PINGs (kept up to date by the consumer: :meth:`update`), and ``evict``, the
    adapter's way of closing it when a newcomer takes its place."""

    __slots__ = ("host", "handshake_done", "pings", "evict", "released")

    def __init__(self, host: str) -> None:
        self.host = host
        self.handshake_done = False
        self.pings = False
        self.evict: Callable[[], None] | None = None
        self.released = False

    def update(self, *, handshake_done: bool, pings: bool) -> None:
        self.handshake_done = handshake_done
        self.pings = pings

    @property
    def eviction_rank(self) -> int | None:
        """0: still in its handshake; 1: never PINGed; None: a worker, never evicted."""
        if not self.handshake_done:
            return 0
        if not self.pings:
            return 1
        return None


class Admission(NamedTuple):
    """:meth:`PeerPolicy.admit`'s answer: the verdict, the newcomer's ticket when admitted,
    and the connection it displaced (to be closed by the caller), if any."""

    verdict: str
    ticket: Ticket | None = None
    evicted: Ticket | None = None


class PeerPolicy:
    """Allowed networks and connection caps, counting the connections it admitted."""

    def __init__(self, networks: list[IPNetwork], max_connections: int, max_per_address: int) -> None:
        self.networks = networks
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        #: Slots kept for addresses holding fewer than ``small_share`` connections.
        self.reserve = max_connections // 10
        self.small_share = max(1, max_per_address // 10)
        self.open: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.refused: collections.Counter[str] = collections.Counter()
        self.evictions = 0
        self.tickets: dict[Ticket, None] = {}  # admitted, oldest first

    @classmethod
    def from_settings(cls) -> "PeerPolicy":
        return cls(parse_networks(repl_setting("REPLICATION_ALLOWED_NETWORKS")),
                   int(repl_setting("REPLICATION_MAX_CONNECTIONS")),
                   int(repl_setting("REPLICATION_MAX_CONNECTIONS_PER_ADDRESS")))

    def allowed(self, host: str) -> bool:
        try:
            address = _address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def admit(self, host: str) -> Admission:
        """Admitted (and counted until :meth:`release` of its ticket), possibly in place of
        an evicted connection, or the reason for refusing."""
        if not self.allowed(host):
            return self._refuse(NOT_ALLOWED)
        evicted = None
        if self.open[host] >= self.max_per_address:
            evicted = self._evict(host)
            if evicted is None:
                return self._refuse(TOO_MANY_FROM_ADDRESS)
        elif self.total >= self.max_connections:
            evicted = self._evict(None)
            if evicted is None:
                return self._refuse(TOO_MANY)
        elif self.total >= self.max_connections - self.reserve and self.open[host] >= self.small_share:
            evicted = self._evict(host)  # the reserve is for small addresses
            if evicted is None:
                return self._refuse(TOO_MANY)
        ticket = Ticket(host)
        self.tickets[ticket] = None
        self.open[host] += 1
        self.total += 1
        return Admission(ADMITTED, ticket, evicted)

    def _refuse(self, verdict: str) -> Admission:
        self.refused[verdict] += 1
        return Admission(verdict)

    def _evict(self, host: str | None) -> Ticket | None:
        """Release the oldest evictable connection (of ``host``, if given) and return it."""
        best: Ticket | None = None
        for ticket in self.tickets:
            rank = ticket.eviction_rank
            if rank is None or (host is not None and ticket.host != host):
                continue
            if rank == 0:
                best = ticket
                break
            if best is None:
                best = ticket
        if best is not None:
            self.release(best)
            self.evictions += 1
        return best

    def release(self, ticket: Ticket) -> None:
        """The connection is gone (or evicted): its slot is free. Idempotent."""
        if ticket.released:
            return
        ticket.released = True
        self.tickets.pop(ticket, None)
        host = ticket.host
        self.total -= 1
        self.open[host] -= 1
        if self.open[host] <= 0:
            del self.open[host]


class AdmissionProtocol(asyncio.Protocol):
    """Decides on one accepted socket, then passes every event to ``make_protocol()``'s."""

    def __init__(self, policy: PeerPolicy, make_protocol: Callable[[Ticket], asyncio.Protocol],
                 ssl_context: ssl.SSLContext | None = None, send_buffer: int = 0) -> None:
        self.policy = policy
        self.make_protocol = make_protocol
        self.ssl_context = ssl_context
        #: ``REPLICATION_SEND_BUFFER_BYTES``: a fixed kernel send buffer per connection (0:
        #: the kernel's autotuning, which lets a peer that does not read pin up to
        #: ``net.ipv4.tcp_wmem``'s maximum, 4 MiB by default, before our own queue even starts)
        self.send_buffer = send_buffer
        self.inner: asyncio.Protocol | None = None
        self.host: str | None = None
        self.ticket: Ticket | None = None  # set while counted by the policy
        self.upgrade: asyncio.Task[None] | None = None
        #: Data decrypted before the TLS hand-over finished (a client speaks right after its
        #: handshake, maybe in the same packet): delivered first, in order.
        self.early: list[bytes] = []
        self.lost = False

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # a listening socket's protocol is handed a (socket) Transport
        transport = cast(asyncio.Transport, base)
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if peer else "?"
        verdict, ticket, evicted = self.policy.admit(host)
        if verdict == NOT_ALLOWED:
            _throttled.warning(verdict, "replication: refused %s: %s", host, verdict)
            transport.close()  # nothing written: the peer learns nothing about us
            return
        if verdict != ADMITTED:
            _throttled.warning(verdict, "replication: refused %s: %s", host, verdict)
            if self.ssl_context is None:  # (a TLS client could not read it)
                transport.write(b"ERROR Too many connections\n")
            transport.close()
            return
        if evicted is not None:
            _throttled.warning("evicted", "replication: %s took the place of a connection from %s still in its "
                               "handshake or never PINGing", host, evicted.host)
            if evicted.evict is not None:
                evicted.evict()
        assert ticket is not None  # admitted
        self.host, self.ticket = host, ticket
        ticket.evict = transport.abort  # until the replication protocol takes over
        if self.send_buffer > 0:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
        if self.ssl_context is None:
            self._hand_over(transport)
        else:
            transport.pause_reading()
            self.upgrade = asyncio.create_task(self._start_tls(transport))

    async def _start_tls(self, transport: Any) -> None:
        loop = asyncio.get_running_loop()
        assert self.ssl_context is not None  # only a TLS listener upgrades
        try:
            tls_transport = await loop.start_tls(transport, self, self.ssl_context, server_side=True)
        except (OSError, ssl.SSLError, ConnectionError, asyncio.TimeoutError) as e:
            logger.warning("replication: TLS handshake with %s failed: %s", self.host, e)
            transport.abort()
            self._release()
            return
        if tls_transport is None or self.lost:  # the peer went away meanwhile
            self._release()
            return
        self._hand_over(tls_transport)

    def _hand_over(self, transport: asyncio.BaseTransport) -> None:
        assert self.ticket is not None  # set on admission, before any hand-over
        self.inner = self.make_protocol(self.ticket)
        self.inner.connection_made(transport)
        early, self.early = self.early, []
        for data in early:
            self.inner.data_received(data)

    def _release(self) -> None:
        if self.ticket is not None:
            self.policy.release(self.ticket)
            self.ticket = None

    # -- passed through ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)
        else:
            self.early.append(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._release()
        if self.inner is not None:
            self.inner.connection_lost(exc)
