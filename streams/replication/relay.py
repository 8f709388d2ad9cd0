"""The endpoint side of the sending path: turns "writer W of stream S reached token T" into
RDATA/POSITION lines for every connection of this endpoint. See docs/replication.md.

One relay per endpoint process is the only producer of lines for its connections, so each
connection sees every writer's facts contiguously and in order. It learns of advances from

* the channel layer group ``replication.positions`` (writers in any process publish there,
  see :mod:`streams.replication.publisher`), and
* a poll of ``stream_positions`` every second: a safety net for advances whose message was
  lost (Redis down) and the way writers without a shared channel layer (``write_facts`` in
  another process on the embedded default) are seen,

reads the rows from the database (:func:`streams.updates.get_updates_since`), and sends one
channel-layer message per batch of lines to its connections' group.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from ..registry import STREAMS, get_stream
from ..updates import get_updates_since
from .commands import PositionCommand, RdataCommand, batch_updates

logger = logging.getLogger(__name__)

#: Cluster-wide group where writers announce position advances.
POSITIONS_GROUP = "replication.positions"
#: Channel layer (in this process) through which the relay reaches its connections.
LOCAL_LAYER = "replication_local"
CONNECTIONS_GROUP = "replication.connections"
#: Lines per channel-layer message: one message per batch, never one per fact.
MAX_LINES_PER_MESSAGE = 2000


class ReplicationRelay:
    """Per endpoint: last token sent per (stream, writer), and the single-flight send loop."""

    def __init__(self, *, using: str = "default", poll_interval: float | None = None) -> None:
        from ..conf import repl_setting

        self.using = using
        self.poll_interval = repl_setting("POSITION_POLL_SECONDS") if poll_interval is None else poll_interval
        self.last_sent: dict[tuple[str, str], int] = {}
        self._targets: dict[tuple[str, str], int] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.seq = 0  # number of the last line batch sent to the connections group
        self.facts_relayed = 0
        self.local_layer = get_channel_layer(LOCAL_LAYER)
        self.cluster_layer = get_channel_layer()

    # -- start-up ---------------------------------------------------------------------------

    async def start(self) -> None:
        positions = await sync_to_async(self._load_positions, thread_sensitive=False)()
        self.last_sent.update(positions)
        self._tasks = [
            asyncio.create_task(self._send_loop(), name="relay-send"),
            asyncio.create_task(self._poll_loop(), name="relay-poll"),
            asyncio.create_task(self._listen_loop(), name="relay-listen"),
        ]

    def _load_positions(self) -> dict[tuple[str, str], int]:
        """Where every writer stands now: the relay sends from here on (earlier facts are the
        catch-up's job)."""
        from ..models import StreamPosition
        from ..runtime import runtime

        rt = runtime()
        result: dict[tuple[str, str], int] = {}
        for name, spec in STREAMS.items():
            if not spec.db_backed:
                continue
            gen = rt.generator(name)
            writers = rt.writers.get(name) or ()
            for writer in {*writers, *gen.get_positions()}:
                result[(name, writer)] = self._wire(spec, gen.get_current_token_for_writer(writer))
        for row in StreamPosition.objects.using(self.using).all():
            spec = STREAMS.get(row.stream_name)
            if spec is None or not spec.db_backed:
                continue
            key = (row.stream_name, row.instance_name)
            result[key] = max(result.get(key, 0), self._wire(spec, row.stream_id))
        return result

    @staticmethod
    def _wire(spec: Any, token: int) -> int:
        return -token if spec.backwards else token

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- input ------------------------------------------------------------------------------

    def advanced(self, stream_name: str, instance_name: str, token: int) -> None:
        """Writer ``instance_name`` of ``stream_name`` reached ``token`` (wire sign)."""
        key = (stream_name, instance_name)
        if token > max(self._targets.get(key, 0), self.last_sent.get(key, 0)):
            self._targets[key] = token
            self._wake.set()

    async def _listen_loop(self) -> None:
        layer = self.cluster_layer
        channel = await layer.new_channel()
        await layer.group_add(POSITIONS_GROUP, channel)
        while True:
            message = await layer.receive(channel)
            for stream_name, instance_name, token in message.get("advances", ()):
                if stream_name in STREAMS:
                    self.advanced(stream_name, instance_name, int(token))

    async def _poll_loop(self) -> None:
        from ..models import StreamPosition

        def read() -> list[tuple[str, str, int]]:
            return list(StreamPosition.objects.using(self.using).values_list("stream_name", "instance_name", "stream_id"))

        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                rows = await sync_to_async(read, thread_sensitive=False)()
            except Exception:
                logger.exception("relay: could not poll stream_positions")
                continue
            for stream_name, instance_name, stream_id in rows:
                spec = STREAMS.get(stream_name)
                if spec is not None and spec.db_backed:
                    self.advanced(stream_name, instance_name, self._wire(spec, stream_id))

    # -- output -----------------------------------------------------------------------------

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._targets:
                targets, self._targets = self._targets, {}
                start = {key: self.last_sent.get(key, 0) for key in targets}
                try:
                    lines, reached, count = await sync_to_async(self._build_lines, thread_sensitive=False)(
                        targets, start
                    )
                except Exception:
                    logger.exception("relay: could not read updates; retrying")
                    for key, token in targets.items():
                        self._targets[key] = max(token, self._targets.get(key, 0))
                    await asyncio.sleep(0.5)
                    continue
                # No await between these two: a connection that announces positions (on
                # REPLICATE) either gets these lines or announces positions that cover them.
                self.last_sent.update(reached)
                await self._send(lines)
                self.facts_relayed += count

    def _build_lines(
        self, targets: dict[tuple[str, str], int], start: dict[tuple[str, str], int]
    ) -> tuple[list[str], dict[tuple[str, str], int], int]:
        """RDATA (with ``batch`` tokens) for the rows in (start, target], then POSITION if the
        position moved past the last row. Runs in a worker thread: touches no relay state."""
        lines: list[str] = []
        reached: dict[tuple[str, str], int] = {}
        facts = 0
        for (stream_name, writer), target in targets.items():
            spec = get_stream(stream_name)
            current = start[(stream_name, writer)]
            while current < target:
                result = get_updates_since(spec, writer, current, target, using=self.using)
                if result.updates:
                    for token, row in batch_updates(result.updates):
                        lines.append(RdataCommand(stream_name, writer, token, row).to_line())
                    last_row = result.updates[-1][0]
                    facts += len({t for t, _ in result.updates})
                    if last_row < result.upto_token:
                        lines.append(PositionCommand(stream_name, writer, last_row, result.upto_token).to_line())
                else:
                    lines.append(PositionCommand(stream_name, writer, current, result.upto_token).to_line())
                current = result.upto_token
            reached[(stream_name, writer)] = current
        return lines, reached, facts

    async def _send(self, lines: list[str]) -> None:
        for start in range(0, len(lines), MAX_LINES_PER_MESSAGE):
            chunk = lines[start:start + MAX_LINES_PER_MESSAGE]
            self.seq += 1
            await self.local_layer.group_send(CONNECTIONS_GROUP, {
                "type": "replication.lines",
                "seq": self.seq,
                "data": ("\n".join(chunk) + "\n").encode(),
                "count": len(chunk),
            })

    def positions(self) -> dict[tuple[str, str], int]:
        return dict(self.last_sent)
