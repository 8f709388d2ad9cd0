"""The legacy rewrite (``legacy_rewrite.to_legacy``) reads what a batch is -- writer runs and
commands -- not its bytes: it must send exactly what parsing every line would, for runs
skipped whole, rewritten whole, or straddling the subscriber's token."""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from replication.protocol.commands import (
    LegacyPositionCommand,
    LegacyRdataCommand,
    PositionCommand,
    RdataCommand,
    parse_line,
)
from replication.protocol.legacy_rewrite import to_legacy
from replication.protocol.line_batch import WriterRun, build_counts, build_lines, counts_of
from testing.legacy_reference import rewrite_by_parsing

by_parsing = rewrite_by_parsing  # the reference: every line parsed back


def run_of(stream: str, writer: str, prev: int, facts: list[tuple[int, list[list]]], new: int) -> WriterRun:
    lines = build_lines(stream, writer, prev, new, facts)
    return WriterRun(stream, writer, prev, new, ("\n".join(lines) + "\n").encode(), build_counts(lines))


def coalesced(a: WriterRun, b: WriterRun) -> WriterRun:
    """Two advances of one writer as the streamer merges them when its loop falls behind."""
    counts = {k: a.counts.get(k, 0) + b.counts.get(k, 0) for k in {*a.counts, *b.counts}}
    return WriterRun(a.stream, a.writer, a.prev, b.new, a.data + b.data, counts)


@st.composite
def runs(draw, stream: str, writer: str):
    prev = draw(st.integers(0, 20))
    tokens = sorted(draw(st.sets(st.integers(prev + 1, prev + 15), max_size=6)))
    facts = [(t, [[f"!r{t}:hs", "m.read", f"@u{i}:hs", "$e", None, {"n": i}]
                  for i in range(draw(st.integers(1, 3)))]) for t in tokens]
    new = draw(st.integers(max([prev + 1, *tokens]), prev + 20))
    return run_of(stream, writer, prev, facts, new)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(runs("receipts", "master"), runs("receipts", "w2"), runs("events", "master")),
                min_size=1, max_size=4),
       st.integers(0, 40), st.booleans(), st.booleans())
def test_same_lines_as_parsing_every_line(parts, done, with_events, merge):
    if merge and len(parts) >= 2 and (parts[0].stream, parts[0].writer) == (parts[1].stream, parts[1].writer) \
            and parts[1].prev >= parts[0].new:
        parts = [coalesced(parts[0], parts[1]), *parts[2:]]
    subscribed = {"receipts": str(done), **({"events": str(done // 2)} if with_events else {})}
    batch = to_legacy(parts, subscribed)
    expected = by_parsing(b"".join(p.data for p in parts), subscribed)
    assert batch.data.decode().splitlines() == expected
    assert dict(batch.counts) == counts_of(expected)


def test_commands_of_the_embedded_scan_keep_a_fact_whole():
    parts = [PositionCommand("events", "w1", 0, 3),
             RdataCommand("events", "w1", None, ["a"]), RdataCommand("events", "w1", 4, ["b"]),
             RdataCommand("events", "w1", None, ["c"]), RdataCommand("events", "w1", 6, ["d"]),
             RdataCommand("receipts", "w1", 7, ["x"])]
    batch = to_legacy(parts, {"events": "4"})
    assert batch.data.decode().splitlines() == ['RDATA events batch ["c"]', 'RDATA events 6 ["d"]']
    assert to_legacy(parts, {"events": "0"}).data.decode().splitlines() == [
        "POSITION events 3", 'RDATA events batch ["a"]', 'RDATA events 4 ["b"]',
        'RDATA events batch ["c"]', 'RDATA events 6 ["d"]']


def test_a_stream_not_subscribed_is_skipped_whole():
    run = run_of("events", "master", 0, [(t, [["ev", []]]) for t in range(1, 50)], 50)
    assert to_legacy([run], {"receipts": "0"}).data == b""
    rng = random.Random(1)
    assert to_legacy([run], {"events": str(rng.randint(50, 99))}).count == 0  # all at or below
