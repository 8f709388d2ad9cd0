"""The older protocol generation (``REPLICATE <stream|ALL> <token|NOW>``, RDATA without a
writer name): a connection that subscribes this way is streamed from its token, read from
the backing tables, then live, in that format. See docs/replication.md.

Netcat users get a working session::

    $ nc 127.0.0.1 9092
    SERVER localhost
    PING 1700000000000
    REPLICATE receipts 0
    RDATA receipts 2 ["!room1:localhost","m.read",...]
    POSITION receipts 2
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from ..registry import STREAMS
from ..updates import get_updates_since
from .commands import (
    Command,
    ErrorCommand,
    LegacyPositionCommand,
    LegacyRdataCommand,
    LegacyReplicateCommand,
    PositionCommand,
    RdataCommand,
    batch_updates,
    parse_line,
)

if TYPE_CHECKING:
    from .consumer import ReplicationConsumer
    from .endpoint import Endpoint

logger = logging.getLogger(__name__)


class LegacyStreamer:
    def __init__(self, endpoint: "Endpoint", *, using: str = "default") -> None:
        self.endpoint = endpoint
        self.using = using

    async def subscribe(self, consumer: "ReplicationConsumer", cmd: LegacyReplicateCommand) -> None:
        names = [n for n, s in STREAMS.items() if s.db_backed] if cmd.stream_name == "ALL" else [cmd.stream_name]
        spec = STREAMS.get(cmd.stream_name)
        if cmd.stream_name != "ALL" and (spec is None or not spec.db_backed):
            await consumer._send([ErrorCommand(f"unknown stream: {cmd.stream_name}")])
            return
        for name in names:
            out: list[Command] = []
            read_upto: dict[str, int] = {}
            while True:
                # Live lines are passed on only once the stream is subscribed (below): whatever
                # the relay sent while the backlog was being read is read again here, until
                # nothing moved (no await between the last look and the subscription).
                writers = {w: t for (s, w), t in self.endpoint.relay.positions().items() if s == name}
                if cmd.token == "NOW":
                    break
                start = int(cmd.token)
                todo = {w: (read_upto.get(w, start), t) for w, t in writers.items() if t > read_upto.get(w, start)}
                if not todo:
                    break
                updates = await sync_to_async(self._read, thread_sensitive=False)(name, todo)
                out.extend(LegacyRdataCommand(name, token, row) for token, row in batch_updates(updates))
                read_upto.update({w: t for w, (_, t) in todo.items()})
            upto = max(writers.values(), default=0)
            consumer.info.legacy_streams[name] = str(upto)
            out.append(LegacyPositionCommand(name, upto))
            await consumer._send(out)

    def _read(self, name: str, ranges: dict[str, tuple[int, int]]) -> list[tuple[int, Any]]:
        """Every writer's rows in its (from, upto], merged by token."""
        spec = STREAMS[name]
        rows: list[tuple[int, Any]] = []
        for writer, (current, upto) in ranges.items():
            while current < upto:
                result = get_updates_since(spec, writer, current, upto, limit=1000, using=self.using)
                rows.extend(result.updates)
                current = result.upto_token
        rows.sort(key=lambda item: item[0])
        return rows


def to_legacy(data: bytes, subscribed: dict[str, str]) -> tuple[bytes, int]:
    """Rewrite a batch of modern lines for a legacy subscriber: only its streams, above the
    token it was caught up to, without writer names."""
    out: list[str] = []
    batch: dict[str, list[str]] = {}  # `batch` rows wait for the token that ends their fact
    for line in data.decode().splitlines():
        cmd = parse_line(line)
        stream = getattr(cmd, "stream_name", None)
        if stream not in subscribed:
            continue
        done = int(subscribed[stream])
        if isinstance(cmd, RdataCommand):
            rows = batch.setdefault(stream, [])
            rows.append(LegacyRdataCommand(stream, cmd.token, cmd.row).to_line())
            if cmd.token is not None:
                if cmd.token > done:
                    out.extend(rows)
                rows.clear()
        elif isinstance(cmd, PositionCommand) and cmd.new_token > done:
            out.append(LegacyPositionCommand(stream, cmd.new_token).to_line())
    if not out:
        return b"", 0
    return ("\n".join(out) + "\n").encode(), len(out)
