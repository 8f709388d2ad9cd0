"""The TCP replication endpoint: an asyncio listener that hands each connection to a
:class:`ReplicationConsumer` (scope type ``replication``). See docs/replication.md.

This adapter only moves bytes and applies back-pressure: while the socket's buffers are full
it queues outbound commands, and past :data:`MAX_PENDING_COMMANDS` it writes
``ERROR Failed to keep up`` and closes (the worker catches up when it reconnects). Inbound,
it stops reading the socket while more than :data:`MAX_INBOX_BYTES` received bytes wait for
the consumer, so a peer that sends faster than the endpoint handles its commands waits in
TCP's flow control instead of in the endpoint's memory.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from replication.endpoint.admission import AdmissionProtocol, PeerPolicy
from replication.endpoint.tls import server_context_from_settings
from streams.conf import repl_setting

if TYPE_CHECKING:
    from replication.endpoint.endpoint_record import Endpoint

#: An ASGI application as this adapter runs it: ``app(scope, receive, send)``.
App = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]

logger = logging.getLogger(__name__)

#: The kernel's queue of connections not yet accepted (asyncio's default: 100). Beyond it the
#: kernel drops SYNs and the client retries a second later: a burst of squatters must not
#: make a worker's connect take a second. At least REPLICATION_MAX_CONNECTIONS (the kernel
#: caps it at net.core.somaxconn, 4096).
LISTEN_BACKLOG = 1024
#: Synapse's ``max_line_buffer``: commands queued for a connection that does not read.
MAX_PENDING_COMMANDS = 10_000
ABORT_AFTER_SECONDS = 5.0
#: Received bytes waiting for the consumer before reading pauses (it resumes at half): without
#: it a flood of USER_IP lines the endpoint could not keep up with grew its RSS by 380 MiB in
#: 20 s (benchmarks/bench_user_ips.py --memory).
MAX_INBOX_BYTES = 256 * 1024


class ReplicationServerProtocol(asyncio.Protocol):
    def __init__(self, endpoint: Endpoint, app: App, max_pending: int = MAX_PENDING_COMMANDS,
                 ticket: Any = None) -> None:
        self.endpoint = endpoint
        self.app = app
        self.max_pending = max_pending
        self.transport: asyncio.Transport | None = None
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        #: received bytes in ``inbox``; reading is paused while above MAX_INBOX_BYTES
        self.inbox_bytes = 0
        self.reading_paused = False
        self.paused = False
        #: set while the transport takes writes without queueing (``replication.drain`` waits)
        self.writable = asyncio.Event()
        self.writable.set()
        #: the admission ticket (admission.py): how the caps evict this connection
        self.ticket = ticket
        if ticket is not None:
            ticket.evict = self.evict
        self.pending: collections.deque[bytes] = collections.deque()
        self.pending_commands = 0
        self.closing = False
        self.task: asyncio.Task[None] | None = None
        self.abort_timer: asyncio.TimerHandle | None = None

    # -- socket side ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        host, port = transport.get_extra_info("peername")[:2]
        scope = {"type": "replication", "client": (host, port), "endpoint": self.endpoint, "protocol": self,
                 "admission": self.ticket}
        self.inbox.put_nowait({"type": "replication.connect", "peer": f"{host}:{port}"})
        self.task = asyncio.create_task(self._run(scope))

    async def _run(self, scope: dict[str, Any]) -> None:
        try:
            await self.app(scope, self._receive, self._from_app)
        except Exception:
            logger.exception("replication consumer failed")
        finally:
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.inbox.put_nowait({"type": "replication.receive", "bytes": data})
        self.inbox_bytes += len(data)
        if self.inbox_bytes > MAX_INBOX_BYTES and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    async def _receive(self) -> dict[str, Any]:
        """The consumer's next event; reading resumes once half the inbox is taken."""
        event = await self.inbox.get()
        if event["type"] == "replication.receive":
            self.inbox_bytes -= len(event["bytes"])
            if (self.reading_paused and self.inbox_bytes <= MAX_INBOX_BYTES // 2 and not self.closing
                    and self.transport is not None and not self.transport.is_closing()):
                self.reading_paused = False
                self.transport.resume_reading()
        return event

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.writable.set()  # nobody waits for a connection that is gone
        if self.abort_timer is not None:
            self.abort_timer.cancel()  # aborting a finished transport raises
        # The peer closed its end in order (a worker stopped by SIGTERM, or any process that
        # ended): "shut down"; an error (reset, timeout) is a connection lost.
        reason = "shut down" if exc is None else f"connection lost: {exc}"
        self.inbox.put_nowait({"type": "replication.disconnect", "reason": reason})

    def pause_writing(self) -> None:
        self.paused = True
        self.writable.clear()

    def resume_writing(self) -> None:
        self.paused = False
        self.writable.set()
        if self.pending and self.transport is not None:
            self.transport.write(b"".join(self.pending))
            self.pending.clear()
            self.pending_commands = 0

    # -- consumer side ----------------------------------------------------------------------

    async def _from_app(self, event: dict[str, Any]) -> None:
        if self.closing or self.transport is None:
            return
        kind = event["type"]
        if kind == "replication.send":
            if not self.paused:
                self.transport.write(event["bytes"])
                return
            self.pending.append(event["bytes"])
            self.pending_commands += event.get("count", 1)
            if self.pending_commands > self.max_pending:
                self._drop(b"ERROR Failed to keep up\n", "failed to keep up")
        elif kind == "replication.drain":
            await self.writable.wait()
        elif kind == "replication.close":
            self.closing = True
            if self.pending:
                self.transport.write(b"".join(self.pending))
                self.pending.clear()
            self.transport.close()

    def _drop(self, error_line: bytes, reason: str) -> None:
        """Close at once with ``error_line``, whatever is queued."""
        assert self.transport is not None
        self.closing = True
        self.writable.set()
        self.pending.clear()
        self.transport.write(error_line)
        self.inbox.put_nowait({"type": "replication.disconnect", "reason": reason})
        self.transport.close()
        # A peer that never reads never lets the close finish: reset it soon (unless
        # it has finished by then: connection_lost cancels this).
        self.abort_timer = asyncio.get_running_loop().call_later(ABORT_AFTER_SECONDS, self.transport.abort)

    def evict(self) -> None:
        """A newcomer took this connection's slot (admission.py)."""
        if not self.closing and self.transport is not None:
            self._drop(b"ERROR Too many connections\n", "evicted")


async def serve(endpoint: Endpoint, host: str, port: int, app: App) -> asyncio.AbstractServer:
    """Start listening; connections are served until the returned server is closed. Each is
    handed to ``app`` (the ASGI application: the endpoint's consumer) with ``endpoint``, the
    endpoint's shared state, in its scope.

    Each socket is first admitted (allowed networks, connection caps) and upgraded to TLS if
    configured: :mod:`replication.endpoint.admission`.
    """

    policy, ssl_context = PeerPolicy.from_settings(), server_context_from_settings()
    max_pending = int(repl_setting("REPLICATION_MAX_PENDING_COMMANDS"))
    send_buffer = int(repl_setting("REPLICATION_SEND_BUFFER_BYTES"))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: AdmissionProtocol(policy, lambda ticket: ReplicationServerProtocol(endpoint, app, max_pending, ticket),
                                  ssl_context, send_buffer),
        host, port, backlog=max(LISTEN_BACKLOG, policy.max_connections))
    logger.info("replication endpoint %s listening on %s:%d", endpoint.server_name, host, port)
    return server
