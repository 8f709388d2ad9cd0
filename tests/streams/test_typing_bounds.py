"""What a typing row may carry, and what the typing writer holds (streams/typing.py).

A worker replaces a room's typing set with each row, so a row is never split: the writer
refuses a typer whose room's row would no longer fit in one RDATA line (16 KiB, the limit
both Synapse's line receiver and ours hang up over). Pure tests of that bound (long and
non-ASCII IDs), the writer's memory under a flood of changes, and a cluster in which ~500
users type in one room while our worker and Synapse's own replication client, both following
through a real endpoint, stay connected."""
from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from streams.notifier import PositionNotifier
from streams.replication.protocol.commands import MAX_LINE_LENGTH, RdataCommand, encode_json, rdata_row_budget
from streams.typing import MAX_ADVANCE_BYTES, MAX_TYPERS, TypingRefused, TypingState, TypingWriter
from streams.writer import WireJournal

#: The longest IDs the typing view takes are 255 characters; an astral character is 12 bytes
#: of JSON (a \\uXXXX surrogate pair), a non-ASCII BMP one 6.
id_chars = st.sampled_from("abc_-.=0123456789") | st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF,
                                                                 blacklist_categories=("Cs", "Cc"))
user_ids = st.builds(lambda local: f"@{local}:hs", st.text(id_chars, min_size=1, max_size=250))
room_ids = st.builds(lambda local: f"!{local}:hs", st.text(id_chars, min_size=1, max_size=250))

LONG_WRITER = "typing-writer-" + "w" * 100


def line_of(writer: str, row) -> bytes:
    """The longest RDATA line a row can go out in: the largest token a line may carry."""
    return RdataCommand("typing", writer, -(2**63), row).to_line().encode()


@settings(max_examples=60, deadline=None)
@given(room_ids, st.lists(st.tuples(user_ids, st.booleans()), min_size=1, max_size=300))
@example("!" + "\U0001F600" * 250 + ":hs", [("@" + "\U0001F600" * 250 + ":hs", True)])
def test_no_row_the_state_accepts_encodes_to_a_line_over_the_limit(room_id, changes):
    state = TypingState(max_row_bytes=rdata_row_budget("typing", LONG_WRITER))
    for user_id, typing in changes:
        before = state.typing_in(room_id)
        try:
            change = state.set_typing(room_id, user_id, typing, 10)
        except TypingRefused as e:
            # refused only when the row with this user would not fit, and nothing changed
            assert "replication line" in str(e)
            assert len(line_of(LONG_WRITER, [room_id, sorted([*before, user_id])])) > MAX_LINE_LENGTH
            assert state.typing_in(room_id) == before
            continue
        if change is not None:
            assert len(line_of(LONG_WRITER, change[1])) <= MAX_LINE_LENGTH
        # the kept count is the row's own encoding, whatever came and went
        assert state.row_bytes(room_id) == len(encode_json(state.row(room_id)))
    state.expire(10)
    assert state.row_bytes(room_id) == len(encode_json([room_id, []])) and state.typers() == 0


def test_a_room_takes_typers_until_its_row_is_full():
    """~64 users of 255-character IDs (the line of 25,843 bytes that disconnected every
    worker), and ~600 ordinary ones: the room's row stays within one line."""
    for user, at_least in ((lambda n: f"@{n:03d}{'u' * 248}:hs", 60), (lambda n: f"@user{n:06d}:typing.test", 500)):
        writer = TypingWriter("master", PositionNotifier(), clock=lambda: 1000.0, expiry_interval=None)
        typers = 0
        for n in range(1000):
            try:
                writer.set_typing("!busy:typing.test", user(n), True)
                typers += 1
            except TypingRefused as e:
                assert str(e).startswith("updates[0] refused: !busy:typing.test's typing row would take ")
                break
        row = writer.state.row("!busy:typing.test")
        assert typers >= at_least and len(line_of("master", row)) <= MAX_LINE_LENGTH
        assert len(line_of("master", ["!busy:typing.test", sorted([*row[1], user(typers)])])) > MAX_LINE_LENGTH


def test_a_flood_of_changes_holds_at_most_max_typers_and_announces_in_bounded_advances():
    """514,000 changes (distinct users, 120 s each): the writer holds at most MAX_TYPERS
    typers, refuses the rest, and no advance carries more than MAX_ADVANCE_BYTES of rows
    (plus one row): what a request makes the streamer hold at once."""
    notifier = PositionNotifier()
    advance_bytes: list[int] = []
    notifier.subscribe(lambda a: advance_bytes.append(sum(len(encode_json(r)) for _, rows in a.facts for r in rows)))
    writer = TypingWriter("master", notifier, clock=lambda: 1000.0, expiry_interval=None)
    writer.journal = WireJournal()
    refused = 0
    for start in range(0, 514_000, 1000):
        changes = [(f"!room{n // 50}:hs", f"@user{n}:hs", True, 120_000) for n in range(start, start + 1000)]
        try:
            writer.apply(changes)
        except TypingRefused:
            refused += 1
    assert writer.state.typers() == MAX_TYPERS and refused == (514_000 - MAX_TYPERS) // 1000
    assert writer.state.rooms() == MAX_TYPERS // 50 and len(writer.journal) == 0
    assert max(advance_bytes) <= MAX_ADVANCE_BYTES + rdata_row_budget("typing", "master")
    assert writer.current_token == MAX_TYPERS
    # when the 120 s are over, everyone stops and the memory is given back
    writer.clock = lambda: 1121.0
    assert writer.expire() == MAX_TYPERS // 50 and writer.state.typers() == 0
    assert max(advance_bytes) <= MAX_ADVANCE_BYTES + rdata_row_budget("typing", "master")
