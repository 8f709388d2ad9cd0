"""The streamer's queue: batches of one writer that waited are published as one run."""
from replication.protocol.line_batch import WriterRun, counts_of


def _batch(stream, writer, prev, new, lines, packed=True):
    from replication.publish.streamer import _Batch

    data = b"".join(line + b"\n" for line in lines)
    run = WriterRun(stream, writer, prev, new, data, counts_of([line.decode() for line in lines]))
    return _Batch(run, b"serialized", b"|".join(lines) + b"|" if packed else None)


def test_coalesce_merges_consecutive_batches_of_one_writer_only():
    """A loop that fell behind publishes fewer messages, with the same lines in the same order."""
    from replication.publish.streamer import _coalesce

    a = _batch("events", "w1", 1, 2, [b"RDATA events w1 2 [1]"])
    b = _batch("events", "w1", 2, 4, [b"RDATA events w1 3 [2]", b"POSITION events w1 3 4"])
    c = _batch("receipts", "w1", 7, 8, [b"RDATA receipts w1 8 [3]"])
    d = _batch("events", "w1", 4, 5, [b"RDATA events w1 5 [4]"], packed=False)
    out = _coalesce([a, b, c, d])
    assert [(x.run.stream, x.run.prev, x.run.new) for x in out] == [
        ("events", 1, 4), ("receipts", 7, 8), ("events", 4, 5)]
    merged = out[0]
    assert merged.run.lines() == a.run.lines() + b.run.lines()
    assert merged.run.data == a.run.data + b.run.data
    assert merged.run.count == 3 and merged.run.counts == {"RDATA": 2, "POSITION": 1}
    assert merged.packed == a.packed + b.packed
    assert merged.layer_data is None  # serialized again when sent: the message changed
    assert out[1] is c and out[2] is d
    assert _coalesce([]) == []
