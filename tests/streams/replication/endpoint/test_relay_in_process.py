"""The relay in process: line batches in (as a writer's streamer publishes them), what each
attached connection is handed out -- bytes, counts and the batch's parts -- with no channel
layer, socket or database (the relay is never started)."""
from __future__ import annotations

import asyncio

from streams.replication.endpoint.relay import ReplicationRelay
from streams.replication.protocol.commands import PositionCommand
from streams.replication.protocol.line_batch import WriterRun
from streams.replication.publish.streamer import build_counts, build_lines

ROW = ["!r:hs", "m.read", "@u:hs", "$e", None, {}]


def message(prev: int, new: int, tokens: list[int], stream: str = "receipts", writer: str = "w1") -> dict:
    lines = build_lines(stream, writer, prev, new, [(t, [ROW]) for t in tokens])
    return {"type": "replication.lines", "stream": stream, "writer": writer, "prev": prev, "new": new,
            "data": ("\n".join(lines) + "\n").encode(), "count": len(lines), "counts": build_counts(lines)}


def relay_with_a_connection() -> tuple[ReplicationRelay, list[dict]]:
    relay = ReplicationRelay(poll_interval=3600)
    got: list[dict] = []

    async def deliver(m: dict) -> None:
        got.append(m)

    relay.attach("c1", deliver)
    return relay, got


def test_a_contiguous_batch_is_relayed_whole_with_its_run():
    relay, got = relay_with_a_connection()
    relay.last_sent[("receipts", "w1")] = 5
    m = message(5, 8, [6, 7])
    asyncio.run(relay.on_lines(m))
    (out,) = got
    assert out["data"] == m["data"] and out["counts"] == {"RDATA": 2, "POSITION": 1} and out["seq"] == 1
    assert out["parts"] == (WriterRun("receipts", "w1", 5, 8, m["data"], m["counts"]),)
    assert relay.last_sent[("receipts", "w1")] == 8 and relay.relayed_messages == 1 and relay.repairs == 0


def test_a_batch_after_a_gap_becomes_a_position_for_the_workers_to_catch_up():
    relay, got = relay_with_a_connection()
    relay.last_sent[("receipts", "w1")] = 5
    asyncio.run(relay.on_lines(message(7, 9, [8, 9])))  # (5, 7] never arrived
    (out,) = got
    assert out["data"] == b"POSITION receipts w1 9 9\n" and out["counts"] == {"POSITION": 1}
    assert out["parts"] == (PositionCommand("receipts", "w1", 9, 9),)
    assert relay.repairs == 1 and relay.relayed_messages == 0 and relay.last_sent[("receipts", "w1")] == 9


def test_old_news_and_unknown_streams_are_not_sent():
    relay, got = relay_with_a_connection()
    relay.last_sent[("receipts", "w1")] = 9

    async def go() -> None:
        await relay.on_lines(message(5, 8, [6]))  # at or below what was sent
        await relay.on_lines(message(0, 3, [1], stream="no_such_stream"))

    asyncio.run(go())
    assert got == [] and relay.seq == 0


def test_batches_are_numbered_and_a_detached_connection_gets_none():
    relay, got = relay_with_a_connection()
    relay.last_sent[("receipts", "w1")] = 0

    async def go() -> None:
        await relay.on_lines(message(0, 1, [1]))
        await relay.on_lines(message(1, 2, [2]))
        relay.detach("c1")
        await relay.on_lines(message(2, 3, [3]))

    asyncio.run(go())
    assert [m["seq"] for m in got] == [1, 2] and relay.seq == 3


def test_a_failing_connection_does_not_stop_the_others():
    relay, got = relay_with_a_connection()

    async def broken(m: dict) -> None:
        raise RuntimeError("gone")

    relay.attach("c0", broken)
    relay.last_sent[("receipts", "w1")] = 0
    asyncio.run(relay.on_lines(message(0, 1, [1])))
    assert len(got) == 1
