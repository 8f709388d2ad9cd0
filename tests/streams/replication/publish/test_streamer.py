"""The streamer's line building (pure): the same lines as the command classes write."""
from hypothesis import given
from hypothesis import strategies as st

from streams.replication.protocol.commands import PositionCommand, RdataCommand, parse_line
from streams.replication.protocol.line_batch import counts_of
from streams.replication.publish.streamer import build_counts, build_lines

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def reference(stream, writer, prev, new, facts):
    """What build_lines must produce, written with the command classes."""
    lines, last = [], None
    for token, rows in facts:
        for i, row in enumerate(rows):
            lines.append(RdataCommand(stream, writer, token if i == len(rows) - 1 else None, row).to_line())
        if rows:
            last = token
    if last is None:
        lines.append(PositionCommand(stream, writer, prev, new).to_line())
    elif last < new:
        lines.append(PositionCommand(stream, writer, last, new).to_line())
    return lines


@given(st.lists(st.lists(st.lists(json_values, max_size=4), max_size=3), max_size=5), st.integers(0, 3))
def test_lines_are_the_command_classes_lines(rows_per_fact, extra):
    facts = [(11 + i, rows) for i, rows in enumerate(rows_per_fact)]
    new = 10 + len(facts) + extra
    lines = build_lines("events", "w1", 10, new, facts)
    assert lines == reference("events", "w1", 10, new, facts)
    assert build_counts(lines) == counts_of(lines)  # what the streamer tells the endpoints
    for line in lines:
        parse_line(line)  # every line parses back


def test_multi_row_fact_and_trailing_position():
    lines = build_lines("receipts", "w2", 4, 8, [(5, [["a"]]), (6, []), (7, [["b"], {"c": 1}])])
    assert lines == [
        'RDATA receipts w2 5 ["a"]',
        'RDATA receipts w2 batch ["b"]',
        'RDATA receipts w2 7 {"c":1}',
        "POSITION receipts w2 7 8",
    ]


def _batch(stream, writer, prev, new, lines, packed=True):
    from streams.replication.publish.streamer import _Batch

    data = b"".join(line + b"\n" for line in lines)
    message = {"type": "replication.lines", "stream": stream, "writer": writer, "prev": prev, "new": new,
               "data": data, "count": len(lines), "counts": counts_of([line.decode() for line in lines])}
    return _Batch(message, list(lines), b"serialized", b"|".join(lines) + b"|" if packed else None)


def test_coalesce_merges_consecutive_batches_of_one_writer_only():
    """A loop that fell behind publishes fewer messages, with the same lines in the same order."""
    from streams.replication.publish.streamer import _coalesce

    a = _batch("events", "w1", 1, 2, [b"RDATA events w1 2 [1]"])
    b = _batch("events", "w1", 2, 4, [b"RDATA events w1 3 [2]", b"POSITION events w1 3 4"])
    c = _batch("receipts", "w1", 7, 8, [b"RDATA receipts w1 8 [3]"])
    d = _batch("events", "w1", 4, 5, [b"RDATA events w1 5 [4]"], packed=False)
    out = _coalesce([a, b, c, d])
    assert [(x.message["stream"], x.message["prev"], x.message["new"]) for x in out] == [
        ("events", 1, 4), ("receipts", 7, 8), ("events", 4, 5)]
    merged = out[0]
    assert merged.lines == a.lines + b.lines
    assert merged.message["data"] == a.message["data"] + b.message["data"]
    assert merged.message["count"] == 3 and merged.message["counts"] == {"RDATA": 2, "POSITION": 1}
    assert merged.packed == a.packed + b.packed
    assert merged.layer_data is None  # serialized again when sent: the message changed
    assert out[1] is c and out[2] is d
    assert _coalesce([]) == []


def test_a_line_over_the_limit_is_kept_back_for_a_position_that_makes_workers_catch_up():
    """No line over MAX_LINE_LENGTH leaves the writer: a peer hangs up on one (Synapse's
    LineOnlyReceiver, ours). The facts before it go as RDATA; from its fact on, a POSITION
    above the workers' token makes each fetch the rest by catch-up."""
    from streams.replication.protocol.commands import MAX_LINE_LENGTH
    from streams.replication.publish.streamer import OversizedLine, fit_lines

    big = "x" * MAX_LINE_LENGTH
    text = build_lines("caches", "w1", 4, 9, [(5, [["a"]]), (6, [["b"], [big], ["c"]]), (7, [["d"]])])
    lines, cut = fit_lines("caches", "w1", 4, 9, [line.encode() for line in text])
    assert [line.decode() for line in lines] == ['RDATA caches w1 5 ["a"]', "POSITION caches w1 6 9"]
    assert cut == OversizedLine(6, len(text[2].encode()))
    # the over-long row is the first line of the batch: nothing but the POSITION
    lines, cut = fit_lines("typing", "w1", 4, 5, [f'RDATA typing w1 5 ["!r",["{big}"]]'.encode()])
    assert lines == [b"POSITION typing w1 5 5"] and cut is not None and cut.token == 5
    # lines that fit are passed on as they are
    fine = [line.encode() for line in build_lines("caches", "w1", 4, 9, [(5, [["a"]])])]
    assert fit_lines("caches", "w1", 4, 9, fine) == (fine, None)


@given(st.lists(st.lists(st.integers(0, 3 * 16384), min_size=1, max_size=3), min_size=1, max_size=6))
def test_fitted_lines_are_within_the_limit_and_a_follower_catches_up_on_what_was_cut(sizes):
    from streams.replication.protocol.commands import MAX_LINE_LENGTH, parse_line
    from streams.replication.publish.streamer import fit_lines

    facts = [(11 + i, [["x" * n] for n in row_sizes]) for i, row_sizes in enumerate(sizes)]
    new = 10 + len(facts)
    lines, cut = fit_lines("caches", "w", 10, new, [line.encode() for line in build_lines("caches", "w", 10, new, facts)])
    assert all(len(line) <= MAX_LINE_LENGTH for line in lines)
    cmds = [parse_line(line.decode()) for line in lines]
    delivered = [c.token for c in cmds if isinstance(c, RdataCommand) and c.token is not None]
    if cut is None:
        assert delivered == [t for t, _ in facts]
    else:
        # every fact before the cut whole; then a POSITION whose prev is above them
        assert delivered == [t for t, _ in facts if t < cut.token]
        assert isinstance(cmds[-1], PositionCommand) and (cmds[-1].prev_token, cmds[-1].new_token) == (cut.token, new)
        rdata = [c for c in cmds if isinstance(c, RdataCommand)]
        assert not rdata or rdata[-1].token is not None  # no batch left open before it
