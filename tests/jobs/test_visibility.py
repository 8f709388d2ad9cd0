"""The visibility job's pure functions on small inline DataFrames, one rule at a time.

Rooms are linear here: each state event makes a new state group whose parent is the previous
one (as the persist path writes them), so the expected visibility can be read off the rules.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.testing import assertDataFrameEqual

from jobs.visibility_job import (
    DIFF_SCHEMA,
    EVENTS_SCHEMA,
    GROUPS_SCHEMA,
    RANGES_SCHEMA,
    visibility_differences,
    visibility_ranges,
)

A, B = "@alice:hs", "@bob:hs"


class Room:
    """A linear room: events in order, state groups chained as the persist path chains them."""

    def __init__(self, room_id: str = "!r:hs") -> None:
        self.room_id = room_id
        self.events: list[tuple] = []
        self.groups: list[tuple] = []
        self.group: int | None = None
        self.n = 0

    def add(self, etype: str, state_key: str | None = None, membership: str | None = None,
            vis: str | None = None, outlier: bool = False, rejected: bool = False) -> str:
        self.n += 1
        eid = f"$e{self.n}"
        prev = [f"$e{self.n - 1}"] if self.n > 1 else []
        if state_key is not None and not rejected and not outlier:
            new = 100 + self.n
            self.groups.append((self.room_id, new, self.group, etype, state_key, membership, vis))
            self.group = new
        self.events.append((self.room_id, eid, self.n, self.n, etype, state_key, membership, outlier, rejected,
                            self.group, prev))
        return eid

    def member(self, user: str, membership: str) -> str:
        return self.add("m.room.member", user, membership)

    def visibility(self, value: str) -> str:
        return self.add("m.room.history_visibility", "", vis=value)

    def msg(self) -> str:
        return self.add("m.room.message")

    def ranges(self, spark):
        return visibility_ranges(spark.createDataFrame(self.events, EVENTS_SCHEMA),
                                 spark.createDataFrame(self.groups, GROUPS_SCHEMA))

    def rows(self, spark) -> dict[str, set[int]]:
        """holder -> event numbers its own rows cover (an open range covers up to the last event)."""
        out: dict[str, set[int]] = {}
        for r in self.ranges(spark).collect():
            end = self.n if r.end_topological is None else r.end_topological
            out.setdefault(r.user_id, set()).update(range(r.start_topological, end + 1))
        return out

    def visible(self, spark) -> dict[str, set[int]]:
        """holder -> event numbers it sees as the reads decide it: a user's rows, and the
        ``*shared`` rows before their latest join (``*`` apart)."""
        out = self.rows(spark)
        joins = {e[5]: e[2] for e in self.events if e[4] == "m.room.member" and e[6] == "join"
                 and not e[7] and not e[8]}
        for user, j in joins.items():
            seen = {n for n in out.get("*shared", set()) if n < j} | out.get(user, set())
            if seen:
                out[user] = seen
        return out


def test_joined(spark):
    room = Room()
    room.member(A, "join")            # 1
    room.visibility("joined")         # 2
    room.msg()                        # 3 before bob
    room.member(B, "join")            # 4 bob's join
    room.msg()                        # 5 during
    room.member(B, "leave")           # 6 bob's leave: his own, seen
    room.msg()                        # 7 after
    vis = room.visible(spark)
    assert vis[B] & {3, 4, 5, 6, 7} == {4, 5, 6}  # Synapse's test_joined_history_visibility
    assert vis[B] & {1, 2} == {1, 2}  # shared era (the default, and the value before 2): he joins later
    assert vis[A] == set(range(1, 8))
    assert "*" not in vis


def test_shared_history_before_a_join_is_visible(spark):
    room = Room()
    room.member(A, "join")            # 1
    room.msg()                        # 2 shared (default)
    room.visibility("joined")         # 3 shared before it: seen by later joiners too
    room.msg()                        # 4 joined-only
    room.visibility("shared")         # 5
    room.msg()                        # 6
    room.member(B, "join")            # 7
    vis = room.visible(spark)
    assert vis[B] == {1, 2, 3, 5, 6, 7}
    assert vis["*shared"] >= {1, 2, 3, 5, 6, 7} and 4 not in vis["*shared"]
    assert room.rows(spark)[B] == {7}  # his own join: the eras before it are *shared's, not copied


def test_differences_count_shared_eras_before_the_join_on_both_sides(spark):
    """The check compares what each side lets a user see: rows that hold the shared eras
    copied in (as an older persist path wrote them) show the same events as rows that
    leave them to ``*shared``; a copy of an era the user may not see is a difference."""
    room = Room()
    room.member(A, "join")            # 1
    room.msg()                        # 2 shared
    room.visibility("joined")         # 3
    room.msg()                        # 4 joined-only
    room.member(B, "join")            # 5
    events = spark.createDataFrame(room.events, EVENTS_SCHEMA)
    new = spark.createDataFrame([("!r:hs", "*shared", 1, 1, 3, 3), ("!r:hs", A, 1, 1, None, None),
                                 ("!r:hs", B, 5, 5, None, None)], RANGES_SCHEMA)
    copied = spark.createDataFrame([("!r:hs", "*shared", 1, 1, 3, 3), ("!r:hs", A, 1, 1, None, None),
                                    ("!r:hs", B, 1, 1, 3, 3), ("!r:hs", B, 5, 5, None, None)], RANGES_SCHEMA)
    assert visibility_differences(events, new, copied).count() == 0
    too_much = spark.createDataFrame([("!r:hs", "*shared", 1, 1, 3, 3), ("!r:hs", A, 1, 1, None, None),
                                      ("!r:hs", B, 1, 1, None, None)], RANGES_SCHEMA)
    assertDataFrameEqual(visibility_differences(events, new, too_much), spark.createDataFrame([
        ("!r:hs", "$e4", B, "hidden", "visible")], DIFF_SCHEMA))
    no_era = spark.createDataFrame([("!r:hs", A, 1, 1, None, None), ("!r:hs", B, 5, 5, None, None)], RANGES_SCHEMA)
    assert {(r.user_id, r.event_id) for r in visibility_differences(events, new, no_era).collect()} == {
        ("*shared", "$e1"), ("*shared", "$e2"), ("*shared", "$e3"),
        (B, "$e1"), (B, "$e2"), (B, "$e3")}


def test_invited(spark):
    room = Room()
    room.visibility("invited")        # 1 (shared before it: seen by anyone who joins, not bob)
    room.member(A, "join")            # 2
    room.msg()                        # 3
    room.member(B, "invite")          # 4
    room.msg()                        # 5 bob invited: sees it
    room.visibility("joined")         # 6 invited before it: still seen by bob
    room.msg()                        # 7 not any more
    room.member(B, "knock")           # 8 his own: more permissive of knock and invite -> invite, joined -> no
    vis = room.visible(spark)
    assert vis[B] == {4, 5, 6}


def test_world_readable_is_anyone(spark):
    room = Room()
    room.member(A, "join")            # 1 (shared era)
    room.visibility("world_readable")  # 2
    room.msg()                        # 3
    room.visibility("joined")         # 4 world_readable before it
    room.msg()                        # 5
    vis = room.visible(spark)
    assert vis["*"] == {2, 3, 4}
    assert B not in vis


def test_leave_then_nothing_and_ban_while_joined(spark):
    room = Room()
    room.visibility("joined")         # 1 (shared before it, and bob joins later: seen)
    room.member(A, "join")            # 2
    room.member(B, "join")            # 3
    room.msg()                        # 4
    room.member(B, "ban")             # 5 his own ban while joined: priority picks join -> seen
    room.msg()                        # 6
    vis = room.visible(spark)
    assert vis[B] == {1, 3, 4, 5}


def test_outliers_and_rejected_events_are_never_covered(spark):
    room = Room()
    room.member(A, "join")            # 1
    room.add("m.room.message", outlier=True)  # 2
    room.add("m.room.member", B, "join", rejected=True)  # 3: changes nothing
    room.msg()                        # 4
    vis = room.visible(spark)
    assert vis[A] >= {1, 4}  # a range may span the keys of events that are never shown
    assert B not in vis


def test_open_range_while_granted(spark):
    room = Room()
    room.member(A, "join")
    room.msg()
    rows = {r.user_id: r for r in room.ranges(spark).collect()}
    assert rows[A].end_topological is None and rows["*shared"].end_topological is None


def test_differences_compare_covered_events_not_bounds(spark):
    room = Room()
    for _ in range(3):
        room.msg()
    room.member(A, "join")  # 4
    events = spark.createDataFrame(room.events, EVENTS_SCHEMA)
    same = spark.createDataFrame([("!r:hs", A, 1, 1, 2, 2), ("!r:hs", A, 3, 3, None, None)], RANGES_SCHEMA)
    merged = spark.createDataFrame([("!r:hs", A, 0, 0, None, None)], RANGES_SCHEMA)
    assert visibility_differences(events, same, merged).count() == 0  # same events, other bounds
    fewer = spark.createDataFrame([("!r:hs", A, 1, 1, 2, 2)], RANGES_SCHEMA)
    assertDataFrameEqual(visibility_differences(events, same, fewer), spark.createDataFrame([
        ("!r:hs", "$e3", A, "visible", "hidden"), ("!r:hs", "$e4", A, "visible", "hidden"),
        ("!r:hs", None, A, "open", "closed")], DIFF_SCHEMA))


@pytest.mark.parametrize("value", ["bogus", None])
def test_unknown_or_missing_visibility_is_shared(spark, value):
    room = Room()
    room.member(A, "join")            # 1
    room.add("m.room.history_visibility", "", vis=value)  # 2
    room.msg()                        # 3
    room.member(B, "join")            # 4
    assert room.visible(spark)[B] == {1, 2, 3, 4}


# -- a fork between two groups of one room: only the keys on the paths can differ --------------

group_trees = st.lists(  # group i+1: (its parent among the earlier ones or None, its rows)
    st.tuples(st.integers(-1, 30), st.dictionaries(st.sampled_from([f"@u{i}:hs" for i in range(12)] + ["v"]),
                                                   st.sampled_from(["join", "leave", "invite", "ban"]),
                                                   min_size=1, max_size=6)),
    min_size=1, max_size=30)


@given(tree=group_trees, pairs=st.lists(st.tuples(st.integers(0, 29), st.integers(0, 29)), max_size=10))
@settings(max_examples=200, deadline=None)
def test_fork_names_every_key_that_differs_and_its_value(tree, pairs):
    """``_States.fork(a, b)`` against both states built whole: every key outside the keys it
    names has one value in both, and it gives each named key's value in ``b``'s state;
    ``values_at`` agrees with the whole state for any keys."""
    import pandas as pd

    from jobs.visibility_job import HV, MEMBER, _States

    rows = []
    for i, (parent, keys) in enumerate(tree, start=1):
        parent = parent + 1 if 0 <= parent < i - 1 else None  # an earlier group, or a snapshot
        for key, m in keys.items():
            if key == "v":
                rows.append((i, parent, HV, "", None, {"join": "joined", "leave": "shared", "invite": "invited",
                                                       "ban": "world_readable"}[m]))
            else:
                rows.append((i, parent, MEMBER, key, m, None))
    groups = pd.DataFrame(rows, columns=["state_group", "prev_state_group", "type", "state_key", "membership",
                                         "history_visibility"])
    states = _States(groups)
    n = len(tree)
    for a, b in pairs:
        a, b = a % n + 1, b % n + 1
        whole_a, whole_b = dict(states.state(a)), dict(states.state(b))
        moved = states.fork(a, b)
        if moved is None:  # only across snapshots
            assert not set(_chain(states, a)) & set(_chain(states, b))
            continue
        values, may_differ = moved
        for k in set(whole_a) | set(whole_b):
            if k not in may_differ:
                assert whole_a.get(k) == whole_b.get(k), k
        assert {k: whole_b[k] for k in may_differ if k in whole_b} == values
        some = list(whole_a)[:3] + [("m", "@nobody:hs")]
        assert states.values_at(a, some) == {k: whole_a[k] for k in some if k in whole_a}


def _chain(states, g):
    while g is not None:
        yield g
        g = states.parent.get(g)
