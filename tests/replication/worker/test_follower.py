"""StreamFollower: the receiving rules of docs/replication.md, "The worker" (pure, no I/O)."""
from __future__ import annotations

import logging

from hypothesis import given, settings
from hypothesis import strategies as st

from replication.protocol.commands import PositionCommand, RdataCommand
from replication.worker.follower import (
    RETRY_FIRST_DELAY,
    RETRY_MAX_DELAY,
    Advanced,
    Deliver,
    DeliverRun,
    FetchCatchUp,
    Reset,
    StreamFollower,
)

S, W, W2 = "events", "master", "w2"


def rdata(token, row, stream=S, writer=W):
    return RdataCommand(stream, writer, token, row)


def position(prev, new, stream=S, writer=W):
    return PositionCommand(stream, writer, prev, new)


def connected_follower(current=10, streams=(S, "typing", "caches")):
    """A follower whose stream S is connected with writer W at ``current``."""
    f = StreamFollower("me", streams, {(S, W): current})
    assert f.on_position(position(current, current)) == []
    assert S in f.connected_streams
    return f


# --- gap detection vectors ------------------------------------------------------------------------------


def test_position_prev_equals_current_advances_without_fetch():
    f = connected_follower(10)
    assert f.on_position(position(10, 15)) == [Advanced(S, W, 15)]
    assert f.current_token(S, W) == 15


def test_position_prev_above_current_fetches_the_gap():
    f = connected_follower(10)
    assert f.on_position(position(12, 15)) == [FetchCatchUp(S, W, 10, 15)]
    assert S not in f.connected_streams  # RDATA waits for the catch-up


def test_position_at_or_below_current_is_discarded():
    f = connected_follower(10)
    assert f.on_position(position(5, 8)) == []
    assert f.on_position(position(10, 10)) == []
    assert f.current_token(S, W) == 10


def test_rdata_at_or_below_current_is_discarded():
    f = connected_follower(10)
    assert f.on_rdata(rdata(10, ["old"])) == []
    assert f.on_rdata(rdata(3, ["older"])) == []
    assert f.current_token(S, W) == 10


def test_batch_rows_are_delivered_together():
    f = connected_follower(10)
    assert f.on_rdata(rdata(None, ["r1"])) == []
    assert f.on_rdata(rdata(11, ["r2"])) == [Deliver(S, W, 11, (["r1"], ["r2"]))]


def test_rdata_for_a_stream_not_connected_is_dropped():
    f = StreamFollower("me", [S], {(S, W): 10})
    assert f.on_rdata(rdata(None, ["r0"])) == []
    assert f.on_rdata(rdata(11, ["r1"])) == []
    assert f.current_token(S, W) == 10
    # The POSITION that follows covers the dropped row by a catch-up.
    assert f.on_position(position(11, 11)) == [FetchCatchUp(S, W, 10, 11)]


def test_typing_reset_is_adopted():
    f = StreamFollower("me", ["typing"], {("typing", W): 50})
    f.on_position(position(50, 50, stream="typing"))
    assert f.on_position(position(0, 3, stream="typing")) == [
        Reset("typing", W), Advanced("typing", W, 3)]
    assert f.current_token("typing", W) == 3
    assert f.on_rdata(rdata(4, ["!r", ["@u"]], stream="typing")) == [
        Deliver("typing", W, 4, (["!r", ["@u"]],))]


# --- the rest of the receiving rules -------------------------------------------------------------------


def test_position_between_prev_and_new_advances():
    f = connected_follower(12)
    assert f.on_position(position(10, 15)) == [Advanced(S, W, 15)]


def test_position_below_current_on_a_db_stream_never_moves_back():
    f = StreamFollower("me", [S], {(S, W): 10})
    assert f.on_position(position(5, 8)) == []  # not connected: processed, not discarded
    assert f.current_token(S, W) == 10
    assert S in f.connected_streams


def test_typing_reset_with_rows_before_prev_fetches_from_zero():
    f = StreamFollower("me", ["typing"], {("typing", W): 50})
    assert f.on_position(position(2, 3, stream="typing")) == [
        Reset("typing", W), FetchCatchUp("typing", W, 0, 3)]
    assert f.on_catch_up_page("typing", W, [[1, ["!a", []]], [2, ["!b", ["@u"]]]], 3, False) == [
        Deliver("typing", W, 1, (["!a", []],)), Deliver("typing", W, 2, (["!b", ["@u"]],)),
        Advanced("typing", W, 3)]


def test_typing_position_is_never_discarded_early():
    f = StreamFollower("me", ["typing"], {("typing", W): 5})
    f.on_position(position(5, 5, stream="typing"))
    # The writer restarted and reached 2: rows 1-2 may have been missed, so fetch (0, 2].
    assert f.on_position(position(2, 2, stream="typing")) == [
        Reset("typing", W), FetchCatchUp("typing", W, 0, 2)]


def test_own_echoes_are_ignored():
    f = StreamFollower("me", [S])
    assert f.on_position(position(0, 5, writer="me")) == []
    assert f.on_rdata(rdata(5, ["x"], writer="me")) == []
    assert f.positions() == {}


def test_unknown_stream_is_logged_once_and_ignored(caplog):
    f = connected_follower(10)
    with caplog.at_level(logging.INFO, logger="replication.worker.follower"):
        assert f.on_position(position(1, 5, stream="presence")) == []
        assert f.on_position(position(5, 9, stream="presence")) == []
        assert f.on_rdata(rdata(10, ["@u", "online"], stream="presence")) == []
    assert sum("presence" in r.getMessage() for r in caplog.records) == 1
    assert f.on_rdata(rdata(11, ["x"])) == [Deliver(S, W, 11, (["x"],))]


def test_batches_are_kept_per_writer():
    f = StreamFollower("me", [S], {(S, W): 10, (S, W2): 20})
    f.on_position(position(10, 10))
    f.on_position(position(20, 20, writer=W2))
    assert f.on_rdata(rdata(None, ["a1"])) == []
    assert f.on_rdata(rdata(None, ["b1"], writer=W2)) == []
    # A POSITION of W drops W's half batch only.
    assert f.on_position(position(10, 12)) == [Advanced(S, W, 12)]
    assert f.on_rdata(rdata(21, ["b2"], writer=W2)) == [Deliver(S, W2, 21, (["b1"], ["b2"]))]
    assert f.on_rdata(rdata(13, ["a2"])) == [Deliver(S, W, 13, (["a2"],))]


def test_writers_are_independent():
    f = StreamFollower("me", [S], {(S, W): 10, (S, W2): 3})
    f.on_position(position(10, 10))
    f.on_position(position(3, 3, writer=W2))
    assert f.on_rdata(rdata(4, ["w2 row"], writer=W2)) == [Deliver(S, W2, 4, (["w2 row"],))]
    assert f.positions() == {(S, W): 10, (S, W2): 4}


def test_a_position_connects_only_its_own_writer():
    """After a reconnect, one writer's POSITION says nothing about what we missed from
    another: that writer's RDATA waits for its own POSITION (stricter than Synapse, which
    connects the whole stream and could skip the other writer's lost lines)."""
    f = StreamFollower("me", [S], {(S, W): 10, (S, W2): 3})
    f.on_position(position(10, 10))
    assert f.on_rdata(rdata(9, ["w2 row after lost ones"], writer=W2)) == []
    assert f.on_position(position(9, 9, writer=W2)) == [FetchCatchUp(S, W2, 3, 9)]


# --- catch-up ------------------------------------------------------------------------------


def test_catch_up_pages_while_limited_then_advances_and_connects():
    f = connected_follower(10)
    assert f.on_position(position(12, 20)) == [FetchCatchUp(S, W, 10, 20)]
    page1 = [[11, ["a"]], [11, ["b"]], [13, ["c"]]]
    assert f.on_catch_up_page(S, W, page1, 13, True) == [
        Deliver(S, W, 11, (["a"], ["b"])), Deliver(S, W, 13, (["c"],)), FetchCatchUp(S, W, 13, 20)]
    assert S not in f.connected_streams
    assert f.on_catch_up_page(S, W, [[17, ["d"]]], 20, False) == [
        Deliver(S, W, 17, (["d"],)), Advanced(S, W, 20)]
    assert S in f.connected_streams
    assert f.catching_up() == {}


def test_catch_up_never_delivers_a_token_twice():
    f = connected_follower(10)
    f.on_position(position(12, 20))
    # A server that repeats rows we already have (or sends the lower bound) is harmless.
    assert f.on_catch_up_page(S, W, [[9, ["x"]], [10, ["y"]], [12, ["z"]]], 20, False) == [
        Deliver(S, W, 12, (["z"],)), Advanced(S, W, 20)]


def test_rdata_during_catch_up_waits_and_is_replayed_in_order():
    f = connected_follower(10)
    f.on_position(position(12, 20))
    # Live traffic of the stream arrives while the catch-up is in flight: it waits.
    assert f.on_rdata(rdata(None, ["r21a"])) == []
    assert f.on_rdata(rdata(21, ["r21b"])) == []
    assert f.on_rdata(rdata(22, ["r22"])) == []
    assert f.queued(S) == 3
    # Other streams are not held up.
    f.on_position(position(0, 0, stream="caches"))
    assert f.on_rdata(rdata(1, ["f", None, 0], stream="caches")) == [
        Deliver("caches", W, 1, (["f", None, 0],))]
    assert f.on_catch_up_page(S, W, [[15, ["c"]]], 20, False) == [
        Deliver(S, W, 15, (["c"],)), Advanced(S, W, 20),
        Deliver(S, W, 21, (["r21a"], ["r21b"])), Deliver(S, W, 22, (["r22"],))]
    assert f.queued(S) == 0


def test_position_queued_behind_a_catch_up_can_start_the_next_one():
    f = connected_follower(10)
    f.on_position(position(12, 20))
    assert f.on_position(position(25, 30)) == []
    assert f.on_rdata(rdata(31, ["r31"])) == []
    assert f.on_catch_up_page(S, W, [], 20, False) == [
        Advanced(S, W, 20), FetchCatchUp(S, W, 20, 30)]
    assert f.queued(S) == 1  # r31 waits for the second catch-up
    assert f.on_catch_up_page(S, W, [[26, ["r26"]]], 30, False) == [
        Deliver(S, W, 26, (["r26"],)), Advanced(S, W, 30), Deliver(S, W, 31, (["r31"],))]


def test_failed_catch_up_is_retried_with_back_off():
    f = connected_follower(10)
    f.on_position(position(12, 20))
    delays = [f.catch_up_failed(S, W)[0].delay for _ in range(12)]
    assert delays[:3] == [RETRY_FIRST_DELAY, 2 * RETRY_FIRST_DELAY, 4 * RETRY_FIRST_DELAY]
    assert delays == sorted(delays) and delays[-1] == RETRY_MAX_DELAY
    retry = f.catch_up_failed(S, W)[0]
    assert (retry.from_token, retry.upto_token, retry.attempt) == (10, 20, 13)
    assert f.on_catch_up_page(S, W, [[11, ["a"]]], 20, False) == [
        Deliver(S, W, 11, (["a"],)), Advanced(S, W, 20)]
    assert S in f.connected_streams


def test_limited_page_without_progress_counts_as_a_failure():
    f = connected_follower(10)
    f.on_position(position(12, 20))
    [retry] = f.on_catch_up_page(S, W, [], 10, True)
    assert retry == FetchCatchUp(S, W, 10, 20, RETRY_FIRST_DELAY, 1)


def test_unrequested_pages_and_failures_are_ignored():
    f = connected_follower(10)
    assert f.on_catch_up_page(S, W, [[11, ["a"]]], 11, False) == []
    assert f.catch_up_failed(S, W) == []
    assert f.current_token(S, W) == 10


# --- connections ---------------------------------------------------------------------------


def test_connection_lost_disconnects_every_stream_and_drops_half_batches():
    f = connected_follower(10)
    f.on_rdata(rdata(None, ["half"]))
    f.connection_lost()
    assert f.connected_streams == frozenset()
    assert f.on_rdata(rdata(11, ["x"])) == []  # not connected on the new connection
    assert f.on_position(position(10, 10)) == []
    assert f.on_rdata(rdata(11, ["whole"])) == [Deliver(S, W, 11, (["whole"],))]


def test_catch_up_spanning_a_reconnect_does_not_connect_the_new_connection():
    f = connected_follower(10)
    f.on_position(position(12, 20))
    f.on_rdata(rdata(21, ["lost with the old connection"]))
    f.connection_lost()
    # New connection: the server re-announces; this waits behind the running catch-up.
    assert f.on_position(position(25, 25)) == []
    assert f.on_catch_up_page(S, W, [[15, ["c"]]], 20, False) == [
        Deliver(S, W, 15, (["c"],)), Advanced(S, W, 20), FetchCatchUp(S, W, 20, 25)]
    assert S not in f.connected_streams
    assert f.on_catch_up_page(S, W, [[21, ["r21"]], [24, ["r24"]]], 25, False) == [
        Deliver(S, W, 21, (["r21"],)), Deliver(S, W, 24, (["r24"],)), Advanced(S, W, 25)]
    assert S in f.connected_streams


def test_catch_up_finishing_after_a_reconnect_leaves_the_stream_for_its_new_position():
    f = connected_follower(10)
    f.on_position(position(12, 20))
    f.connection_lost()
    assert f.on_catch_up_page(S, W, [], 20, False) == [Advanced(S, W, 20)]
    assert S not in f.connected_streams
    assert f.on_rdata(rdata(23, ["before its POSITION"])) == []
    assert f.on_position(position(23, 23)) == [FetchCatchUp(S, W, 20, 23)]


# --- a model check: whatever happens, each fact exactly once, in order -----------------------


class _Writer:
    """The truth for one writer: its facts (token -> rows) and what it last announced."""

    def __init__(self, name):
        self.name = name
        self.facts = {}
        self.token = 0
        self.announced = 0


ACTIONS = st.sampled_from(["write", "write_batch", "skip", "drop", "reconnect", "serve", "fail"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(ACTIONS, st.sampled_from([W, W2]), st.integers(1, 3)), max_size=80),
       st.integers(1, 3), st.booleans())
def test_model_every_fact_exactly_once_in_order(actions, page_size, in_runs):
    """``in_runs``: RDATA fed as runs (on_rdata_run, as the workers do), else one by one."""
    writers = {W: _Writer(W), W2: _Writer(W2)}
    f = StreamFollower("me", [S])
    delivered = {W: [], W2: []}
    pending: list[FetchCatchUp] = []
    up = True

    def run(decisions):
        for d in decisions:
            if isinstance(d, Deliver):
                delivered[d.writer].append((d.token, list(d.rows)))
            elif isinstance(d, DeliverRun):
                delivered[d.writer] += [(token, list(rows)) for token, rows in d.facts]
            elif isinstance(d, FetchCatchUp):
                pending.append(d)

    def send(cmds):
        if in_runs and cmds and all(isinstance(c, RdataCommand) for c in cmds):
            run(f.on_rdata_run(S, cmds[0].instance_name, [(c.token, c.row) for c in cmds]))
            return
        for c in cmds:
            run(f.on_rdata(c) if isinstance(c, RdataCommand) else f.on_position(c))

    def announce_all():
        for w in writers.values():
            w.announced = w.token
            send([position(w.token, w.token, writer=w.name)])

    def serve(request):
        w = writers[request.writer]
        tokens = [t for t in sorted(w.facts) if request.from_token < t <= request.upto_token]
        limited = len(tokens) > page_size
        tokens = tokens[:page_size]
        upto = tokens[-1] if limited else request.upto_token
        updates = [[t, row] for t in tokens for row in w.facts[t]]
        run(f.on_catch_up_page(request.stream, request.writer, updates, upto, limited))

    announce_all()
    for action, name, n in actions:
        w = writers[name]
        if action in ("write", "write_batch"):
            w.token += n
            rows = [[name, w.token, i] for i in range(n if action == "write_batch" else 1)]
            w.facts[w.token] = rows
            if up:
                send([rdata(None if i < len(rows) - 1 else w.token, r, writer=name)
                      for i, r in enumerate(rows)])
                w.announced = w.token
        elif action == "skip":  # the position moves with no rows (another writer's IDs)
            w.token += n
            if up:
                send([position(w.announced, w.token, writer=name)])
                w.announced = w.token
        elif action == "drop" and up:
            up = False
            f.connection_lost()
        elif action == "reconnect" and not up:
            up = True
            announce_all()
        elif action == "serve" and pending:
            serve(pending.pop(0))
        elif action == "fail" and pending:
            run(f.catch_up_failed(pending[0].stream, pending[0].writer))
            pending.pop(0)

    if not up:
        announce_all()
    while pending:
        serve(pending.pop(0))
    for name, w in writers.items():
        assert delivered[name] == sorted(w.facts.items()), name
        assert f.current_token(S, name) == w.token


def test_delivered_facts_are_ordinary_frozen_decisions():
    """Deliver is made by filling its slots (per fact): still equal, hashable and immutable."""
    import dataclasses

    import pytest

    f = StreamFollower("me", ["receipts"])
    f.on_position(PositionCommand("receipts", "w1", 0, 0))
    f.on_rdata(RdataCommand("receipts", "w1", None, ["a"]))
    (decision,) = f.on_rdata(RdataCommand("receipts", "w1", 1, ["b"]))
    assert type(decision) is Deliver
    assert decision == Deliver("receipts", "w1", 1, (["a"], ["b"]))
    assert repr(decision) == repr(Deliver("receipts", "w1", 1, (["a"], ["b"])))
    assert hash(f.on_rdata(RdataCommand("receipts", "w1", 2, 5))[0]) == hash(Deliver("receipts", "w1", 2, (5,)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.token = 3  # type: ignore[misc]


_ENTRIES = st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 12)), st.integers(0, 99)), max_size=25)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 6), st.booleans(), st.booleans(), st.lists(_ENTRIES, max_size=4), st.booleans())
def test_a_run_decides_what_its_commands_decide_one_by_one(current, connected, catching_up, runs, other_writer):
    """on_rdata_run against on_rdata for each of its lines: the same facts in the same order
    (stale and duplicate tokens, batch rows, half batches left for the next run), the same
    tokens, and, behind a catch-up, the same commands parked and replayed."""

    def follower():
        f = StreamFollower("me", [S], {(S, W): current})
        if connected:
            f.on_position(position(current, current))
        if catching_up:  # a gap: the POSITION starts a catch-up, and RDATA waits behind it
            f.on_position(position(current + 20, current + 20))
        return f

    def facts(decisions):
        out = []
        for d in decisions:
            if isinstance(d, DeliverRun):
                out += [(d.writer, token, tuple(rows)) for token, rows in d.facts]
            elif isinstance(d, Deliver):
                out.append((d.writer, d.token, d.rows))
        return out

    by_run, one_by_one = follower(), follower()
    got_run, got_one = [], []
    writer = W2 if other_writer else W
    for entries in runs:
        got_run += facts(by_run.on_rdata_run(S, writer, entries))
        for token, row in entries:
            got_one += facts(one_by_one.on_rdata(rdata(token, row, writer=writer)))
        assert got_run == got_one
        assert by_run.positions() == one_by_one.positions()
        assert by_run.queued(S) == one_by_one.queued(S)
    if catching_up:
        page = [[current + 20, "end"]]
        got_run += facts(by_run.on_catch_up_page(S, W, page, current + 20, False))
        got_one += facts(one_by_one.on_catch_up_page(S, W, page, current + 20, False))
        assert got_run == got_one
    # a last fact shows the half batch each kept is the same
    got_run += facts(by_run.on_rdata_run(S, writer, [(100, "last")]))
    got_one += facts(one_by_one.on_rdata(rdata(100, "last", writer=writer)))
    assert got_run == got_one
    assert by_run.positions() == one_by_one.positions()


def test_a_run_is_one_decision_with_its_facts_in_order():
    f = connected_follower(current=10)
    (decision,) = f.on_rdata_run(S, W, [(9, "stale"), (None, "a"), (11, "b"), (11, "dup"), (12, "c"), (None, "d")])
    assert decision == DeliverRun(S, W, [(11, ["a", "b"]), (12, ["c"])])
    assert decision.delivers() == [Deliver(S, W, 11, ("a", "b")), Deliver(S, W, 12, ("c",))]
    assert f.current_token(S, W) == 12
    assert f.on_rdata_run(S, W, [(13, "e")]) == [DeliverRun(S, W, [(13, ["d", "e"])])]  # the half batch kept
    assert f.on_rdata_run(S, "me", [(14, "echo")]) == []  # our own echo
    assert f.on_rdata_run("unknown", W, [(1, "x")]) == []
