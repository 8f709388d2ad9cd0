"""The topological-ordering job's pure function on small inline DataFrames.

Rooms are independent (one test says so of two rooms in one frame), so each test's rooms are
computed together with every other test's in one Spark run per path: the rooms that need the
walk in Python with those Spark SQL settles beside them (:func:`walked`), and the rooms that
Spark SQL settles alone, with no room left to walk (:func:`settled`). Each test asserts the
orderings of its own rooms."""
from __future__ import annotations

import random
from typing import Any, Callable

import pytest

from jobs.topology import MAX_DEPTH, orderings_in_python, topological_ordering

EV = "room_id string, event_id string, stream_ordering long, depth long"
ED = "room_id string, event_id string, prev_event_id string"
RESULT = "struct<room_id:string,event_id:string,topological_ordering:bigint>"

Rows = list[tuple[Any, ...]]


def chain_fork_and_merge() -> tuple[Rows, Rows]:
    # create -> a -> (b1, b2 concurrent branches; b2 -> c2) -> merge(b1, c2)
    events = [("!fork", e, i, None) for i, e in enumerate(["create", "a", "b1", "b2", "c2", "merge"], 1)]
    edges = [("!fork", "a", "create"), ("!fork", "b1", "a"), ("!fork", "b2", "a"), ("!fork", "c2", "b2"),
             ("!fork", "merge", "b1"), ("!fork", "merge", "c2")]
    return events, edges


def two_rooms_interleaved() -> tuple[Rows, Rows]:
    events = [("!x", "x1", 1, None), ("!y", "y1", 2, None), ("!x", "x2", 3, None), ("!y", "y2", 4, None),
              ("!y", "y3", 5, None)]
    edges = [("!y", "y3", "y2"), ("!x", "x2", "x1"), ("!y", "y2", "y1")]
    return events, edges


def solo_and_cycle() -> tuple[Rows, Rows]:
    events = [("!solo", "s", 1, None), ("!c", "p", 2, None), ("!c", "q", 3, None)]
    edges = [("!c", "p", "q"), ("!c", "q", "p")]
    return events, edges


def random_dags(seed: int) -> tuple[Rows, Rows, dict[str, int]]:
    rng = random.Random(seed)
    events: Rows = []
    edges: Rows = []
    expected: dict[str, int] = {}
    for room in range(5):
        ids: list[str] = []
        for i in range(rng.randrange(1, 60)):
            eid = f"$r{room}e{i}"
            prevs = rng.sample(ids, k=min(len(ids), rng.choice([1, 1, 1, 2, 3]))) if ids else []
            events.append((f"!dag{seed}-{room}", eid, len(events) + 1, None))
            edges += [(f"!dag{seed}-{room}", eid, p) for p in prevs]
            expected[eid] = max((expected[p] for p in prevs), default=0) + 1
            ids.append(eid)
    rng.shuffle(events)
    return events, edges, expected


LONG_CHAIN = 20000  # a recursive walk would overflow the stack long before this


def long_chain() -> tuple[Rows, Rows]:
    events = [("!big", f"e{i}", i, None) for i in range(LONG_CHAIN)]
    edges = [("!big", f"e{i}", f"e{i - 1}") for i in range(1, LONG_CHAIN)]
    return events, edges


def settled_and_walked(seed: int) -> tuple[Rows, Rows, dict[str, tuple[int, bool]]]:
    # some events without a depth follow only events with one (Spark SQL settles their rooms),
    # others follow events without one (their rooms are walked in Python)
    rng = random.Random(seed)
    events: Rows = []
    edges: Rows = []
    expected: dict[str, tuple[int, bool]] = {}
    for room in range(12):
        ids: list[str] = []
        chained = room % 3 == 0  # these rooms get chains of events without a depth
        name = f"!mixed{seed}-{room}"
        for i in range(rng.randrange(1, 40)):
            eid = f"$r{room}e{i}"
            prevs = rng.sample(ids, k=min(len(ids), rng.choice([1, 1, 2, 3]))) if ids else []
            missing = rng.random() < (0.5 if chained else 0.15) and (chained or all(expected[p][1] for p in prevs))
            depth = None if missing else rng.choice([0, 1, rng.randrange(0, 100), MAX_DEPTH + 5, -3])
            order = (min(max((expected[p][0] for p in prevs), default=0) + 1, MAX_DEPTH) if depth is None
                     else min(max(depth, 0), MAX_DEPTH))
            expected[eid] = (order, depth is not None)
            events.append((name, eid, len(events) + 1, depth))
            edges += [(name, eid, p) for p in prevs] + [(name, eid, "$elsewhere")]
            ids.append(eid)
    rng.shuffle(events)
    return events, edges, expected


def declared_depths() -> tuple[Rows, Rows]:
    # as in Synapse: the ordering is the event's own depth (a t token never shifts meaning);
    # only an event without a depth is placed after its known prev events
    events = [("!declared", "old", -2, 40), ("!declared", "older", -3, None), ("!declared", "live", 5, 7),
              ("!declared", "next", 6, None)]
    edges = [("!declared", "old", "$unknown"), ("!declared", "older", "$gone"), ("!declared", "live", "old"),
             ("!declared", "live", "$unknown"), ("!declared", "next", "live"), ("!declared", "next", "old")]
    return events, edges


def capped_depth() -> tuple[Rows, Rows]:
    return [("!capped", "a", 1, MAX_DEPTH), ("!capped", "b", 2, None)], [("!capped", "b", "a")]


WALKED: list[Callable[[], tuple[Any, ...]]] = [
    chain_fork_and_merge, two_rooms_interleaved, solo_and_cycle, lambda: random_dags(1), lambda: random_dags(2),
    long_chain, lambda: settled_and_walked(3), lambda: settled_and_walked(4)]
SETTLED: list[Callable[[], tuple[Any, ...]]] = [declared_depths, capped_depth]


class Orderings:
    """One Spark run's result: (room, event) -> ordering, and the result's schema."""

    def __init__(self, spark: Any, scenarios: list[Callable[[], tuple[Any, ...]]]) -> None:
        events: Rows = []
        edges: Rows = []
        for scenario in scenarios:
            ev, ed = scenario()[:2]
            events += ev
            edges += ed
        with topological_ordering(spark.createDataFrame(events, EV), spark.createDataFrame(edges, ED)) as result:
            self.schema = result.schema.simpleString()
            self.rows = [tuple(r) for r in result.collect()]
        self.by_room: dict[str, dict[str, int]] = {}
        for room, event, ordering in self.rows:
            self.by_room.setdefault(room, {})[event] = ordering

    def of(self, *rooms: str) -> dict[str, int]:
        """Event -> ordering in ``rooms`` (event IDs are unique within each test's rooms)."""
        return {e: o for room in rooms for e, o in self.by_room.get(room, {}).items()}

    def prefixed(self, prefix: str) -> dict[str, int]:
        return self.of(*(room for room in self.by_room if room.startswith(prefix)))


@pytest.fixture(scope="module")
def walked(spark) -> Orderings:
    """Every walked scenario in one run: some rooms go through the Python walk."""
    return Orderings(spark, WALKED)


@pytest.fixture(scope="module")
def settled(spark) -> Orderings:
    """Rooms that Spark SQL settles, in a run with no room to walk (no Python at all)."""
    return Orderings(spark, SETTLED)


def test_one_row_per_event_of_each_run(walked, settled):
    for run, scenarios in ((walked, WALKED), (settled, SETTLED)):
        assert run.schema == RESULT
        given = sorted((r[0], r[1]) for s in scenarios for r in s()[0])
        assert sorted((room, event) for room, event, _ in run.rows) == given


def test_chain_fork_and_merge(walked):
    assert walked.of("!fork") == {"create": 1, "a": 2, "b1": 3, "b2": 3, "c2": 4, "merge": 5}


def test_rooms_are_independent_and_edges_order_does_not_matter(walked):
    assert walked.by_room["!x"] == {"x1": 1, "x2": 2}
    assert walked.by_room["!y"] == {"y1": 1, "y2": 2, "y3": 3}


def test_a_declared_depth_is_the_ordering_whatever_the_prev_events_say(settled):
    assert settled.of("!declared") == {"old": 40, "older": 1, "live": 7, "next": 41}


def test_depth_is_capped(settled):
    assert settled.of("!capped") == {"a": MAX_DEPTH, "b": MAX_DEPTH}


def test_room_without_edges_and_cycle_does_not_hang(walked):
    got = walked.of("!solo", "!c")
    assert got["s"] == 1
    assert sorted([got["p"], got["q"]]) == [1, 2]  # the cycle is cut once, never walked forever


@pytest.mark.parametrize("seed", [1, 2])
def test_spark_agrees_with_brute_force_on_random_dags(walked, seed):
    events, edges, expected = random_dags(seed)
    assert walked.prefixed(f"!dag{seed}-") == expected
    assert orderings_in_python(events, edges) == expected


def test_long_chain_is_one_pass(walked):
    got = walked.of("!big")
    assert len(got) == LONG_CHAIN and max(got.values()) == got[f"e{LONG_CHAIN - 1}"] == LONG_CHAIN


@pytest.mark.parametrize("seed", [3, 4])
def test_rooms_settled_in_sql_and_walked_rooms_agree_with_the_twin(walked, seed):
    # both against the single-process twin and a brute force over the DAG
    events, edges, expected = settled_and_walked(seed)
    got = walked.prefixed(f"!mixed{seed}-")
    assert got == {e: o for e, (o, _) in expected.items()}
    assert got == orderings_in_python(events, edges)
