"""The endpoint's operator bookkeeping (pure): line counts and disconnect reasons."""
from replication.endpoint.connection_records import EndpointCounters, disconnect_reason
from replication.protocol.commands import PingCommand, PositionCommand, RdataCommand
from replication.protocol.line_batch import LineBatch, build_lines, counts_of


def test_batches_are_counted_by_their_counts():
    lines = build_lines("events", "w1", 10, 14, [(11, [["ev", ["$a"]], ["state", ["!r"]]]), (12, [["ev", ['POSITION x\n']]])])
    assert [line.split(" ")[0] for line in lines] == ["RDATA", "RDATA", "RDATA", "POSITION"]
    batch = LineBatch.of(lines)
    assert batch.counts == {"RDATA": 3, "POSITION": 1} and batch.count == 4
    counters = EndpointCounters()
    counters.batch_sent(batch.counts)
    counters.batch_sent(batch.counts)  # the same batch to a second connection
    assert (counters.rdata_sent, counters.position_sent) == (6, 2)
    # the embedded scan announces a new writer first: a POSITION that is not last
    counters.batch_sent(counts_of(["POSITION events w2 0 14", "RDATA events w2 15 []"]))
    assert (counters.rdata_sent, counters.position_sent) == (7, 3)


def test_commands_and_legacy_lines_are_counted():
    counters = EndpointCounters()
    counters.commands_sent([PingCommand("1").NAME, PositionCommand("events", "w1", 1, 1).NAME,
                            RdataCommand("events", "w1", 2, []).NAME])
    # a legacy history page: its RDATA are RDATA (the same facts in the older form)
    counters.batch_sent({"RDATA": 500, "POSITION": 1})
    assert (counters.rdata_sent, counters.position_sent, counters.other_sent) == (501, 2, 1)


def test_disconnect_reasons_are_normalised():
    assert disconnect_reason("connection lost: [Errno 104] Connection reset by peer") == "connection lost"
    assert disconnect_reason("ping timeout") == "ping timeout"
    assert disconnect_reason("failed to keep up") == "failed to keep up"
    assert disconnect_reason("bad line") == "bad line"
    assert disconnect_reason("something new") == "something new"
