"""Just enough of the Redis protocol (RESP2) for the hot paths on the Synapse channel.

Every line a writer publishes on ``<server_name>`` reaches every subscriber: each writer and
each endpoint hear all of them, only to answer ``REPLICATE``, and the Redis-following worker
reads them all. Through redis-py's pure-Python parser (and PubSub's message dicts) that cost
more than everything else the cluster does per fact (docs/benchmarks.md). Here:

* a publisher sends a batch of ``PUBLISH`` commands as one write and reads back the integer
  replies (:meth:`RespConnection.publish`);
* a subscriber reads raw chunks (:meth:`RespConnection.read_chunk`) and either searches them
  for the few messages it cares about (:class:`LineSniffer`) or splits them into pub/sub
  messages with :func:`parse_messages`.

URLs (``redis://``, ``rediss://``, ``unix://``, user and password) are read with redis-py's
``parse_url``, so they mean what they mean everywhere else in the project.
"""
from __future__ import annotations

import asyncio
import collections
import ssl
from typing import Any, Iterable

from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url

CRLF = b"\r\n"
#: What one read asks the socket for.
READ_SIZE = 1 << 16
#: :class:`RespConnection`'s ``read_size`` for a subscriber to messages of hundreds of KiB (a
#: writer's batch of lines): a whole message or more may wait unread without the socket's
#: reading being paused and resumed.
LARGE_READ_SIZE = 1 << 22


class RespError(ConnectionError):
    """The connection broke, or Redis answered a command with an error."""


class ReplyError(Exception):
    """An error reply (``-ERR ...``), as a value inside a reply."""


def pack_command(*args: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else b"%d" % arg if isinstance(arg, int) else arg
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def pack_publish(items: Iterable[tuple[bytes, bytes]]) -> bytes:
    """``PUBLISH channel payload`` for each ``(channel, payload)``, as one buffer."""
    return b"".join(b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(c), c, len(p), p)
                    for c, p in items)


def pack_publish_to(channel: bytes, payloads: Iterable[bytes]) -> bytes:
    """``PUBLISH channel payload`` for each payload, as one buffer (the command's head once)."""
    head = b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n" % (len(channel), channel)
    return b"".join([b"%s$%d\r\n%s\r\n" % (head, len(p), p) for p in payloads])


def parse_reply(buf: bytes, pos: int = 0) -> tuple[Any, int] | None:
    """One reply from ``buf[pos:]``: ``(value, end)``, or None if it is not complete yet.

    ``+`` and ``$`` give bytes, ``:`` an int, ``-`` a :class:`ReplyError`, ``*`` a list;
    null bulk strings and arrays give None.
    """
    end = buf.find(CRLF, pos)
    if end < 0:
        return None
    kind, head = buf[pos:pos + 1], buf[pos + 1:end]
    pos = end + 2
    if kind == b"+":
        return head, pos
    if kind == b":":
        return int(head), pos
    if kind == b"-":
        return ReplyError(head.decode(errors="replace")), pos
    if kind == b"$":
        size = int(head)
        if size < 0:
            return None, pos
        if len(buf) < pos + size + 2:
            return None
        return buf[pos:pos + size], pos + size + 2
    if kind == b"*":
        count = int(head)
        if count < 0:
            return None, pos
        items = []
        for _ in range(count):
            parsed = parse_reply(buf, pos)
            if parsed is None:
                return None
            item, pos = parsed
            items.append(item)
        return items, pos
    raise RespError(f"not a RESP2 reply: {buf[pos - len(head) - 3:pos + 20]!r}")


def message_head(channel: bytes) -> bytes:
    """What every pub/sub message of ``channel`` starts with, up to its payload's length."""
    return b"*3\r\n$7\r\nmessage\r\n$%d\r\n%s\r\n$" % (len(channel), channel)


def pending_message(buf: bytes | memoryview, pos: int = 0) -> tuple[int, int] | None:
    """Where the payload of the pub/sub message that starts at ``buf[pos]`` lies: its offset
    from ``pos`` and its size (the message ends 2 bytes after it), once the message's head
    has arrived; None before that, or for anything else than a message. A subscriber to
    large messages gathers the rest before parsing again, instead of parsing (and copying) a
    growing buffer on every read."""
    if bytes(buf[pos:pos + 18]) != b"*3\r\n$7\r\nmessage\r\n$":
        return None
    head = bytes(buf[pos + 18:pos + 18 + 600])  # lengths and the channel's name (short)
    end = head.find(CRLF)
    if end < 0:
        return None
    p = end + 2 + int(head[:end]) + 2  # past the channel
    if head[p:p + 1] != b"$":
        return None
    end = head.find(CRLF, p)
    if end < 0:
        return None
    return 18 + end + 2, int(head[p + 1:end])


def parse_messages(buf: bytes, pos: int = 0, head: bytes | None = None) -> tuple[list[Any], int]:
    """Every complete reply in ``buf[pos:]`` and where the incomplete rest starts.

    Pub/sub messages (``["message", channel, payload]``) come back as their payload (bytes),
    on a fast path; anything else (subscribe confirmations, PONG) as the parsed reply (a list).
    ``head``: :func:`message_head` of the channel most messages come on (a subscriber of one
    channel): those are found with one search less each.
    """
    out: list[Any] = []
    n = len(buf)
    skip = len(head) if head else 0
    while pos < n:
        if head and buf.startswith(head, pos):
            p = pos + skip  # the payload's length
            end = buf.find(CRLF, p)
            if end < 0:
                break
            start = end + 2
            stop = start + int(buf[p:end])
            if stop + 2 > n:
                break
            out.append(buf[start:stop])
            pos = stop + 2
            continue
        if buf.startswith(b"*3\r\n$7\r\nmessage\r\n$", pos):
            # ["message", channel, payload]: two length-prefixed strings follow.
            p = pos + 18  # the channel's length
            end = buf.find(CRLF, p)
            if end < 0:
                break
            p = end + 2 + int(buf[p:end]) + 2  # past the channel
            if p >= n or buf[p:p + 1] != b"$":
                break
            end = buf.find(CRLF, p)
            if end < 0:
                break
            start = end + 2
            stop = start + int(buf[p + 1:end])
            if stop + 2 > n:
                break
            out.append(buf[start:stop])
            pos = stop + 2
            continue
        parsed = parse_reply(buf, pos)
        if parsed is None:
            break
        value, pos = parsed
        out.append(value if isinstance(value, list) else [value])
    return out, pos


class LineSniffer:
    """Picks out of a byte stream the pub/sub messages whose payload starts with one of
    ``prefixes`` (a prefix that ends the payload, like ``b"REPLICATE "``, matches it exactly
    once its terminating CRLF is checked by the caller), without parsing anything else.

    On the wire a message's payload follows the CRLF that ends its length (``$<len>\\r\\n``)
    and ends with a CRLF; we search for ``\\r\\n<prefix>`` (C speed) and take the payload up to
    the next CRLF. Such a match cannot start inside another payload when payloads hold no CR
    or LF, which is true of replication lines (one line each; JSON escapes control
    characters), nor in a channel name (no spaces). Chunk boundaries are handled by keeping
    the tail of the previous chunk (from an incomplete match on, at most ``max_line`` bytes).
    """

    def __init__(self, prefixes: Iterable[bytes], max_line: int = 1 << 16) -> None:
        self.patterns = [CRLF + p for p in prefixes]
        self._keep = max(len(p) for p in self.patterns) - 1
        self.max_line = max_line
        self._tail = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The payloads completed by ``chunk``, in stream order."""
        data = self._tail + chunk if self._tail else chunk
        seen = len(self._tail)  # a match ending here or before was returned already
        found: list[tuple[int, bytes]] = []
        cut = max(0, len(data) - self._keep)
        for pattern in self.patterns:
            i = data.find(pattern)
            while i >= 0:
                end = data.find(CRLF, i + 2)
                if end < 0:
                    cut = min(cut, i)  # incomplete: keep it for the next chunk
                    break
                if end + 2 > seen:
                    found.append((i, data[i + 2:end]))
                i = data.find(pattern, end)
        tail = data[cut:]
        self._tail = tail if len(tail) <= self.max_line else b""
        if len(found) > 1:
            found.sort()
        return [payload for _, payload in found]


class _Inbound(asyncio.Protocol):
    """The socket's side of a :class:`RespConnection`: keeps each received chunk as the
    transport hands it over (no copy into a stream buffer), stops reading the socket while
    more than ``high`` bytes wait, and tells whoever writes when to wait (``drain``)."""

    def __init__(self, high: int) -> None:
        self.high = high
        self.chunks: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.ended = False  # EOF or connection lost: nothing more will arrive
        self.error: BaseException | None = None
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._writing_paused = False
        self._reading_paused = False
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > self.high and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_data(self) -> None:
        """Until something arrived or the connection ended."""
        if self.chunks or self.ended:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take(self) -> bytes:
        """Everything received so far (one chunk as it came, without a copy)."""
        chunks = self.chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.size = 0
        if self._reading_paused and self.transport is not None and not self.ended:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    async def drain(self) -> None:
        if self.ended:
            if self.error is not None:
                raise ConnectionResetError(str(self.error))
            return
        if self._writing_paused:
            self._drain = asyncio.get_running_loop().create_future()
            try:
                await self._drain
            finally:
                self._drain = None


class RespConnection:
    """One connection to Redis, reading into a buffer of its own.

    Each read takes everything that has arrived, as the transport received it (a chunk of up
    to 256 KiB, or several joined). ``read_size``: how much may wait unread before the
    connection stops reading the socket (until the next read); a subscriber to messages of
    hundreds of KiB passes :data:`LARGE_READ_SIZE`. asyncio's stream reader, used before,
    copied every byte twice more (into its buffer, out of it) and, at 64 KiB reads, paused
    and resumed the socket on every such message.
    """

    def __init__(self, transport: asyncio.Transport, inbound: _Inbound, read_size: int = READ_SIZE) -> None:
        self._transport, self._inbound = transport, inbound
        self._buf = b""
        self.read_size = read_size

    @classmethod
    async def open(cls, url: str, timeout: float = 10.0, read_size: int = READ_SIZE) -> "RespConnection":
        kwargs = parse_url(url)
        connection_class = kwargs.get("connection_class")
        loop = asyncio.get_running_loop()

        def inbound() -> _Inbound:
            return _Inbound(2 * read_size)  # the stream reader's: it paused above twice its limit

        try:
            if connection_class is UnixDomainSocketConnection:
                opening = loop.create_unix_connection(inbound, kwargs["path"])
            else:
                context = ssl.create_default_context() if connection_class is SSLConnection else None
                host = kwargs.get("host", "localhost")
                opening = loop.create_connection(inbound, host, kwargs.get("port", 6379), ssl=context,
                                                 server_hostname=host if context is not None else None)
            # asyncio.timeout, not wait_for: no task of its own, and none of the window in
            # which Python 3.11's wait_for can lose a cancellation that races the connection
            # completing (RedisSubscription.run also ends a session that loses one).
            async with asyncio.timeout(timeout):
                transport, protocol = await opening
        except (OSError, TimeoutError) as e:
            raise RespError(f"cannot connect to Redis: {e}") from e
        conn = cls(transport, protocol, read_size)
        if kwargs.get("password"):
            auth = ("AUTH", kwargs["username"], kwargs["password"]) if kwargs.get("username") else (
                "AUTH", kwargs["password"])
            await conn.command(*auth, timeout=timeout)
        return conn

    def write(self, data: bytes) -> None:
        self._transport.write(data)

    async def _fill(self, timeout: float | None) -> None:
        inbound = self._inbound
        if not inbound.chunks and not inbound.ended:
            # asyncio.timeout, not wait_for: no task of its own per read (the hot paths read
            # a few times per batch of lines)
            async with asyncio.timeout(timeout):
                await inbound.wait_data()
        if inbound.chunks:
            data = inbound.take()
            self._buf = self._buf + data if self._buf else data
            return
        if inbound.error is not None:
            raise RespError(f"Redis connection lost: {inbound.error}")
        raise RespError("Redis closed the connection")

    async def read_reply(self, timeout: float | None = None) -> Any:
        """The next reply (raises :class:`RespError` for an error reply, TimeoutError)."""
        while True:
            parsed = parse_reply(self._buf)
            if parsed is not None:
                value, end = parsed
                self._buf = self._buf[end:]
                if isinstance(value, ReplyError):
                    raise RespError(f"Redis: {value}")
                return value
            await self._fill(timeout)

    async def command(self, *args: bytes | str | int, timeout: float | None = None) -> Any:
        self.write(pack_command(*args))
        return await self.read_reply(timeout)

    async def publish(self, items: list[tuple[bytes, bytes]], timeout: float | None = None) -> None:
        """PUBLISH every ``(channel, payload)``, in order, as one write; wait for every reply."""
        await self.publish_packed(pack_publish(items), len(items), timeout)

    async def publish_packed(self, data: bytes, count: int, timeout: float | None = None) -> None:
        """Write ``count`` PUBLISH commands already packed in ``data``; wait for every reply."""
        self.write(data)
        if self._transport.get_write_buffer_size():
            # Only when the socket did not take it all at once: otherwise drain() has nothing
            # to wait for.
            try:
                async with asyncio.timeout(timeout):
                    await self._inbound.drain()
            except TimeoutError:
                raise
            except OSError as e:
                raise RespError(f"Redis connection lost: {e}") from e
        # Each reply to PUBLISH is one line, ":<receivers>" or "-<error>", and nothing else
        # was asked on this connection: count lines, look for errors, keep nothing.
        replies, refused = 0, b""
        while True:
            buf, self._buf = self._buf, b""
            replies += buf.count(b"\n")
            if not refused and (buf.startswith(b"-") or b"\n-" in buf):
                refused = buf[:200]
            if replies >= count:
                break
            await self._fill(timeout)
        if refused:
            raise RespError(f"Redis refused a PUBLISH: {refused!r}")

    async def read_chunk(self, timeout: float | None = None) -> bytes:
        """Whatever has arrived (at least one byte; empty on timeout)."""
        if not self._buf:
            try:
                await self._fill(timeout)
            except TimeoutError:
                return b""
        data, self._buf = self._buf, b""
        return data

    async def close(self) -> None:
        try:
            self._transport.close()
            async with asyncio.timeout(1.0):
                await asyncio.shield(self._inbound.closed)
        except Exception:  # a broken socket: nothing more to do
            pass
