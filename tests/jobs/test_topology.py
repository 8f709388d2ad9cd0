"""The topological-ordering job's pure function on small inline DataFrames."""
from __future__ import annotations

import random

import pytest
from pyspark.testing import assertDataFrameEqual

from jobs.topology import MAX_DEPTH, orderings_in_python, topological_ordering

EV = "room_id string, event_id string, stream_ordering long, depth long"
ED = "room_id string, event_id string, prev_event_id string"


def run(spark, events, edges):
    return topological_ordering(spark.createDataFrame(events, EV), spark.createDataFrame(edges, ED))


def expect(spark, rows):
    return spark.createDataFrame(rows, "room_id string, event_id string, topological_ordering long")


def test_chain_fork_and_merge(spark):
    # create -> a -> (b1, b2 concurrent branches; b2 -> c2) -> merge(b1, c2)
    events = [("!r", e, i, None) for i, e in enumerate(["create", "a", "b1", "b2", "c2", "merge"], 1)]
    edges = [("!r", "a", "create"), ("!r", "b1", "a"), ("!r", "b2", "a"), ("!r", "c2", "b2"),
             ("!r", "merge", "b1"), ("!r", "merge", "c2")]
    assertDataFrameEqual(run(spark, events, edges), expect(spark, [
        ("!r", "create", 1), ("!r", "a", 2), ("!r", "b1", 3), ("!r", "b2", 3), ("!r", "c2", 4),
        ("!r", "merge", 5)]))


def test_rooms_are_independent_and_edges_order_does_not_matter(spark):
    events = [("!x", "x1", 1, None), ("!y", "y1", 2, None), ("!x", "x2", 3, None), ("!y", "y2", 4, None),
              ("!y", "y3", 5, None)]
    edges = [("!y", "y3", "y2"), ("!x", "x2", "x1"), ("!y", "y2", "y1")]
    assertDataFrameEqual(run(spark, events, edges), expect(spark, [
        ("!x", "x1", 1), ("!x", "x2", 2), ("!y", "y1", 1), ("!y", "y2", 2), ("!y", "y3", 3)]))


def test_a_declared_depth_is_the_ordering_whatever_the_prev_events_say(spark):
    # as in Synapse: the ordering is the event's own depth (a t token never shifts meaning);
    # only an event without a depth is placed after its known prev events
    events = [("!r", "old", -2, 40), ("!r", "older", -3, None), ("!r", "live", 5, 7), ("!r", "next", 6, None)]
    edges = [("!r", "old", "$unknown"), ("!r", "older", "$gone"), ("!r", "live", "old"), ("!r", "live", "$unknown"),
             ("!r", "next", "live"), ("!r", "next", "old")]
    assertDataFrameEqual(run(spark, events, edges), expect(spark, [
        ("!r", "old", 40), ("!r", "older", 1), ("!r", "live", 7), ("!r", "next", 41)]))


def test_depth_is_capped(spark):
    events = [("!r", "a", 1, MAX_DEPTH), ("!r", "b", 2, None)]
    edges = [("!r", "b", "a")]
    assertDataFrameEqual(run(spark, events, edges), expect(spark, [("!r", "a", MAX_DEPTH), ("!r", "b", MAX_DEPTH)]))


def test_room_without_edges_and_cycle_does_not_hang(spark):
    events = [("!solo", "s", 1, None), ("!c", "p", 2, None), ("!c", "q", 3, None)]
    edges = [("!c", "p", "q"), ("!c", "q", "p")]
    got = {r.event_id: r.topological_ordering for r in run(spark, events, edges).collect()}
    assert got["s"] == 1
    assert sorted([got["p"], got["q"]]) == [1, 2]  # the cycle is cut once, never walked forever


@pytest.mark.parametrize("seed", [1, 2])
def test_spark_agrees_with_brute_force_on_random_dags(spark, seed):
    rng = random.Random(seed)
    events, edges, expected = [], [], {}
    for room in range(5):
        ids = []
        for i in range(rng.randrange(1, 60)):
            eid = f"$r{room}e{i}"
            prevs = rng.sample(ids, k=min(len(ids), rng.choice([1, 1, 1, 2, 3]))) if ids else []
            events.append((f"!r{room}", eid, len(events) + 1, None))
            edges += [(f"!r{room}", eid, p) for p in prevs]
            expected[eid] = max((expected[p] for p in prevs), default=0) + 1
            ids.append(eid)
    rng.shuffle(events)
    got = {r.event_id: r.topological_ordering for r in run(spark, events, edges).collect()}
    assert got == expected
    assert orderings_in_python(events, edges) == expected


def test_long_chain_is_one_pass(spark):
    n = 20000  # a recursive walk would overflow the stack long before this
    events = [("!big", f"e{i}", i, None) for i in range(n)]
    edges = [("!big", f"e{i}", f"e{i - 1}") for i in range(1, n)]
    got = run(spark, events, edges).agg({"topological_ordering": "max"}).collect()[0][0]
    assert got == n


@pytest.mark.parametrize("seed", [3, 4])
def test_rooms_settled_in_sql_and_walked_rooms_agree_with_the_twin(spark, seed):
    # some events without a depth follow only events with one (Spark SQL settles their rooms),
    # others follow events without one (their rooms are walked in Python); both against the
    # single-process twin and a brute force over the DAG
    rng = random.Random(seed)
    events, edges, expected = [], [], {}
    for room in range(12):
        ids: list[str] = []
        chained = room % 3 == 0  # these rooms get chains of events without a depth
        for i in range(rng.randrange(1, 40)):
            eid = f"$r{room}e{i}"
            prevs = rng.sample(ids, k=min(len(ids), rng.choice([1, 1, 2, 3]))) if ids else []
            missing = rng.random() < (0.5 if chained else 0.15) and (chained or all(expected[p][1] for p in prevs))
            depth = None if missing else rng.choice([0, 1, rng.randrange(0, 100), MAX_DEPTH + 5, -3])
            order = (min(max((expected[p][0] for p in prevs), default=0) + 1, MAX_DEPTH) if depth is None
                     else min(max(depth, 0), MAX_DEPTH))
            expected[eid] = (order, depth is not None)
            events.append((f"!r{room}", eid, len(events) + 1, depth))
            edges += [(f"!r{room}", eid, p) for p in prevs] + [(f"!r{room}", eid, "$elsewhere")]
            ids.append(eid)
    rng.shuffle(events)
    got = {r.event_id: r.topological_ordering for r in run(spark, events, edges).collect()}
    assert got == {e: o for e, (o, _) in expected.items()}
    assert got == orderings_in_python(events, edges)
