"""A writer's run, encoded once (pure): the same lines as the command classes write, the
same channel-layer message as before the run was a value, and no line over the limit."""
from hypothesis import given
from hypothesis import strategies as st

from replication.protocol.commands import PositionCommand, RdataCommand, parse_line
from replication.protocol.line_batch import (
    LineBatch,
    OversizedLine,
    WriterRun,
    build_counts,
    build_lines,
    counts_of,
    encode_run,
    fit_lines,
)

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


def test_a_line_over_the_limit_is_kept_back_for_a_position_that_makes_workers_catch_up():
    """No line over MAX_LINE_LENGTH leaves the writer: a peer hangs up on one (Synapse's
    LineOnlyReceiver, ours). The facts before it go as RDATA; from its fact on, a POSITION
    above the workers' token makes each fetch the rest by catch-up."""
    from replication.protocol.commands import MAX_LINE_LENGTH

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
    from replication.protocol.commands import MAX_LINE_LENGTH, parse_line

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


def test_a_run_is_the_lines_encoded_once_and_its_message_is_the_one_endpoints_always_read():
    facts = [(5, [["a"]]), (6, []), (7, [["b"], {"c": 1}])]
    run, encoded, cut = encode_run("receipts", "w2", 4, 8, facts)
    lines = build_lines("receipts", "w2", 4, 8, facts)
    assert cut is None
    assert run == WriterRun("receipts", "w2", 4, 8, ("\n".join(lines) + "\n").encode(), {"RDATA": 3, "POSITION": 1})
    assert encoded == run.lines() == [line.encode() for line in lines] and run.count == 4
    # the channel-layer message, key for key and in the same order (its serialized bytes
    # are the same as a writer of the previous version published)
    message = run.to_message()
    assert list(message.items()) == [
        ("type", "replication.lines"), ("stream", "receipts"), ("writer", "w2"), ("prev", 4), ("new", 8),
        ("data", run.data), ("count", 4), ("counts", {"RDATA": 3, "POSITION": 1})]
    assert WriterRun.from_message(message) == run
    # a message without counts (an older writer) is counted from its lines
    assert WriterRun.from_message({k: v for k, v in message.items() if k != "counts"}) == run


def test_a_message_that_is_not_a_run_is_refused():
    good = encode_run("receipts", "w", 0, 1, [(1, [["a"]])])[0].to_message()
    for bad in ({**good, "data": "text"}, {**good, "prev": "x"}, {k: v for k, v in good.items() if k != "stream"}):
        try:
            WriterRun.from_message(bad)
        except (KeyError, TypeError, ValueError):
            continue
        raise AssertionError(f"accepted {bad!r}")


def test_consecutive_runs_add_up_to_one_and_runs_of_two_writers_do_not():
    a, _, _ = encode_run("events", "w1", 1, 2, [(2, [[1]])])
    b, _, _ = encode_run("events", "w1", 2, 4, [(3, [[2]])])
    ab = a + b
    assert (ab.prev, ab.new, ab.data, dict(ab.counts)) == (1, 4, a.data + b.data, {"RDATA": 2, "POSITION": 1})
    other, _, _ = encode_run("events", "w2", 4, 5, [(5, [[3]])])
    try:
        ab + other
    except ValueError:
        pass
    else:
        raise AssertionError("runs of two writers added up")


def test_a_batch_of_commands_counts_them_by_name_and_keeps_them_as_its_parts():
    cmds = [PositionCommand("receipts", "w", 3, 3), RdataCommand("receipts", "w", None, ["a"]),
            RdataCommand("receipts", "w", 4, ["b"])]
    batch = LineBatch.of_commands(cmds)
    assert batch.data == "".join(c.to_line() + "\n" for c in cmds).encode()
    assert dict(batch.counts) == {"POSITION": 1, "RDATA": 2} and batch.parts == tuple(cmds)
    run, _, _ = encode_run("receipts", "w", 4, 5, [(5, [["c"]])])
    both = batch + LineBatch.of_run(run)
    assert both.data == batch.data + run.data and both.parts == (*cmds, run) and both.count == 4
    assert LineBatch.of_commands([]) == LineBatch(b"", {})


def test_an_oversized_line_is_kept_back_by_the_run_too():
    from replication.protocol.commands import MAX_LINE_LENGTH

    run, _, cut = encode_run("caches", "w1", 4, 9, [(5, [["a"]]), (6, [["x" * MAX_LINE_LENGTH]]), (7, [["d"]])])
    assert run.data == b'RDATA caches w1 5 ["a"]\nPOSITION caches w1 6 9\n' and cut is not None and cut.token == 6
    assert dict(run.counts) == {"RDATA": 1, "POSITION": 1}
