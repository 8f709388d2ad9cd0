"""Legacy ``REPLICATE <stream> <token>``: facts the relay sends while the backlog is being
read must not be skipped (the connection is not subscribed yet, so those live lines are
dropped; the backlog must then reach past them)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from streams.replication import legacy
from streams.replication.commands import LegacyPositionCommand, LegacyRdataCommand, LegacyReplicateCommand
from streams.updates import Updates


def test_facts_written_during_the_backlog_read_are_sent(monkeypatch):
    table = {t: [f"row{t}"] for t in range(1, 6)}
    positions = {("receipts", "master"): 5}
    reads: list[tuple[int, int]] = []

    def fake_updates(spec, writer, current, upto, *, limit, using):
        reads.append((current, upto))
        if len(reads) == 1:
            # Meanwhile the writer commits fact 6 and the relay sends it on: this connection
            # is not subscribed yet, so that live line is dropped.
            table[6] = ["row6"]
            positions[("receipts", "master")] = 6
        return Updates([(t, r) for t, r in sorted(table.items()) if current < t <= upto], upto, False)

    monkeypatch.setattr(legacy, "get_updates_since", fake_updates)
    sent = []

    async def send(cmds):
        sent.extend(cmds)

    consumer = SimpleNamespace(info=SimpleNamespace(legacy_streams={}), _send=send)
    endpoint = SimpleNamespace(relay=SimpleNamespace(positions=lambda: dict(positions)))
    streamer = legacy.LegacyStreamer(endpoint)
    asyncio.run(streamer.subscribe(consumer, LegacyReplicateCommand("receipts", "0")))
    tokens = [c.token for c in sent if isinstance(c, LegacyRdataCommand)]
    assert tokens == [1, 2, 3, 4, 5, 6]
    assert sent[-1] == LegacyPositionCommand("receipts", 6)
    assert consumer.info.legacy_streams == {"receipts": "6"}
