"""The endpoint's operator bookkeeping (pure): line counts and disconnect reasons."""
from streams.replication.commands import PingCommand, PositionCommand, RdataCommand
from streams.replication.connections import EndpointCounters, disconnect_reason
from streams.replication.streamer import build_lines


def test_relayed_batches_are_counted_by_command():
    lines = build_lines("events", "w1", 10, 14, [(11, [["ev", ["$a"]], ["state", ["!r"]]]), (12, [["ev", ['POSITION x\n']]])])
    assert [line.split(" ")[0] for line in lines] == ["RDATA", "RDATA", "RDATA", "POSITION"]
    message = {"data": ("\n".join(lines) + "\n").encode(), "count": len(lines)}
    counters = EndpointCounters()
    counters.lines_sent(message)
    counters.lines_sent(message)  # the same batch to a second connection
    assert (counters.rdata_sent, counters.position_sent) == (6, 2)
    rows_only = build_lines("events", "w1", 10, 11, [(11, [["ev", ["$a"]]])])
    counters.lines_sent({"data": ("\n".join(rows_only) + "\n").encode(), "count": len(rows_only)})
    assert (counters.rdata_sent, counters.position_sent) == (7, 2)


def test_a_rolled_back_fact_is_one_position():
    lines = build_lines("events", "w1", 10, 12, [])
    counters = EndpointCounters()
    counters.lines_sent({"data": ("\n".join(lines) + "\n").encode(), "count": len(lines)})
    assert (counters.rdata_sent, counters.position_sent) == (0, 1)


def test_a_batch_that_starts_with_position():
    message = {"data": b"POSITION events w1 3 3\nPOSITION receipts w1 5 5\n", "count": 2}
    counters = EndpointCounters()
    counters.lines_sent(message)
    assert (counters.rdata_sent, counters.position_sent) == (0, 2)


def test_commands_and_legacy_lines_are_counted():
    counters = EndpointCounters()
    counters.commands_sent([PingCommand("1").NAME, PositionCommand("events", "w1", 1, 1).NAME,
                            RdataCommand("events", "w1", 2, []).NAME])
    counters.lines_sent({"data": b"events 1 []\n", "count": 1}, legacy=True)
    assert (counters.rdata_sent, counters.position_sent, counters.other_sent) == (1, 1, 2)


def test_disconnect_reasons_are_normalised():
    assert disconnect_reason("connection lost: [Errno 104] Connection reset by peer") == "connection lost"
    assert disconnect_reason("ping timeout") == "ping timeout"
    assert disconnect_reason("failed to keep up") == "failed to keep up"
    assert disconnect_reason("bad line") == "bad line"
    assert disconnect_reason("something new") == "something new"
