"""The streamer's line building (pure): the same lines as the command classes write."""
from hypothesis import given
from hypothesis import strategies as st

from streams.replication.commands import PositionCommand, RdataCommand, parse_line
from streams.replication.streamer import build_lines

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
