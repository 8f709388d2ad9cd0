"""What a typing row may carry, and what the typing writer holds (replication/typing_stream.py).

A worker replaces a room's typing set with each row, so a row is never split: the writer
refuses a typer whose room's row would no longer fit in one RDATA line (16 KiB, the limit
both Synapse's line receiver and ours hang up over). Pure tests of that bound (long and
non-ASCII IDs), the writer's memory under a flood of changes, and a cluster in which ~500
users type in one room while our worker and Synapse's own replication client, both following
through a real endpoint, stay connected."""
from __future__ import annotations

import time

import pytest
from django.conf import settings as django_settings
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replication.http.typing_changes import send_typing
from replication.protocol.commands import (
    MAX_LINE_LENGTH,
    RdataCommand,
    encode_json,
    parse_line,
    rdata_row_budget,
)
from replication.typing_stream import MAX_ADVANCE_BYTES, MAX_TYPERS, TypingRefused, TypingState, TypingWriter
from streams.notifier import PositionNotifier
from streams.writer import WireJournal
from testing.processes import jsonl_records
from tests.replication.endpoint.test_endpoint import LineClient
from tests.replication.test_typing_stream import SERVER_NAME, WAIT, typing_cluster  # noqa: F401  (the fixture)

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


# -- a cluster: ~500 users typing in one room, our worker and Synapse's client following ------------

@pytest.mark.django_db(transaction=True)
def test_a_room_full_of_typers_disconnects_no_worker_ours_or_synapses(typing_cluster):
    """The web process (typing writer) and a real endpoint on Redis; following it: our
    ``replication_worker`` on ``to_device`` only (every connection gets every stream's lines),
    Synapse 1.163.2's own ``ClientReplicationStreamProtocol`` (testing/synapse_tcp_client.py)
    and a raw socket. 700 users start typing in one room, 100 a request: the room takes them
    while its row fits one line (500 and more), then the writer answers 429 naming the room;
    every line is within 16 KiB, and no follower is disconnected: each still follows after."""
    c = typing_cluster
    raw = LineClient(c.repl_port)
    raw.send("NAME raw", "REPLICATE ")
    worker_jsonl, synapse_jsonl = c.tmp / "worker.jsonl", c.tmp / "synapse_client.jsonl"
    c.start("worker", "manage.py", "replication_worker", "--name", "to-device-worker", "--connect",
            f"127.0.0.1:{c.repl_port}", "--catchup-url", c.web_url, "--server-name", SERVER_NAME,
            "--streams", "to_device", "--jsonl", str(worker_jsonl))
    c.start("synapse_client", "-m", "testing.synapse_tcp_client", "--connect", f"127.0.0.1:{c.repl_port}",
            "--server-name", SERVER_NAME, "--jsonl", str(synapse_jsonl))

    def synapse_records() -> list[dict]:
        return jsonl_records(synapse_jsonl) if synapse_jsonl.exists() else []

    def wait(predicate, what):
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        pytest.fail(f"{what}; Synapse's client: {synapse_records()[-5:]}; "
                    f"its log {(c.tmp / 'synapse_client.log').read_text()[-1500:]}; "
                    f"worker log {(c.tmp / 'worker.log').read_text()[-1500:]}")

    wait(lambda: c.log_count("worker", "replication connected to") == 1
         and any(r["event"] == "connected" for r in synapse_records()), "both followers connected")

    accepted, refusal = 0, None
    for start in range(0, 700, 100):
        changes = [{"room_id": "!busy:test.example", "user_id": f"@user{n:06d}:test.example", "typing": True,
                    "timeout": 120_000} for n in range(start, start + 100)]
        try:
            answer = send_typing(c.web_url, changes, secret=django_settings.REPLICATION_SECRET)
            accepted = answer["stream_id"]
        except RuntimeError as e:
            refusal = str(e)
            accepted = int(refusal.split("updates[", 1)[1].split("]", 1)[0]) + start
            break
    assert refusal is not None and "answered 429" in refusal and "M_LIMIT_EXCEEDED" in refusal
    assert "!busy:test.example's typing row would take" in refusal and "changes before it were applied" in refusal
    assert accepted >= 500

    # every typing line the endpoint sent fits; the last carries every accepted typer
    lines = []
    while not lines or not lines[-1].startswith(f"RDATA typing master {accepted} "):
        line = raw.read_line(WAIT)
        assert line is not None, f"the endpoint closed the raw connection after {lines[-1:]}"
        if " typing " in line:
            lines.append(line)
    assert max(len(line.encode()) for line in lines) <= MAX_LINE_LENGTH
    assert len(parse_line(lines[-1]).row[1]) == accepted

    # Synapse's client took every row, Twisted's line receiver never hung up
    wait(lambda: any(r["event"] == "RDATA" and r["stream"] == "typing" and r["token"] == accepted
                     for r in synapse_records()), f"Synapse's client got typing {accepted}")
    last = [r for r in synapse_records() if r["event"] == "RDATA" and r["stream"] == "typing"][-1]
    assert last["users"] == accepted
    # ...and both still follow: a to_device fact written now reaches our worker
    proc = c.start("write_facts", "manage.py", "write_facts", "to_device", "--count", "1", "--no-progress")
    assert proc.wait(timeout=60) == 0, (c.tmp / "write_facts.log").read_text()[-2000:]
    wait(lambda: worker_jsonl.exists() and any(r["stream"] == "to_device" for r in jsonl_records(worker_jsonl)),
         "our to_device worker got the fact written after the typing")
    wait(lambda: any(r["event"] in ("RDATA", "POSITION") and r["stream"] == "to_device" for r in synapse_records()),
         "Synapse's client got the to_device fact")
    assert not [r for r in synapse_records() if r["event"] in ("lost", "ERROR")]
    assert c.log_count("worker", "replication connected to") == 1
    assert c.log_count("worker", "Line length exceeded") == 0 and c.log_count("endpoint", "Line length exceeded") == 0
    raw.close()
