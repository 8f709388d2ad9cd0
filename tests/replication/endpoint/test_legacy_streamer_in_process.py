"""The legacy streamer in process: ``REPLICATE <stream> <token|NOW>`` from a subscriber that
records what it is sent (the consumer's part, faked), the backing table faked too (the reads'
paging over a real database is test_legacy.py's)."""
from __future__ import annotations

import asyncio

from replication.endpoint import legacy
from replication.endpoint.connection_records import ConnectionInfo
from replication.protocol.commands import Command, LegacyReplicateCommand, RdataCommand
from replication.protocol.line_batch import LineBatch, WriterRun, counts_of
from streams.updates_since import Updates


class Recorder:
    """A connection as the legacy streamer uses it (legacy.Subscriber)."""

    def __init__(self) -> None:
        self.info = ConnectionInfo("c1", "127.0.0.1:1", 0.0)
        self.legacy_reads: dict = {}
        self.lines: list[str] = []
        self.paid = 0
        self.closed_with: str | None = None

    async def send_commands(self, cmds: list[Command]) -> None:
        self.lines += [c.to_line() for c in cmds]

    async def send_lines(self, batch: LineBatch) -> None:
        lines = batch.data.decode().splitlines()
        # what the consumer counts for operators: RDATA and POSITION, as the lines are
        assert batch.counts == counts_of(lines)
        self.lines += lines

    async def writable(self) -> None:
        await asyncio.sleep(0)

    async def pay(self, cost: int) -> None:
        self.paid += cost

    async def error_and_close(self, text: str, *, reason: str) -> None:
        self.closed_with = text


def table(monkeypatch, rows: dict[int, list]) -> None:
    def fake_updates(spec, writer, current, upto, *, limit, using):
        page = [(t, r) for t, r in sorted(rows.items()) if current < t <= upto][:limit]
        return Updates(page, page[-1][0] if len(page) == limit else upto, len(page) == limit)

    monkeypatch.setattr(legacy, "get_updates_since", fake_updates)


def streamer(positions: dict) -> legacy.LegacyStreamer:
    return legacy.LegacyStreamer(lambda: dict(positions), page_rate=1000)


def test_now_answers_the_position_and_goes_live():
    sub = Recorder()
    asyncio.run(streamer({("receipts", "w1"): 7, ("receipts", "w2"): 4}).subscribe(
        sub, LegacyReplicateCommand("receipts", "NOW")))
    assert sub.lines == ["POSITION receipts 7"] and sub.info.legacy_streams == {"receipts": "7"}


def test_an_unknown_stream_is_an_error_line_and_the_connection_stays():
    sub = Recorder()
    asyncio.run(streamer({}).subscribe(sub, LegacyReplicateCommand("nope", "0")))
    assert sub.lines == ["ERROR unknown stream: 'nope'"] and sub.closed_with is None


def test_a_history_read_pages_then_sends_its_position_and_the_live_lines(monkeypatch):
    rows = {t: ["!r:hs", "m.read", f"@u{t}:hs", "$e", None, {}] for t in range(1, 1200)}
    table(monkeypatch, rows)
    sub = Recorder()
    s = streamer({("receipts", "w1"): 1199})

    async def go() -> None:
        await s.subscribe(sub, LegacyReplicateCommand("receipts", "10"))
        read = sub.legacy_reads["receipts"]
        # A live batch arrives while the read runs: kept for after its POSITION.
        live = (RdataCommand("receipts", "w1", 1200, rows[1]).to_line() + "\n").encode()
        read.offer([WriterRun("receipts", "w1", 1199, 1200, live, {"RDATA": 1})])
        await read.task

    asyncio.run(go())
    rdata = [int(line.split(" ")[2]) for line in sub.lines if line.startswith("RDATA ")]
    assert rdata == list(range(11, 1201))  # every row once, in order, the live one last
    assert sub.lines[-2] == "POSITION receipts 1199" and sub.lines[-1].startswith("RDATA receipts 1200 ")
    assert sub.info.legacy_streams == {"receipts": "1199"} and sub.legacy_reads == {}
    assert s.counters["started"] == s.counters["completed"] == 1
    assert s.counters["pages"] == 3 and sub.paid > 0  # 500 rows a page, paid from its budget


def test_a_second_replicate_replaces_the_read(monkeypatch):
    table(monkeypatch, {t: ["!r:hs", "m.read", "@u:hs", "$e", None, {}] for t in range(1, 50)})
    sub = Recorder()
    s = streamer({("receipts", "w1"): 49})

    async def go() -> None:
        await s.subscribe(sub, LegacyReplicateCommand("receipts", "0"))
        first = sub.legacy_reads["receipts"]
        await s.subscribe(sub, LegacyReplicateCommand("receipts", "NOW"))
        await asyncio.gather(first.task, return_exceptions=True)
        assert first.task.cancelled()

    asyncio.run(go())
    assert s.counters["replaced"] == 1 and sub.lines[-1] == "POSITION receipts 49"
