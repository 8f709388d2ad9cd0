"""Synapse's Redis transport (replication spec §5), for interoperating with Synapse-style
subscribers. See docs/replication.md.

Every command goes out as one PUBLISH on the channel named after the homeserver
(``<server_name>``; ``USER_IP`` on ``<server_name>/USER_IP``), exactly one line, no newline.
A process (re)subscribes, waits until the SUBSCRIBE is confirmed, and only then publishes
``REPLICATE ``; whoever hears a ``REPLICATE`` re-announces its positions with
``POSITION <stream> <writer> <t> <t>``, so a subscriber that missed lines while Redis was
away sees how far every writer got and catches up.

Our own endpoints do not need this channel (they relay through the channel layer); writers
publish their lines here too, and writers and endpoints answer ``REPLICATE``.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable

from .commands import Command, PositionCommand, ReplicateCommand, RemoteProtocolError, UserIpCommand, parse_line

logger = logging.getLogger(__name__)

RECONNECT_FIRST_DELAY = 0.2
#: Synapse caps the subscriber's back-off at 5 s.
RECONNECT_MAX_DELAY = 5.0
#: Ping an idle subscription this often, so a dead socket is noticed (Synapse issue #9010).
IDLE_PING_SECONDS = 5.0
CONFIRM_TIMEOUT = 5.0


def channel_for(server_name: str, line: str) -> str:
    return f"{server_name}/USER_IP" if line.startswith(UserIpCommand.NAME + " ") else server_name


class SynapseRedisBridge:
    """Publishes lines on the Synapse channels and answers ``REPLICATE`` with ``announce()``.

    Runs on the event loop it is started from. ``send_replicate``: publish ``REPLICATE``
    after each (re)subscription (processes that follow the streams need the answers).
    """

    def __init__(self, redis_url: str, server_name: str, *, announce: Callable[[], Iterable[Command]],
                 send_replicate: bool = False) -> None:
        import redis.asyncio as aioredis

        self.server_name = server_name
        self._announce = announce
        self._send_replicate = send_replicate
        self._url = redis_url
        self._publisher = aioredis.from_url(redis_url)
        #: Everything we publish goes out under this lock, one PUBLISH batch after the other,
        #: and an announcement is computed under it too. Otherwise a REPLICATE answer computed
        #: before a batch could reach Redis after it (each takes its own pooled connection):
        #: ``POSITION t t`` after lines above ``t`` connects a subscriber that dropped those
        #: lines (it was waiting for a POSITION) past them, and they are never fetched.
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        #: per (stream, writer): the highest token of lines we failed to publish or dropped
        self._stale: dict[tuple[str, str], int] = {}
        #: writers with a POSITION published on the current subscription
        self._announced: set[tuple[str, str]] = set()
        self.subscribed = asyncio.Event()
        self.published = 0
        self.dropped = 0
        self.resubscriptions = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._subscribe_forever(), name="synapse-redis-bridge")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._publisher.aclose()

    async def publish_batch(self, stream: str, writer: str, prev: int, new: int, lines: list[str]) -> None:
        """Publish one writer's lines for ``(prev, ...]``, keeping subscribers gap-free.

        While we are not subscribed, lines are dropped ("discard and advance", as Synapse's
        streamer does): we re-announce our positions when we subscribe again. After a batch
        of this writer was lost, the next one starts with ``POSITION s w prev prev``, so a
        subscriber that missed the lost lines notices and catches up before taking these.
        """
        key = (stream, writer)
        async with self._lock:
            if not self.subscribed.is_set():
                self._stale[key] = max(new, self._stale.get(key, new))
                self.dropped += len(lines)
                return
            if key in self._stale or key not in self._announced:
                # Subscribers accept a writer's RDATA only after a POSITION for it: a writer
                # not announced on this subscription (new, or its lines were lost) starts with one.
                lines = [PositionCommand(stream, writer, prev, prev).to_line(), *lines]
            if await self.publish_lines(lines):
                self._stale.pop(key, None)
                self._announced.add(key)
            else:
                self._stale[key] = max(new, self._stale.get(key, new))

    async def publish_lines(self, lines: Iterable[str]) -> bool:
        """PUBLISH each line (pipelined, in order); False if Redis could not take them.

        Callers in this class hold ``_lock``; others must not interleave with a writer's
        batches (use it for lines that do not depend on what was published, e.g. USER_IP).
        """
        lines = list(lines)
        if not lines:
            return True
        try:
            pipe = self._publisher.pipeline(transaction=False)
            for line in lines:
                pipe.publish(channel_for(self.server_name, line), line.encode())
            await pipe.execute()
            self.published += len(lines)
            return True
        except Exception as e:  # redis.ConnectionError, OSError, TimeoutError...
            self.dropped += len(lines)
            logger.warning("could not publish %d line(s) on Redis: %s", len(lines), e)
            return False

    async def _subscribe_forever(self) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        delay = RECONNECT_FIRST_DELAY
        while True:
            # No retries: redis-py would otherwise reconnect and SUBSCRIBE again inside a read,
            # silently; we would neither announce our positions again nor know that a
            # REPLICATE published meanwhile went unanswered.
            client = aioredis.from_url(self._url, retry=Retry(NoBackoff(), 0))
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(self.server_name)
                # Wait for the confirmation before anything else (spec §5.3), but not forever:
                # a confirmation lost in a reconnect would otherwise leave us never subscribed.
                deadline = asyncio.get_running_loop().time() + CONFIRM_TIMEOUT
                while True:
                    remaining = deadline - asyncio.get_running_loop().time()
                    if remaining <= 0:
                        raise TimeoutError(f"SUBSCRIBE {self.server_name} not confirmed")
                    message = await pubsub.get_message(timeout=min(remaining, 1.0))
                    if message is not None and message["type"] == "subscribe":
                        break
                self.resubscriptions += 1
                # Say where we stand before anything else (spec §5.3 step 4): whoever
                # missed lines while we were away sees it and catches up.
                async with self._lock:
                    announced = list(self._announce())
                    if not await self.publish_lines([c.to_line() for c in announced]):
                        raise ConnectionError("could not announce positions")
                    # A writer's lines dropped beyond what was announced are not covered:
                    # it stays stale (its next batch starts with a POSITION).
                    self._announced = {(cmd.stream_name, cmd.instance_name) for cmd in announced}
                    for cmd in announced:
                        key = (cmd.stream_name, cmd.instance_name)
                        if self._stale.get(key, 0) <= cmd.new_token:
                            self._stale.pop(key, None)
                    self.subscribed.set()
                if self.resubscriptions > 1:
                    logger.info("Redis subscription to %s back; announced %d position(s)",
                                self.server_name, len(announced))
                delay = RECONNECT_FIRST_DELAY
                if self._send_replicate:
                    await self.publish_lines([ReplicateCommand().to_line()])
                await self._listen(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                logger.warning("Redis subscription to %s lost (%s); retrying in %.1f s", self.server_name, e, delay)
            finally:
                self.subscribed.clear()
                try:
                    await pubsub.aclose()
                    await client.aclose()
                except Exception:
                    pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_DELAY)

    async def _listen(self, pubsub) -> None:
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=IDLE_PING_SECONDS)
            if message is None:
                await pubsub.ping()  # raises if the connection is gone
                continue
            if message["type"] == "message":
                await self._on_command(message["data"])

    async def _on_command(self, data: bytes) -> None:
        """One line heard on the channel: answer ``REPLICATE``, ignore the rest."""
        try:
            cmd = parse_line(data.decode())
        except (RemoteProtocolError, UnicodeDecodeError) as e:
            logger.warning("dropping malformed line on %s: %s", self.server_name, e)
            return
        if isinstance(cmd, ReplicateCommand):
            async with self._lock:
                await self.publish_lines([c.to_line() for c in self._announce()])
