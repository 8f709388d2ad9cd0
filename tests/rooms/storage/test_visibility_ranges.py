"""History visibility (docs/storage.md, "Visibility"; vectors of Synapse's tests/test_visibility.py) through the real persist
path and the reads, table-driven: each case builds a room step by step and lists, by label,
which of the labelled events a user sees."""
from __future__ import annotations

import pytest
from django.db import connection
from hypothesis import given, settings
from hypothesis import strategies as st

from rooms.storage import IncomingEvent
from rooms.storage.reads import room_messages
from rooms.storage.synthetic import RoomBuilder
from rooms.storage.visibility_ranges import RangeSet
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, rows, store  # noqa: F401

pytestmark = ON_BOTH_DATABASES

A, J, O = "@resident:hs", "@joiner:hs", "@outsider:hs"

# (step, args..., label or None)
SETUP = [("create", A), ("member", A, "join", A, None)]

CASES = {
    # Synapse's tests/test_visibility.py: test_joined_history_visibility
    "joined: joiner sees join..leave": (
        [("vis", A, "joined", None), ("msg", A, "before"), ("member", J, "join", J, "join"),
         ("msg", A, "during"), ("member", J, "leave", J, "leave"), ("msg", A, "after")],
        {J: ["join", "during", "leave"], A: ["before", "join", "during", "leave", "after"], O: []}),
    "world_readable: anyone": (
        [("vis", A, "world_readable", None), ("msg", A, "m")], {O: ["m"], J: ["m"]}),
    "shared: pre-join history after joining": (
        [("vis", A, "shared", None), ("msg", A, "early"), ("member", J, "join", J, "join"), ("msg", A, "late")],
        {J: ["early", "join", "late"], O: []}),
    "shared (unset): same as shared": (
        [("msg", A, "early"), ("member", J, "join", J, "join")], {J: ["early", "join"], O: []}),
    "shared: nothing after leaving": (
        [("member", J, "join", J, "join"), ("msg", A, "in"), ("member", J, "leave", J, "leave"),
         ("msg", A, "out")], {J: ["join", "in", "leave"]}),
    "shared: rejoin shows the time away": (
        [("member", J, "join", J, "j1"), ("member", J, "leave", J, "l1"), ("msg", A, "away"),
         ("member", J, "join", J, "j2"), ("msg", A, "back")], {J: ["j1", "l1", "away", "j2", "back"]}),
    "invited: from the invite on": (
        [("vis", A, "invited", None), ("msg", A, "before"), ("member", J, "invite", A, "invite"),
         ("msg", A, "after")], {J: ["invite", "after"]}),
    "invited: knock is not enough": (
        [("vis", A, "invited", None), ("member", J, "knock", J, None), ("msg", A, "m")], {J: []}),
    "joined: invite is not enough": (
        [("vis", A, "joined", None), ("member", J, "invite", A, None), ("msg", A, "m")], {J: []}),
    "joined: own join visible": (
        [("vis", A, "joined", None), ("member", J, "join", J, "join")], {J: ["join"]}),
    "joined: own ban while joined visible (priority picks join)": (
        [("vis", A, "joined", None), ("member", J, "join", J, "join"), ("member", J, "ban", A, "ban"),
         ("msg", A, "after")], {J: ["join", "ban"]}),
    "joined: invite then leave (rejection) visible": (
        [("vis", A, "joined", None), ("member", J, "invite", A, None), ("member", J, "leave", J, "reject")],
        {J: ["reject"]}),
    "world_readable -> joined: the change itself visible to outsiders": (
        [("vis", A, "world_readable", None), ("msg", A, "open"), ("vis", A, "joined", "change"),
         ("msg", A, "closed")], {O: ["open", "change"], A: ["open", "change", "closed"]}),
    "joined -> world_readable: outsiders from the change on": (
        [("vis", A, "joined", None), ("msg", A, "closed"), ("vis", A, "world_readable", "change"),
         ("msg", A, "open")], {O: ["change", "open"]}),
    "invited -> joined: invitee stops at the change": (
        [("vis", A, "invited", None), ("member", J, "invite", A, "invite"), ("msg", A, "m1"),
         ("vis", A, "joined", "change"), ("msg", A, "m2")], {J: ["invite", "m1", "change"]}),
}


def build(store, steps):
    b = RoomBuilder("!vis:hs", server="hs")
    labels = {}
    for step in SETUP + steps:
        kind, args = step[0], step[1:]
        if kind == "create":
            eid, raw = b.create(args[0])
        elif kind == "member":
            user, membership, sender = args[0], args[1], args[2]
            eid, raw = b.member(user, membership, sender=sender)
        elif kind == "vis":
            eid, raw = b.visibility(args[0], args[1])
        elif kind == "msg":
            eid, raw = b.message(args[0], args[1])
        label = args[-1] if kind != "create" else None
        if label is not None:
            labels[eid] = label
        store.persist(raw)
    return labels


def seen(room_id, user, labels):
    page = room_messages(room_id, user, direction="f", limit=1000)
    return [labels[e.event_id] for e in page["chunk"] if e.event_id in labels]


@pytest.mark.parametrize("name", list(CASES))
def test_visibility_case(store, name):
    steps, expected = CASES[name]
    labels = build(store, steps)
    for user, want in expected.items():
        assert seen("!vis:hs", user, labels) == want, user


@pytest.mark.parametrize("name", list(CASES))
def test_same_result_in_one_batch(store, name):
    """The ranges do not depend on how events were batched."""
    steps, expected = CASES[name]
    b_store = []

    class Collect:
        def persist(self, raw):
            b_store.append(raw)

    labels = build(Collect(), steps)
    store.persist(*b_store)
    for user, want in expected.items():
        assert seen("!vis:hs", user, labels) == want, user


def copy_eras_into_user_rows(room_id):
    """Rewrite the room's user rows with copied eras (rows a persist path may have stored): each
    user's own ranges with ``*shared``'s before their latest join merged in."""
    def ranges(user):
        return [((st, ss), None if et is None else (et, es)) for st, ss, et, es in rows(
            "SELECT start_topological, start_stream, end_topological, end_stream FROM room_visibility_ranges "
            "WHERE room_id = %s AND user_id = %s ORDER BY 1, 2", room_id, user)]

    shared = RangeSet([list(r) for r in ranges("*shared")])
    joins = rows("SELECT user_id, max(topological_ordering * 1000000 + event_stream_ordering) FROM room_memberships "
                 "WHERE room_id = %s AND membership = 'join' GROUP BY user_id", room_id)
    copied = 0
    for user, j in joins:
        mine = RangeSet([list(r) for r in ranges(user)])
        join = divmod(j, 1000000)
        # *shared's ranges strictly before the join, each merged into the user's
        era = [(start, end if end is not None and end < join else (join[0], join[1] - 1))
               for start, end in shared.as_tuples() if start < join]
        for start, end in era:
            mine.add(start, end)
        copied += len(era)
        with connection.cursor() as c:
            c.execute("DELETE FROM room_visibility_ranges WHERE room_id = %s AND user_id = %s", [room_id, user])
            for (st, ss), end in mine.ranges:
                c.execute("INSERT INTO room_visibility_ranges (room_id, user_id, start_topological, start_stream, "
                          "end_topological, end_stream) VALUES (%s, %s, %s, %s, %s, %s)",
                          [room_id, user, st, ss, *(end or (None, None))])
    return copied


@pytest.mark.parametrize("name", [n for n in CASES if "shared" in n])
def test_rows_with_copied_eras_read_the_same(store, name):
    """Rows an older persist path wrote (the shared eras before a user's join copied into
    their rows) need no migration: the reads show the same events."""
    steps, expected = CASES[name]
    labels = build(store, steps)
    assert copy_eras_into_user_rows("!vis:hs") > 0
    for user, want in expected.items():
        assert seen("!vis:hs", user, labels) == want, user
        page = room_messages("!vis:hs", user, direction="b", limit=1)  # a walk that stops at once
        assert [labels.get(e.event_id) for e in page["chunk"]] == [want[-1]] if want else page["chunk"] == []


def test_backfilled_history_follows_the_rules(store):
    """Events persisted long after (backfill, negative stream orderings) are decided from the
    state at them, and a later join still opens shared history."""
    b = RoomBuilder("!bfv:hs", server="hs")
    create, join_a = b.create(A), b.member(A, "join")
    shared_msg = b.message(A, "shared-era")
    vis = b.visibility(A, "joined")
    joined_msg = b.message(A, "joined-era")
    join_j = b.member(J, "join")
    state = {("m.room.create", ""): create[0], ("m.room.member", A): join_a[0],
             ("m.room.history_visibility", ""): vis[0]}
    # we join over federation at join_j: the state arrives as outliers; then we backfill
    store.persist(*[IncomingEvent(raw, outlier=True) for _, raw in (create, join_a, vis)])
    store.persist(IncomingEvent(join_j[1], state_before=state))
    store.persist(IncomingEvent(joined_msg[1], state_before=state), backfill=True)
    store.persist(IncomingEvent(shared_msg[1], state_before={k: v for k, v in state.items()
                                                               if k[0] != "m.room.history_visibility"}),
                  backfill=True)
    labels = {shared_msg[0]: "shared-era", joined_msg[0]: "joined-era", join_j[0]: "join"}
    assert seen("!bfv:hs", J, labels) == ["shared-era", "join"]
    assert seen("!bfv:hs", A, labels) == ["shared-era", "joined-era", "join"]


def test_range_set_operations():
    rs = RangeSet()
    rs.add((1, 1), None)
    rs.close_at((5, 5))
    assert rs.covers((3, 9)) and not rs.covers((5, 6)) and not rs.is_open
    rs.remove_point((3, 3))
    assert rs.as_tuples() == [((1, 1), (3, 2)), ((3, 4), (5, 5))]
    rs.add((3, 3), (3, 3))
    assert rs.as_tuples() == [((1, 1), (5, 5))]
    rs.add((7, 7), None)
    assert rs.as_tuples() == [((1, 1), (5, 5)), ((7, 7), None)]


def _key(n: int) -> tuple[int, int]:
    return (n // 10, n % 10)


_range_ops = st.lists(st.tuples(st.sampled_from(["add", "open", "close", "remove"]),
                                st.integers(0, 300), st.integers(0, 40)), max_size=25)


@settings(max_examples=300, deadline=None)
@given(_range_ops, _range_ops)
def test_range_set_stored_prefix_is_all_a_write_keeps(before, after):
    """After any changes to stored ranges, the rows before the cut (the first ``stored``
    ranges' last start) plus the ranges from ``stored`` on are the ranges: what the persist
    path's cut-and-insert writes (``plan_writer``)."""
    def apply(rs: RangeSet, ops) -> None:
        for op, a, n in ops:
            if op == "add":
                rs.add(_key(a), _key(a + n))
            elif op == "open" and not rs.is_open:
                rs.add(_key(a), None)
            elif op == "close":
                rs.close_at(_key(a))
            elif op == "remove":
                rs.remove_point(_key(a))

    rs = RangeSet()
    apply(rs, before)
    rows = [tuple(r) for r in rs.ranges]  # stored, as the loader reads them back
    rs = RangeSet([list(r) for r in rows], stored=len(rows))
    apply(rs, after)
    assert 0 <= rs.stored <= len(rs.ranges)
    cut = rs.ranges[rs.stored - 1][0] if rs.stored else None
    kept = [r for r in rows if cut is not None and r[0] <= cut]
    assert kept + [tuple(r) for r in rs.ranges[rs.stored:]] == [tuple(r) for r in rs.ranges]
