"""The embedded endpoint's database scan (local_scan.py): the safe bound, the lines it sends,
and the relay reading rows another "process" committed under the same writer name."""
from __future__ import annotations

import asyncio
import random

import pytest

from replication.endpoint.local_scan import SCAN_PAGE_TOKENS, ScanState, safe_bounds
from replication.protocol.commands import PositionCommand, RdataCommand, parse_line
from streams.registry import STREAMS


def test_safe_bound_stops_below_the_lowest_live_reservation():
    alive = {10: True, 11: False}.get
    bounds = safe_bounds({"receipts": 20, "caches": 7, "events": 5},
                         [("receipts", [15, 16], 10), ("receipts", [12], 11), ("caches", [8], 10)],
                         alive=alive)
    # 12's process is dead (its SQLite transaction rolled back); 15 is in flight.
    assert bounds == {"receipts": 14, "caches": 7, "events": 5}


def test_commands_in_token_order_with_batches_and_a_first_position_for_new_writers():
    state = ScanState(scanned={"events": 10}, last_sent={("events", "master"): 9})
    rows = [("master", 11, ["e11"]), ("other", 12, ["e12a"]), ("other", 12, ["e12b"]), ("master", 13, ["e13"])]
    cmds = state.commands(STREAMS["events"], 10, 20, rows)
    assert [parse_line(c.to_line()) for c in cmds] == cmds  # what goes on the wire
    assert cmds[1] == PositionCommand("events", "other", 0, 10)  # before its first RDATA
    rdata = [cmds[0], *cmds[2:]]
    assert all(isinstance(c, RdataCommand) for c in rdata)
    assert [(c.instance_name, c.token, c.row) for c in rdata] == [
        ("master", 11, ["e11"]), ("other", None, ["e12a"]), ("other", 12, ["e12b"]), ("master", 13, ["e13"])]
    assert state.scanned["events"] == 20
    assert state.last_sent == {("events", "master"): 13, ("events", "other"): 12}
    # Rows at or below what was sent (announced at start-up) are not sent again.
    assert state.commands(STREAMS["events"], 20, 30, [("master", 13, ["again"])]) == []


def test_ranges_are_paged():
    state = ScanState(scanned={"receipts": 5})
    assert state.next_range("receipts", 5) is None
    assert state.next_range("receipts", 5 + 3 * SCAN_PAGE_TOKENS) == (5, 5 + SCAN_PAGE_TOKENS)


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_relay_sends_rows_of_two_writers_sharing_a_name_without_a_gap():
    """Two runtimes named ``master`` on one SQLite database (the service and write_facts in
    another shell): the relay sends every row of both, in order, once, and never past an ID
    still reserved."""
    from replication.endpoint.relay import ReplicationRelay
    from streams.conf import stream_writers
    from streams.models import Receipt
    from streams.runtime import StreamRuntime

    rng = random.Random(3)
    one = StreamRuntime(instance_name="master", writers=stream_writers(""), using="sqlite")
    two = StreamRuntime(instance_name="master", writers=stream_writers(""), using="sqlite")
    sent: list[str] = []

    async def run() -> None:
        relay = ReplicationRelay(using="sqlite", local_scan=True)
        relay.scan_interval = 3600  # scanned by hand below
        await relay.start()

        async def deliver(seq, batch):
            sent.extend(batch.data.decode().splitlines())
        relay.attach("c", deliver)
        write = lambda rt, n: rt.writer("receipts").append(  # noqa: E731
            [[(Receipt, Receipt.synthetic(rng, i))] for i in range(n)])
        await asyncio.to_thread(write, one, 2)
        # `two` reserves an ID and has not committed yet: nothing past it may go out.
        gen = await asyncio.to_thread(lambda: two.writer("receipts").generator)
        held = gen.get_next_mult(1)
        held_ids = await asyncio.to_thread(held.__enter__)
        await asyncio.to_thread(write, one, 2)
        await relay.scan_once()
        before = [parse_line(line).token for line in sent if line.startswith("RDATA")]
        await asyncio.to_thread(held.__exit__, None, None, None)  # completes with no rows
        await asyncio.to_thread(write, two, 3)
        await relay.scan_once()
        await relay.stop()
        assert held_ids[0] not in before and all(t < held_ids[0] for t in before)

    try:
        asyncio.run(run())
    finally:
        one.close()
        two.close()
    tokens = [parse_line(line).token for line in sent if line.startswith("RDATA")]
    written = sorted(Receipt.objects.using("sqlite").values_list("stream_id", flat=True))
    assert tokens == written and len(written) == 7


def test_scan_mode_relays_in_memory_streams_and_only_wakes_for_database_ones():
    from replication.endpoint.relay import ReplicationRelay
    from replication.protocol.line_batch import WriterRun

    relay = ReplicationRelay(local_scan=True)
    got: list[bytes] = []

    async def deliver(seq, batch):
        got.append(batch.data)

    async def run() -> None:
        relay.attach("c", deliver)
        relay.last_sent[("typing", "master")] = 3
        await relay.on_run(WriterRun("typing", "master", 3, 4, b'RDATA typing master 4 ["!r:x",["@a:x"]]\n',
                                     {"RDATA": 1}))
        await relay.on_run(WriterRun("receipts", "master", 3, 4, b"RDATA receipts master 4 []\n", {"RDATA": 1}))

    asyncio.run(run())
    assert got == [b'RDATA typing master 4 ["!r:x",["@a:x"]]\n']
    assert relay._scan_wake.is_set()


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_start_up_positions_keep_events_and_backfill_apart():
    """events and backfill share the events table (backfill IDs negative): each writer's
    start-up token is its last of the stream it wrote, in wire sign (both positive)."""
    from replication.endpoint.local_scan import read_bounds, read_initial_writers
    from rooms.models import Event
    from streams.conf import stream_writers
    from streams.runtime import StreamRuntime

    rng = random.Random(5)
    rt = StreamRuntime(instance_name="master", writers=stream_writers(""), using="sqlite")
    try:
        backfill = rt.writer("backfill").append([[(Event, Event.synthetic(rng, 10 + i))] for i in range(4)])
        only_backfill = read_initial_writers(read_bounds("sqlite"), "sqlite")
        events = rt.writer("events").append([[(Event, Event.synthetic(rng, i))] for i in range(3)])
    finally:
        rt.close()
    assert ("events", "master") not in only_backfill  # its backfill rows are not events
    assert only_backfill[("backfill", "master")] == -min(backfill)
    bounds = read_bounds("sqlite")
    assert bounds["events"] == max(events) and bounds["backfill"] == -min(backfill)
    tokens = read_initial_writers(bounds, "sqlite")
    assert tokens[("events", "master")] == max(events)
    assert tokens[("backfill", "master")] == -min(backfill) > 0


def test_a_fact_with_a_line_over_the_limit_goes_as_a_position_workers_catch_up_from():
    """The embedded scan never sends a line over MAX_LINE_LENGTH (a peer hangs up on it):
    such a fact becomes POSITION s w t t, above what a worker has, and the RDATA after it
    goes on as usual."""
    from replication.endpoint.local_scan import fit_commands
    from replication.protocol.commands import MAX_LINE_LENGTH

    big = "é" * (MAX_LINE_LENGTH // 2)  # 8192 characters, 6 bytes of JSON each
    cmds = [RdataCommand("caches", "w1", 5, ["a"]), RdataCommand("caches", "w1", None, ["b"]),
            RdataCommand("caches", "w1", 6, [big]), RdataCommand("caches", "w1", 7, ["c"])]
    fitted, lines, cut = fit_commands(cmds, [c.to_line() for c in cmds])
    assert cut == [6] and lines == [c.to_line() for c in fitted]
    assert fitted == [cmds[0], PositionCommand("caches", "w1", 6, 6), cmds[3]]
    fine = cmds[:1] + cmds[3:]
    assert fit_commands(fine, [c.to_line() for c in fine]) == (fine, [c.to_line() for c in fine], [])
