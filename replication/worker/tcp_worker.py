"""The worker over TCP: one session with a replication endpoint (``runreplication``) at a
time (docs/replication.md, "The protocol core" and "The worker").

A session sends ``NAME``, ``PING`` and ``REPLICATE``, then checks that the server's
``SERVER`` line names the server it expects (else ``ERROR Wrong remote`` and close). The
connection state machine decides the keepalive: a PING after 5 s without sending, give up 25 s
after the peer's last command once it has sent a PING. RDATA and POSITION go to the follower
(:class:`~.base.BaseReplicationWorker`), a read's worth at a time.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from replication.protocol.commands import (
    Command,
    ErrorCommand,
    NameCommand,
    PingCommand,
    RdataRun,
    RemoteProtocolError,
    ReplicateCommand,
    ServerCommand,
)
from replication.protocol.connection import CLOSED, ReplicationConnection
from replication.worker.worker_core import BaseReplicationWorker

logger = logging.getLogger(__name__)

#: How often the keepalive wakes up, to send PINGs and check the timeout. Well under the
#: PING interval so a PING is never more than this late.
TICK = 0.5
#: At most this much is taken from the socket's buffer per read. Not more: a worker behind by
#: 256 KiB reads cost it 50 % more per fact than 64 KiB ones (the chunk, its lines and their
#: rows no longer fit in the core's cache; bench_worker).
READ_SIZE = 1 << 16
CONNECT_TIMEOUT = 10.0


class _WrongRemote(Exception):
    pass


class ReplicationWorker(BaseReplicationWorker):
    """Follows the streams of one replication endpoint (``runreplication``) over TCP."""

    transport = "tcp"

    def __init__(self, *, host: str, port: int, ssl: Any = None, **kwargs: Any) -> None:
        """``ssl``: an ``ssl.SSLContext`` to speak TLS, verifying the server (``tls.py``)."""
        super().__init__(**kwargs)
        self.host, self.port = host, port
        self.ssl = ssl
        self._transport: asyncio.StreamWriter | None = None

    def _interrupt(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def _attempt(self, delay: float) -> bool:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl), CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as e:
            logger.warning("cannot connect to replication at %s:%s: %s; retrying in %.1fs",
                           self.host, self.port, e, delay)
            return False
        self._transport = writer
        accepted = False
        try:
            accepted = await self._session(reader, writer)
        except _WrongRemote:
            pass
        except (OSError, ConnectionError) as e:
            logger.warning("replication connection failed: %s", e)
        finally:
            self._transport = None
            self.connected = False
            self.follower.connection_lost()
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ConnectionError):
                pass
        if not self._stopping:
            logger.info("replication connection to %s:%s closed; reconnecting in %.1fs",
                        self.host, self.port, self._first_delay if accepted else delay)
        return accepted

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One connection, until it closes. Returns whether the server was accepted."""
        now = self._clock()
        conn = ReplicationConnection("client", now=now)
        writer.write(conn.send_many(
            [NameCommand(self.name), PingCommand(self._ping_body()), ReplicateCommand()], now))
        accepted = False
        # PINGs and the server's silence are looked after by a task of their own, every TICK,
        # not by a timeout around each read: a read is one await, with no task and no timer
        # of its own (a read per batch of lines; each cost the worker ~0.5 us a fact in the
        # cluster: docs/benchmarks.md).
        keepalive = asyncio.create_task(self._keepalive(conn, writer))
        try:
            while not self._stopping:
                try:
                    # A read's worth of commands at once (the hot path), in order.
                    events = conn.next_batch(now)
                    if events:
                        accepted = await self._take(conn, writer, events, accepted)
                        # Let the lanes deliver before the next read: a read of what is
                        # already buffered returns without yielding, and a worker behind by
                        # thousands of lines would otherwise queue them all first (2.2 -> 5.2
                        # us/fact in bench_worker).
                        await asyncio.sleep(0)
                        continue
                    event = conn.next_event(now)  # no complete line left: NEED_DATA or CLOSED
                except RemoteProtocolError as e:
                    logger.error("replication protocol error from server: %s", e.error_text)
                    await self._send_error(conn, writer, e.error_text)
                    return accepted
                if event is CLOSED:
                    return accepted
                conn.receive_data(await reader.read(READ_SIZE))  # b"" at EOF: CLOSED next
                now = self._clock()
        finally:
            keepalive.cancel()
        return accepted

    async def _keepalive(self, conn: ReplicationConnection, writer: asyncio.StreamWriter) -> None:
        """Every TICK: a PING when one is due; give up on a server silent for too long
        (closing our end ends the session's read)."""
        while True:
            await asyncio.sleep(TICK)
            now = self._clock()
            if conn.timed_out(now):
                logger.warning("replication server sent nothing for too long; reconnecting")
                self._counters["ping_timeouts"] += 1
                await self._send_error(conn, writer, "ping timeout")
                writer.close()
                return
            if conn.ping_due(now):
                writer.write(conn.send(PingCommand(self._ping_body()), now))

    async def _take(self, conn: ReplicationConnection, writer: asyncio.StreamWriter,
                    events: list[Command | RdataRun], accepted: bool) -> bool:
        """Act on received commands, in order; returns whether the server is accepted.

        Runs of commands other than SERVER, ERROR and PING go to the follower together
        (:meth:`_dispatch_many`).
        """
        run: list[Command | RdataRun] = []
        for event in events:
            kind = type(event)
            if kind is not ServerCommand and kind is not ErrorCommand and kind is not PingCommand:
                run.append(event)
                continue
            if run:
                self._dispatch_many(run)
                run = []
            if kind is ServerCommand:
                if event.data != self.server_name:
                    logger.error("replication server is %r, expected %r: Wrong remote",
                                 event.data, self.server_name)
                    self._counters["wrong_remote"] += 1
                    await self._send_error(conn, writer, "Wrong remote")
                    raise _WrongRemote(event.data)
                accepted = self.connected = True
                self._counters["connections"] += 1
                logger.info("replication connected to %s at %s:%s as %s", event.data,
                            self.host, self.port, self.name)
            elif kind is ErrorCommand:
                logger.warning("replication server reported an error: %s", event.data)
        if run:
            self._dispatch_many(run)
        return accepted

    async def _send_error(self, conn: ReplicationConnection, writer: asyncio.StreamWriter,
                          text: str) -> None:
        writer.write(conn.send(ErrorCommand(text), self._clock()))
        try:
            await asyncio.wait_for(writer.drain(), 1.0)
        except (OSError, ConnectionError, TimeoutError):
            pass

    @staticmethod
    def _ping_body() -> str:
        return str(int(time.time() * 1000))
