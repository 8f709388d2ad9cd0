"""The relay in process: writers' runs in (as the relay reads them off the channel layer), what
each attached connection is handed -- the batch number and the LineBatch, bytes, counts and
parts -- with no channel layer, socket or database (the relay is never started). Its decisions
are RelayPolicy's (test_relay_policy.py); here, that they reach the connections."""
from __future__ import annotations

import asyncio

from replication.endpoint.relay import ReplicationRelay
from replication.protocol.commands import PositionCommand
from replication.protocol.line_batch import LineBatch, WriterRun, encode_run

ROW = ["!r:hs", "m.read", "@u:hs", "$e", None, {}]


def run_of(prev: int, new: int, tokens: list[int], stream: str = "receipts", writer: str = "w1") -> WriterRun:
    return encode_run(stream, writer, prev, new, [(t, [ROW]) for t in tokens])[0]


def relay_with_a_connection() -> tuple[ReplicationRelay, list[tuple[int, LineBatch]]]:
    relay = ReplicationRelay(poll_interval=3600)
    got: list[tuple[int, LineBatch]] = []

    async def deliver(seq: int, batch: LineBatch) -> None:
        got.append((seq, batch))

    relay.attach("c1", deliver)
    return relay, got


def test_a_contiguous_run_is_relayed_whole():
    relay, got = relay_with_a_connection()
    relay.last_sent[("receipts", "w1")] = 5
    run = run_of(5, 8, [6, 7])
    asyncio.run(relay.on_run(run))
    ((seq, out),) = got
    assert seq == 1 and out == LineBatch(run.data, {"RDATA": 2, "POSITION": 1}, (run,))
    assert relay.last_sent[("receipts", "w1")] == 8 and relay.relayed_messages == 1 and relay.repairs == 0


def test_a_run_read_off_the_channel_layer_is_relayed_and_a_bad_message_is_not():
    relay, got = relay_with_a_connection()
    relay.last_sent[("receipts", "w1")] = 5
    run = run_of(5, 8, [6, 7])

    async def go() -> None:
        await relay._on_lines_logged({**run.to_message(), "prev": "five"})  # logged, dropped
        await relay._on_lines_logged(run.to_message())

    asyncio.run(go())
    assert [(seq, batch.parts) for seq, batch in got] == [(1, (run,))]


def test_a_run_after_a_gap_becomes_a_position_for_the_workers_to_catch_up():
    relay, got = relay_with_a_connection()
    relay.last_sent[("receipts", "w1")] = 5
    asyncio.run(relay.on_run(run_of(7, 9, [8, 9])))  # (5, 7] never arrived
    ((_, out),) = got
    assert out.data == b"POSITION receipts w1 9 9\n" and out.counts == {"POSITION": 1}
    assert out.parts == (PositionCommand("receipts", "w1", 9, 9),)
    assert relay.repairs == 1 and relay.relayed_messages == 0 and relay.last_sent[("receipts", "w1")] == 9


def test_old_news_and_unknown_streams_are_not_sent():
    relay, got = relay_with_a_connection()
    relay.last_sent[("receipts", "w1")] = 9

    async def go() -> None:
        await relay.on_run(run_of(5, 8, [6]))  # at or below what was sent
        await relay.on_run(run_of(0, 3, [1], stream="no_such_stream"))

    asyncio.run(go())
    assert got == [] and relay.seq == 0


def test_batches_are_numbered_and_a_detached_connection_gets_none():
    relay, got = relay_with_a_connection()
    relay.last_sent[("receipts", "w1")] = 0

    async def go() -> None:
        await relay.on_run(run_of(0, 1, [1]))
        await relay.on_run(run_of(1, 2, [2]))
        relay.detach("c1")
        await relay.on_run(run_of(2, 3, [3]))

    asyncio.run(go())
    assert [seq for seq, _ in got] == [1, 2] and relay.seq == 3


def test_a_failing_connection_does_not_stop_the_others():
    relay, got = relay_with_a_connection()

    async def broken(seq: int, batch: LineBatch) -> None:
        raise RuntimeError("gone")

    relay.attach("c0", broken)
    relay.last_sent[("receipts", "w1")] = 0
    asyncio.run(relay.on_run(run_of(0, 1, [1])))
    assert len(got) == 1
