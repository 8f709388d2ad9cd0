"""The relay's decisions by value (RelayPolicy is pure: runs and polls in, with ``now``; the
batch for the connections out), as test_follower.py tests the worker's."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from replication.endpoint.relay_policy import Decision, RelayPolicy
from replication.protocol.commands import PositionCommand
from replication.protocol.line_batch import LineBatch, WriterRun, encode_run
from streams.registry import STREAMS

ROW = ["!r:hs", "m.read", "@u:hs", "$e", None, {}]


def run_of(prev: int, new: int, tokens: list[int], stream: str = "receipts", writer: str = "w1") -> WriterRun:
    return encode_run(stream, writer, prev, new, [(t, [ROW]) for t in tokens])[0]


def positions(*items: tuple[str, str, int, int]) -> LineBatch:
    return LineBatch.of_commands([PositionCommand(*item) for item in items])


def test_a_contiguous_run_is_relayed_whole():
    policy = RelayPolicy(grace=1.0, last_sent={("receipts", "w1"): 5})
    run = run_of(5, 8, [6, 7])
    assert policy.on_run(run, 10.0) == Decision("relay", LineBatch.of_run(run))
    assert policy.last_sent == {("receipts", "w1"): 8} and policy.changed_at == {("receipts", "w1"): 10.0}
    assert (policy.relayed_messages, policy.repairs, policy.resets) == (1, 0, 0)


def test_a_run_that_overlaps_what_was_sent_is_relayed_and_workers_drop_the_overlap():
    policy = RelayPolicy(grace=1.0, last_sent={("receipts", "w1"): 6})
    run = run_of(5, 8, [6, 7])
    assert policy.on_run(run, 0.0).action == "relay" and policy.last_sent[("receipts", "w1")] == 8


def test_a_run_after_a_gap_is_repaired_with_a_position_at_its_end():
    policy = RelayPolicy(grace=1.0, last_sent={("receipts", "w1"): 5})
    assert policy.on_run(run_of(7, 9, [8, 9]), 0.0) == Decision("repair", positions(("receipts", "w1", 9, 9)))
    assert policy.last_sent[("receipts", "w1")] == 9 and policy.repairs == 1


def test_a_database_writer_never_heard_of_is_repaired_too():
    policy = RelayPolicy(grace=1.0)
    assert policy.on_run(run_of(3, 4, [4]), 0.0) == Decision("repair", positions(("receipts", "w1", 4, 4)))


def test_old_news_unknown_streams_and_the_embedded_scan_send_nothing():
    policy = RelayPolicy(grace=1.0, last_sent={("receipts", "w1"): 9})
    assert policy.on_run(run_of(5, 8, [6]), 0.0) == Decision("covered")
    assert policy.on_run(run_of(0, 3, [1], stream="no_such_stream"), 0.0) == Decision("unknown")
    assert policy.last_sent == {("receipts", "w1"): 9}
    scanning = RelayPolicy(grace=1.0, local_scan=True)
    assert scanning.on_run(run_of(0, 1, [1]), 0.0) == Decision("scan")
    typing = encode_run("typing", "tw", 0, 1, [(1, [["!r", ["@a"]]])])[0]
    assert scanning.on_run(typing, 0.0).action == "start"  # in memory: relayed even when scanning


def test_an_in_memory_writer_first_heard_starts_where_its_run_starts():
    policy = RelayPolicy(grace=1.0)
    run = encode_run("typing", "tw", 3, 4, [(4, [["!r", ["@a"]]])])[0]
    assert policy.on_run(run, 0.0) == Decision("start", positions(("typing", "tw", 3, 3)) + LineBatch.of_run(run))
    assert policy.resets == 0 and policy.last_sent[("typing", "tw")] == 4


def test_an_in_memory_writer_that_restarted_is_reset_below_its_workers():
    policy = RelayPolicy(grace=1.0, last_sent={("typing", "tw"): 7})
    run = encode_run("typing", "tw", 0, 1, [(1, [["!r", ["@b"]]])])[0]
    assert policy.on_run(run, 0.0) == Decision("reset", positions(("typing", "tw", 0, 0)) + LineBatch.of_run(run))
    assert policy.resets == 1 and policy.last_sent[("typing", "tw")] == 1


def test_a_writer_the_database_has_ahead_is_repaired_after_the_grace_only():
    spec = STREAMS["receipts"]
    policy = RelayPolicy(grace=2.0, last_sent={("receipts", "w1"): 5, ("receipts", "w2"): 9})
    ahead = [("receipts", "w1", 8), ("receipts", "w2", 9), ("typing", "tw", 99), ("no_such_stream", "x", 1)]
    assert policy.on_positions(ahead, 10.0) is None  # w1 behind since 10.0; w2 agrees
    assert policy.agreed_at == {("receipts", "w2"): 10.0}
    assert policy.on_positions(ahead, 11.9) is None
    token = spec.to_wire(8)
    assert policy.on_positions(ahead, 12.0) == positions(("receipts", "w1", token, token))
    assert policy.last_sent[("receipts", "w1")] == token and policy.repairs == 1 and policy.behind_since == {}


def test_a_writer_that_caught_up_meanwhile_is_not_repaired():
    policy = RelayPolicy(grace=2.0, last_sent={("receipts", "w1"): 5})
    assert policy.on_positions([("receipts", "w1", 8)], 10.0) is None
    assert policy.on_run(run_of(5, 8, [6, 7]), 11.0).action == "relay"  # its run arrived
    assert policy.on_positions([("receipts", "w1", 8)], 13.0) is None and policy.repairs == 0


def test_settled_positions_are_those_still_for_a_while_and_confirmed_by_the_database():
    policy = RelayPolicy(grace=1.0, last_sent={("receipts", "w1"): 5})
    policy.on_run(run_of(5, 8, [6, 7]), 10.0)
    assert policy.settled_positions(20.0) == {}  # never confirmed by the database
    policy.on_positions([("receipts", "w1", 8)], 11.0)
    assert policy.settled_positions(11.5) == {}  # not still for 2 s yet
    assert policy.settled_positions(12.0) == {("receipts", "w1"): 8}


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 5)), max_size=30))
def test_what_a_worker_is_sent_never_goes_backwards_and_covers_each_run(spans):
    """Whatever order runs of a database stream arrive in, the token the relay stands at only
    grows, and after each run it is at least the run's end."""
    policy = RelayPolicy(grace=1.0, last_sent={("receipts", "w1"): 0})
    for prev, length in spans:
        before = policy.last_sent[("receipts", "w1")]
        decision = policy.on_run(run_of(prev, prev + length, []), 0.0)
        after = policy.last_sent[("receipts", "w1")]
        assert after >= max(before, prev + length)
        assert (decision.batch is None) == (decision.action == "covered")
