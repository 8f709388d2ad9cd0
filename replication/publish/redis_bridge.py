"""Synapse's Redis transport (``synapse/replication/tcp/redis.py``), for interoperating with Synapse-style
subscribers. See docs/replication.md.

Every command goes out as one PUBLISH on the channel named after the homeserver
(``<server_name>``; ``USER_IP`` on ``<server_name>/USER_IP``), exactly one line, no newline.
A process (re)subscribes, waits until the SUBSCRIBE is confirmed, and only then publishes
``REPLICATE ``; whoever hears a ``REPLICATE`` re-announces its positions with
``POSITION <stream> <writer> <t> <t>``, so a subscriber that missed lines while Redis was
away sees how far every writer got and catches up.

Our own endpoints do not need this channel for facts (they relay through the channel layer);
writers publish their lines here too, and writers and endpoints answer ``REPLICATE``. Both
hear every line of every writer for that; they talk RESP through :mod:`.resp` (raw bytes
searched for the few messages that matter; batches of PUBLISH in one write), not redis-py,
which costs more per line than the rest of the cluster (docs/benchmarks.md). The
subscription itself (subscribe, confirm, ping, back-off) is :mod:`.redis_session`'s, shared
with the Redis worker.

An endpoint's bridge also picks ``REMOTE_SERVER_UP`` and ``LOCK_RELEASED`` off the channel
(``on_command``) for its TCP workers, except its own publications coming back
(broadcast.py says why that is exactly once per worker).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Awaitable, Callable, Iterable

from replication.protocol.commands import (
    Command,
    LockReleasedCommand,
    PositionCommand,
    RemoteServerUpCommand,
    ReplicateCommand,
    UserIpCommand,
)
from replication.protocol.line_batch import WriterRun
from replication.protocol.redis_session import CONFIRM_TIMEOUT, RedisSubscription, SubscriptionPolicy
from replication.protocol.resp import LineSniffer, RespConnection, RespError, pack_publish, pack_publish_to

logger = logging.getLogger(__name__)

#: Connecting, and each batch of PUBLISH replies, must take no longer than this.
REPLY_TIMEOUT = CONFIRM_TIMEOUT
REPLICATE_LINE = ReplicateCommand().to_line().encode()
_USER_IP_PREFIX = (UserIpCommand.NAME + " ").encode()
#: Commands every worker of the cluster must hear (broadcast.py), picked off the channel for
#: an endpoint's TCP workers.
CLUSTER_COMMAND_PREFIXES = (RemoteServerUpCommand.NAME.encode() + b" ", LockReleasedCommand.NAME.encode() + b" ")
#: How long a command we published waits for its echo (Redis delivers it back to our own
#: subscription in milliseconds; one that never comes, because the subscription was being
#: renewed, is forgotten after this), and how many may wait.
ECHO_WINDOW = 10.0
MAX_ECHOES = 10_000
#: The bridge reads the channel only to find REPLICATE and the cluster's commands: it lets
#: what arrives within this long come in as one chunk (``RedisSubscription.read_pause``).
#: Answers wait at most this much longer; a writer's streamer thread and an endpoint were
#: woken several times per batch of lines otherwise, and once per batch with 5 ms: at the
#: cluster's rates (a batch every 3-10 ms) a wake-up after idling costs more CPU than the
#: search of the bytes it brings (docs/benchmarks.md, bench_cluster). 25 ms
#: gathers several batches per wake-up; a REPLICATE is still answered well within what any
#: worker waits for (seconds).
READ_PAUSE = 0.025


def redis_channel(server_name: str, line: bytes) -> bytes:
    """The Synapse channel a line goes out on: ``<server_name>/USER_IP`` for ``USER_IP``
    (only Synapse's main process subscribes to it), ``<server_name>`` for everything else."""
    return f"{server_name}/USER_IP".encode() if line.startswith(_USER_IP_PREFIX) else server_name.encode()


class SynapseRedisBridge:
    """Publishes lines on the Synapse channels and answers ``REPLICATE`` with ``announce()``.

    Runs on the event loop it is started from. ``send_replicate``: publish ``REPLICATE``
    after each (re)subscription (processes that follow the streams need the answers).
    ``volunteer_every``: also publish, this often, every position of ``announce()`` that
    changed since it was last published (endpoints, for writers that went still: a writer
    that exits right after its last lines reached Redis cannot answer a subscriber that
    missed them and sends ``REPLICATE`` a moment later). ``on_command(line)``: called (and
    awaited) with every ``REMOTE_SERVER_UP`` / ``LOCK_RELEASED`` line heard on the channel
    that this bridge did not publish itself (:meth:`publish_command_lines`).
    """

    def __init__(self, redis_url: str, server_name: str, *, announce: Callable[[], Iterable[Command]],
                 send_replicate: bool = False, volunteer_every: float | None = None,
                 on_command: Callable[[str], Awaitable[None]] | None = None,
                 policy: SubscriptionPolicy = SubscriptionPolicy(), read_pause: float = READ_PAUSE,
                 role: str = "writer") -> None:
        """``role``: whose bridge this is (a process may hold a writer's and an endpoint's),
        named in its log lines."""
        self.server_name = server_name
        self._channel = server_name.encode()
        self._announce = announce
        self._send_replicate = send_replicate
        self.url = redis_url
        self._publisher: RespConnection | None = None
        #: Everything we publish goes out under this lock, one PUBLISH batch after the other,
        #: and an announcement is computed under it too. Otherwise a REPLICATE answer computed
        #: before a batch could reach Redis after it: ``POSITION t t`` after lines above ``t``
        #: connects a subscriber that dropped those lines (it was waiting for a POSITION)
        #: past them, and they are never fetched.
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._volunteer_task: asyncio.Task | None = None
        #: per (stream, writer): the highest token of lines we failed to publish or dropped
        self._stale: dict[tuple[str, str], int] = {}
        #: writers with a POSITION published on the current subscription
        self._announced: set[tuple[str, str]] = set()
        self._volunteer_every = volunteer_every
        #: per (stream, writer): the token last published for it on the current subscription
        self._told: dict[tuple[str, str], int] = {}
        self._on_command = on_command
        self._prefixes = [REPLICATE_LINE, *(CLUSTER_COMMAND_PREFIXES if on_command is not None else ())]
        self._sniffer = LineSniffer(self._prefixes)
        #: commands we published whose echo has not come back yet: line -> when, oldest first
        self._echoes: collections.deque[tuple[float, bytes]] = collections.deque()
        self._subscription = RedisSubscription(
            redis_url, [self._channel], on_subscribed=self._on_subscribed, on_chunk=self._on_chunk,
            on_lost=self._on_lost, policy=policy, name=f"Redis subscription to {server_name} ({role})",
            read_pause=read_pause)
        self.subscribed = asyncio.Event()
        self.published = 0
        self.dropped = 0
        self.resubscriptions = 0
        self.replicates_answered = 0
        self.commands_heard = 0
        self.own_echoes = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._subscription.run(), name="synapse-redis-bridge")
        if self._volunteer_every:
            self._volunteer_task = asyncio.create_task(self._volunteer_forever(), name="synapse-redis-volunteer")

    async def stop(self) -> None:
        self._stopping = True
        self._subscription.stop()
        for task in (self._task, self._volunteer_task):
            # Python 3.11's asyncio.wait_for can swallow a cancellation that races with the
            # awaited read completing; the loops also check _stopping, and the cancel repeats.
            while task is not None and not task.done():
                task.cancel()
                await asyncio.wait([task], timeout=1.0)
        if self._publisher is not None:
            await self._publisher.close()
            self._publisher = None

    def pack_lines(self, lines: Iterable[bytes]) -> bytes:
        """``PUBLISH <server_name> <line>`` for each line, as :meth:`publish_run` takes them
        (pure: a writer's thread packs its batch before handing it over)."""
        return pack_publish_to(self._channel, lines)

    async def publish_run(self, run: WriterRun, packed: bytes | None = None,
                          also: bytes = b"", also_count: int = 0) -> bool:
        """Publish one writer's run, line by line, keeping subscribers gap-free.

        While we are not subscribed, lines are dropped ("discard and advance", as Synapse's
        streamer does): we re-announce our positions when we subscribe again. After a run
        of this writer was lost, the next one starts with ``POSITION s w prev prev``, so a
        subscriber that missed the lost lines notices and catches up before taking these.
        ``packed``: the run's lines already packed by :meth:`pack_lines` (else they are packed here).

        ``also``: ``also_count`` other PUBLISH commands (on other channels: the streamer's
        channel-layer message) to send in the same write, so that a batch costs one write and
        one wait for replies. Returns whether they reached Redis: not while we are not
        subscribed (then nothing is sent) or when the write failed.
        """
        stream, writer, prev, new = run.stream, run.writer, run.prev, run.new
        key = (stream, writer)
        async with self._lock:
            count = run.count
            if not self.subscribed.is_set():
                self._stale[key] = max(new, self._stale.get(key, new))
                self.dropped += count
                return False
            if packed is None:
                packed = self.pack_lines(run.lines())
            if key in self._stale or key not in self._announced:
                # Subscribers accept a writer's RDATA only after a POSITION for it: a writer
                # not announced on this subscription (new, or its lines were lost) starts with one.
                packed = self.pack_lines([PositionCommand(stream, writer, prev, prev).to_line().encode()]) + packed
                count += 1
            if await self.publish_packed(also + packed if also else packed, count + also_count, also_count):
                self._stale.pop(key, None)
                self._announced.add(key)
                return True
            self._stale[key] = max(new, self._stale.get(key, new))
            return False

    async def publish_lines(self, lines: Iterable[str | bytes]) -> bool:
        """PUBLISH each line on its own channel (``USER_IP`` has one of its own), in one write,
        in order; False if Redis could not take them.

        Callers in this class hold ``_lock``; others must not interleave with a writer's
        batches (use it for lines that do not depend on what was published, e.g. USER_IP).
        """
        items = []
        for line in lines:
            data = line.encode() if isinstance(line, str) else line
            items.append((redis_channel(self.server_name, data), data))
        if not items:
            return True
        return await self.publish_packed(pack_publish(items), len(items))

    async def publish_packed(self, packed: bytes, count: int, others: int = 0) -> bool:
        """:meth:`publish_lines` for ``count`` PUBLISH commands packed by :meth:`pack_lines`,
        ``others`` of them not lines of the Synapse channel (not counted as published or
        dropped lines)."""
        try:
            if self._publisher is None:
                self._publisher = await RespConnection.open(self.url, REPLY_TIMEOUT)
            await self._publisher.publish_packed(packed, count, timeout=REPLY_TIMEOUT)
            self.published += count - others
            return True
        except (RespError, OSError, TimeoutError) as e:
            if self._publisher is not None:
                await self._publisher.close()
                self._publisher = None
            self.dropped += count - others
            logger.warning("could not publish %d line(s) on Redis: %s", count - others, e)
            return False

    async def settle(self, timeout: float) -> bool:
        """Before the process exits: wait until every line we dropped or failed to publish is
        covered by an announcement on a live subscription (at most ``timeout`` seconds).

        A writer that exits right after a Redis restart would otherwise leave subscribers
        that missed its last lines with nobody to tell them (endpoints answer for writers
        that are gone, but only to a later ``REPLICATE``). Returns False on timeout.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self.subscribed.is_set() and self._stale:
                async with self._lock:
                    announced = list(self._announce())
                    if await self.publish_lines([c.to_line() for c in announced]):
                        for cmd in announced:
                            key = (cmd.stream_name, cmd.instance_name)
                            if self._stale.get(key, 0) <= cmd.new_token:
                                self._stale.pop(key, None)
            if self.subscribed.is_set() and not self._stale:
                return True
            if loop.time() >= deadline:
                logger.warning("exiting with positions of %s unannounced on Redis",
                               ", ".join(f"{s}/{w}" for s, w in sorted(self._stale)) or "this writer")
                return False
            await asyncio.sleep(0.05)

    async def publish_command_lines(self, lines: Iterable[str | bytes]) -> bool:
        """Publish lines that are not a writer's (``REMOTE_SERVER_UP``, ``LOCK_RELEASED``,
        ``USER_IP``...), in order with everything else this bridge publishes. Their echo on
        our own subscription is not handed to ``on_command``."""
        data = [line.encode() if isinstance(line, str) else line for line in lines]
        async with self._lock:
            # Expected before the PUBLISH: the echo can arrive before its reply is read.
            now = time.monotonic()
            for line in data:
                self._expect_echo(now, line)
            if await self.publish_lines(data):
                return True
            for line in data:  # not published: nothing will come back
                self._forget_echo(line)
            return False

    def _expect_echo(self, now: float, line: bytes) -> None:
        echoes = self._echoes
        while echoes and (now - echoes[0][0] > ECHO_WINDOW or len(echoes) >= MAX_ECHOES):
            echoes.popleft()
        echoes.append((now, line))

    def _forget_echo(self, line: bytes) -> bool:
        """Drop one expected echo of ``line``; whether there was one (not yet expired)."""
        now = time.monotonic()
        for i, (when, sent) in enumerate(self._echoes):
            if sent == line and now - when <= ECHO_WINDOW:
                del self._echoes[i]
                return True
        return False

    async def answer_replicate(self) -> None:
        """Someone (re)subscribed: say where every writer we speak for stands."""
        async with self._lock:
            self.replicates_answered += 1
            announced = list(self._announce())
            if await self.publish_lines([c.to_line() for c in announced]):
                self._told.update(((c.stream_name, c.instance_name), c.new_token) for c in announced)

    async def _volunteer_forever(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._volunteer_every)
            if not self.subscribed.is_set():
                continue
            async with self._lock:
                changed = [c for c in self._announce()
                           if self._told.get((c.stream_name, c.instance_name)) != c.new_token]
                if changed and await self.publish_lines([c.to_line() for c in changed]):
                    self._told.update(((c.stream_name, c.instance_name), c.new_token) for c in changed)

    async def _on_subscribed(self) -> None:
        """Subscribed (again): say where we stand before anything else (docs/replication.md,
        "Redis, as Synapse speaks it"),
        so whoever missed lines while we were away sees it and catches up."""
        self._sniffer = LineSniffer(self._prefixes)  # nothing of the old connection is pending
        self.resubscriptions += 1
        async with self._lock:
            announced = list(self._announce())
            if not await self.publish_lines([c.to_line() for c in announced]):
                raise RespError("could not announce positions")
            # A writer's lines dropped beyond what was announced are not covered:
            # it stays stale (its next batch starts with a POSITION).
            self._announced = {(cmd.stream_name, cmd.instance_name) for cmd in announced}
            self._told = {(cmd.stream_name, cmd.instance_name): cmd.new_token for cmd in announced}
            for cmd in announced:
                key = (cmd.stream_name, cmd.instance_name)
                if self._stale.get(key, 0) <= cmd.new_token:
                    self._stale.pop(key, None)
            self.subscribed.set()
        if self.resubscriptions > 1:
            # (the subscription itself says once that it is back)
            logger.debug("Redis subscription to %s back; announced %d position(s)",
                        self.server_name, len(announced))
        if self._send_replicate:
            async with self._lock:
                await self.publish_lines([REPLICATE_LINE])

    def _on_lost(self, reason: str | None) -> None:
        self.subscribed.clear()
        # What we published is echoed on a live subscription only: whatever did not come
        # back on this one never will.
        self._echoes.clear()

    async def _on_chunk(self, chunk: bytes) -> None:
        """Answer REPLICATE (once a chunk: every answer is the same); hand the cluster's
        commands published by others to ``on_command``. No other line is parsed."""
        payloads = self._sniffer.feed(chunk)
        if not payloads:
            return
        replicate = False
        for payload in payloads:
            if payload == REPLICATE_LINE:
                replicate = True
            elif payload.startswith(self._prefixes[0]):
                continue  # an older generation's REPLICATE <stream> <token>: not ours to answer
            elif self._forget_echo(payload):
                self.own_echoes += 1
            else:
                self.commands_heard += 1
                try:
                    await self._on_command(payload.decode("utf-8", errors="replace"))
                except Exception:
                    logger.exception("handling %r heard on Redis failed", payload[:100])
        if replicate:
            await self.answer_replicate()
