"""Legacy ``REPLICATE <stream> <token>``: facts the relay sends while the backlog is being
read are not skipped: the read (``legacy.HistoryRead``) keeps the live lines above its target
and they follow its POSITION, so the subscriber ends with every fact once."""
from __future__ import annotations

from replication.endpoint import legacy
from replication.protocol.commands import RdataCommand
from replication.protocol.line_batch import WriterRun
from streams.registry import STREAMS
from streams.updates_since import Updates


def _lines(data: bytes) -> list[str]:
    return data.decode().splitlines()


def test_facts_written_during_the_backlog_read_follow_its_position(monkeypatch):
    table = {t: ["!room:hs", "m.read", f"@u{t}:hs", {}] for t in range(1, 6)}

    def fake_updates(spec, writer, current, upto, *, limit, using):
        rows = [(t, r) for t, r in sorted(table.items()) if current < t <= upto][:limit]
        return Updates(rows, rows[-1][0] if len(rows) == limit else upto, len(rows) == limit)

    monkeypatch.setattr(legacy, "get_updates_since", fake_updates)
    read = legacy.HistoryRead("receipts", 0, {"master": 5})
    sent = []
    data = read.read_page(STREAMS["receipts"], "default", limit=2).data
    sent += _lines(data)
    # Meanwhile the writer commits facts 5 (already in the read's range) and 6, and the relay
    # passes them on: the connection is not subscribed yet.
    table[6] = ["!room:hs", "m.read", "@u6:hs", {}]
    data = b"".join((RdataCommand("receipts", "master", t, table[t]).to_line() + "\n").encode() for t in (5, 6))
    read.offer([WriterRun("receipts", "master", 4, 6, data, {"RDATA": 2})])
    while not read.done:
        data = read.read_page(STREAMS["receipts"], "default", limit=2).data
        sent += _lines(data)
    # What LegacyStreamer sends once the read is done: its POSITION, then the kept lines.
    sent += _lines((legacy.LegacyPositionCommand("receipts", read.upto).to_line() + "\n").encode())
    sent += _lines(b"".join(read.buffer))
    tokens = [int(line.split(" ", 3)[2]) for line in sent if line.startswith("RDATA ")]
    assert sent[tokens.index(5) + 1] == "POSITION receipts 5"  # the read's end, then live
    assert tokens == [1, 2, 3, 4, 5, 6]  # 5 once (read), 6 once (kept from the live batch)
    assert read.upto == 5 and read.buffered == 1
