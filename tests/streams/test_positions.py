"""The pure position rules (no database): writer bookkeeping and the reader-side tracker."""
import pytest

from streams.positions import PositionTracker, StreamPositions
from testing.services import MissingBinary, _find_pg_bin


def clock():
    return 100.0


def test_tracker_derives_linear_from_writer_updates():
    """A vector of Synapse's tests/storage/test_id_generators.py as a reader fed by replication updates."""
    t = PositionTracker({"first": 3, "second": 5}, clock=clock)
    assert t.linear() == 3
    assert t.for_writer("second") == 5
    t.advance("first", 6)
    assert t.linear() == 6
    t.advance("second", 7)
    assert t.linear() == 7
    t.advance("second", 9)
    assert t.linear() == 7  # 8 unseen
    t.advance("first", 8)
    assert t.linear() == 9
    t.advance("first", 11)
    t.advance("second", 15)
    assert t.linear() == 11
    assert t.positions() == {"first": 11, "second": 15}


def test_tracker_never_moves_backwards():
    t = PositionTracker({"a": 10, "b": 10}, clock=clock)
    t.advance("a", 20)
    t.advance("a", 12)  # stale update
    assert t.for_writer("a") == 20
    assert t.linear() == 10


def test_tracker_unknown_writer_holds_nothing_back_until_configured():
    t = PositionTracker({"a": 5}, clock=clock)
    t.advance("a", 9)
    assert t.linear() == 9
    assert t.for_writer("newcomer") == 9  # assumed at the linear position


def test_tracker_backwards_stream():
    t = PositionTracker({"a": -1, "b": -1}, backwards=True, clock=clock)
    t.advance("a", -4)
    assert t.linear() == -1
    t.advance("b", -2)
    assert t.linear() == -2
    t.advance("b", -3)
    assert t.linear() == -4  # -2, -3, -4 all seen: a gapless run


def test_writer_out_of_order_and_pending_with_age():
    now = [10.0]
    p = StreamPositions("w", clock=lambda: now[0])
    p.load(positions={}, persisted_upto=7, rows=[], writers=["w"])
    ticket = p.begin_allocation()
    p.allocated(ticket, [8, 9, 10])
    now[0] = 25.0
    assert [(x.stream_id, x.age(now[0])) for x in p.pending()] == [(8, 15.0), (9, 15.0), (10, 15.0)]
    p.finish([9])
    assert p.for_writer("w") == 7
    p.finish([8])
    assert p.for_writer("w") == 9
    assert [x.stream_id for x in p.pending()] == [10]
    p.finish([10])
    assert (p.for_writer("w"), p.linear(), p.pending()) == (10, 10, [])


def test_in_flight_allocation_blocks_advance():
    """Between 'the sequence answered' and 'the IDs are recorded', nothing may pass them."""
    p = StreamPositions("w", clock=clock)
    p.load(positions={}, persisted_upto=1, rows=[], writers=["w"])
    t1 = p.begin_allocation()
    p.allocated(t1, [2])
    t2 = p.begin_allocation()  # allocation under way: may receive 3
    p.finish([2])
    assert p.minimal_local() == 2
    p.allocated(t2, [3])
    p.finish([3])
    assert p.minimal_local() == 3


def test_failed_allocation_releases_its_ticket():
    p = StreamPositions("w", clock=clock)
    p.load(positions={}, persisted_upto=1, rows=[], writers=["w"])
    t = p.begin_allocation()
    p.allocated(t, None)
    assert not p.has_unfinished()


def test_missing_server_binary_names_the_debian_package():
    with pytest.raises(MissingBinary, match="apt-get install postgresql"):
        _find_pg_bin("no-such-postgres-binary")


def test_one_sign_flip_for_backwards_streams():
    """Stored IDs of a backwards stream are negated tokens; queries over them agree."""
    from streams.direction import BACKWARDS, FORWARDS
    from streams.registry import STREAMS

    assert STREAMS["backfill"].direction is BACKWARDS and STREAMS["events"].direction is FORWARDS
    for signs in (FORWARDS, BACKWARDS):
        for token in (1, 7, 2**40):
            assert signs.to_wire(signs.from_wire(token)) == token
    assert (BACKWARDS.from_wire(3), FORWARDS.from_wire(3)) == (-3, 3)
    assert BACKWARDS.lookups("stream_ordering", 2, 5) == {"stream_ordering__lt": -2, "stream_ordering__gte": -5}
    assert FORWARDS.lookups("stream_ordering", 2, 5) == {"stream_ordering__gt": 2, "stream_ordering__lte": 5}
    behind = {"<": int.__lt__, ">": int.__gt__}[BACKWARDS.behind_sql()]
    assert [s for s in [-1, -2, -3, -6] if behind(s, -3)] == [-1, -2]  # tokens 1 and 2 are below 3


def test_position_if_finished_is_known_only_with_nothing_else_outstanding():
    p = StreamPositions("w", positions={"w": 1, "v": 1}, persisted_upto=1, clock=clock)
    t = p.begin_allocation()
    p.allocated(t, [2, 3])
    assert p.position_if_finished([2, 3]) == 3
    assert p.position_if_finished([2]) is None  # 3 stays pending
    p.advance("v", 9)  # another writer went further: an idle w moves along with it
    assert p.position_if_finished([2, 3]) == 9
    t = p.begin_allocation()  # with an allocation of w under way: not known yet
    assert p.position_if_finished([2, 3]) is None
    p.allocated(t, [10])
    assert p.position_if_finished([2, 3]) is None
    p.finish([2, 3])
    assert p.for_writer("w") == 3
    assert p.position_if_finished([10]) == 10
    p.finish([10])
    assert p.for_writer("w") == 10


# -- the linear position from the records (any process: streams/stream_status.py) -----------------


def test_an_idle_writer_does_not_hold_the_recorded_linear_position_back():
    """w1 wrote 10 facts and exited, w2 wrote 1,000 after it: nothing pending, so every ID up to
    w2's position is complete."""
    from streams.positions import RecordedLinear, linear_from_records

    assert linear_from_records({"w1": 11, "w2": 1011}, []) == RecordedLinear(1011)


def test_a_pending_id_holds_the_recorded_linear_position_and_names_its_writer():
    from streams.positions import RecordedLinear, linear_from_records

    # w1's ID 12 is in flight (or stuck) while w2 went on: linear stops just below it
    assert linear_from_records({"w1": 11, "w2": 1011}, [("w2", 1012), ("w1", 12)]) == RecordedLinear(11, "w1")
    # pending IDs above every position hold nothing back
    assert linear_from_records({"w1": 11, "w2": 1011}, [("w2", 1012)]) == RecordedLinear(1011)
    assert linear_from_records({}, [("w1", 5)]) is None


@pytest.mark.parametrize("seed", range(50))
def test_the_recorded_linear_position_is_the_largest_id_with_every_id_below_complete(seed):
    """Against its definition, by brute force over random histories: IDs handed out in order to
    random writers, some still pending; each writer's recorded position is its largest ID with
    every one of its own IDs up to it complete."""
    import random

    from streams.positions import linear_from_records

    rnd = random.Random(seed)
    writers = ["w1", "w2", "w3"][: rnd.randint(1, 3)]
    owner = {i: rnd.choice(writers) for i in range(2, rnd.randint(3, 60))}
    pending = {i for i in owner if rnd.random() < 0.1}
    positions = {}
    for w in writers:
        own = sorted(i for i in owner if owner[i] == w)
        done = [i for i in own if not any(p <= i for p in pending if owner[p] == w)]
        if done:
            positions[w] = done[-1]
    recorded = linear_from_records(positions, [(owner[i], i) for i in pending])
    if not positions:
        assert recorded is None
        return
    furthest = max(positions.values())
    expected = max(i for i in [1, *owner] if i <= furthest and not any(p <= i for p in pending))
    assert recorded.position == expected
    assert (recorded.held_by is None) == (expected == furthest)
