"""The chain cover jobs: the Spark rebuild equals the pure algorithm on the same events; on a
database indexed batch by batch as the persist path indexes, the check finds nothing, then
finds exactly what was planted in the stored index, and the rebuild repairs it (SQLite here;
the same on PostgreSQL, local[2] and the standalone cluster, in test_cluster.py)."""
from __future__ import annotations

import json

import pytest
from django.db import connection

from jobs.chain_cover_job import EVENTS_COLUMNS, chain_cover, chain_cover_in_python
from jobs.models import JobRun
from jobs.runner import run_job
from rooms.matrix.chain_index import IndexEvent, build, canonical
from tests.rooms.storage.chain_helpers import generated_room, store, store_room, stored_rows
from tests.rooms.storage.helpers import ON_BOTH_DATABASES, rows

EVENTS_SCHEMA = "room_id string, event_id string, stream_ordering long, type string, state_key string, auth_events string"


def rooms():
    """Rooms of versions 2 (``[id, hashes]`` references), 10 and 12 (implied create event)."""
    return [generated_room(v, seed=s, n=40) for v, s in (("2", 1), ("10", 2), ("12", 3), ("10", 4))]


def event_rows(built):
    out, stream = [], 0
    for room in built:
        for e in room.order:
            stream += 1
            pdu = room.events[e].pdu
            out.append((room.room_id, e, stream, pdu["type"], pdu.get("state_key"), json.dumps(pdu["auth_events"])))
    return out


def pure_canonical(built):
    positions, links = [], []
    offset = 0
    for room in built:
        index = build(IndexEvent(e.event_id, e.type, e.state_key, e.auth_event_ids)
                      for e in (room.events[i] for i in room.order) if e.is_state)
        positions += [(e, c + offset, s) for e, (c, s) in index.positions.items()]
        links += [(oc + offset, o, tc + offset, t) for oc, d in index.links.items() for tc, ps in d.items()
                  for o, t in ps]
        offset += len(index.chains)
    return canonical(positions, links)


def test_spark_rebuild_equals_the_pure_algorithm(spark):
    built = rooms()
    data = event_rows(built)
    positions, links = chain_cover(spark.createDataFrame(data, EVENTS_SCHEMA))
    got_positions = [(r.event_id, r.chain_id, r.sequence_number) for r in positions.collect()]
    got_links = [tuple(r)[1:] for r in links.collect()]
    assert len({c for _, c, _ in got_positions}) == len({(r.room_id, r.chain_id) for r in positions.collect()})
    assert canonical(got_positions, got_links) == pure_canonical(built)
    assert got_links  # the rooms do have links
    py_positions, py_links = chain_cover_in_python(data)
    assert canonical([p[1:] for p in py_positions], [l[1:] for l in py_links]) == pure_canonical(built)
    assert list(EVENTS_COLUMNS) == [c.split()[0] for c in EVENTS_SCHEMA.split(", ")]


def damage():
    """A position moved, a link lost, a link invented; returns what each names."""
    positions = rows("SELECT event_id, chain_id, sequence_number FROM event_auth_chains ORDER BY chain_id, sequence_number")
    links = rows("SELECT id, origin_chain_id, origin_sequence_number, target_chain_id, target_sequence_number "
                 "FROM event_auth_chain_links ORDER BY id")
    moved = next(e for e, c, s in positions if s > 1)  # not a chain's first event: chains keep their names
    lost = links[len(links) // 2]
    with connection.cursor() as cursor:
        cursor.execute("UPDATE event_auth_chains SET sequence_number = sequence_number + 100 WHERE event_id = %s",
                       [moved])
        cursor.execute("DELETE FROM event_auth_chain_links WHERE id = %s", [lost[0]])
        cursor.execute("INSERT INTO event_auth_chain_links (room_id, origin_chain_id, origin_sequence_number, "
                       "target_chain_id, target_sequence_number) SELECT room_id, %s, 1, %s, 99 FROM event_auth_chains "
                       "WHERE chain_id = %s LIMIT 1", [lost[1], lost[3], lost[1]])
    return moved


@ON_BOTH_DATABASES
@pytest.mark.parametrize("default_database", ["sqlite"], indirect=True)  # PostgreSQL: test_cluster.py
def test_check_finds_what_was_planted_and_rebuild_repairs_it(default_database, spark):
    built = rooms()[1:3]
    for room in built:
        store_room(room)
    healthy = canonical(*stored_rows())
    assert healthy == pure_canonical(built)

    check = run_job("check_chain_cover")
    assert check.status == JobRun.Status.SUCCEEDED, check.error
    assert check.differences == 0, check.difference_sample[:10]
    assert check.rows_in == sum(1 for r in built for e in r.order if r.events[e].is_state)

    moved = damage()
    check = run_job("check_chain_cover")
    assert check.differences == 3, check.difference_sample
    position = [d for d in check.difference_sample if d["event_id"] == moved]
    assert len(position) == 1 and position[0]["expected"] != position[0]["found"]
    links = [d for d in check.difference_sample if d is not position[0]]
    assert {(d["expected"] is None, d["found"] is None) for d in links} == {(True, False), (False, True)}
    assert all((d["expected"] or d["found"]).startswith("link ") for d in links)

    fix = run_job("rebuild_chain_cover")
    assert fix.status == JobRun.Status.SUCCEEDED, fix.error
    assert canonical(*stored_rows()) == healthy
    assert run_job("check_chain_cover").differences == 0
    # the persist path goes on indexing after the swap, with chain IDs that do not clash
    room = built[0]
    before = {c for _, c, _ in stored_rows()[0]}
    added = store([("$later", {"type": "m.room.topic", "state_key": "", "sender": "@a:s1", "room_id": room.room_id,
                               "auth_events": [room.order[0]], "content": {}})], room.room_id)
    assert added.positions and added.positions[0][1] not in before


@pytest.mark.django_db(transaction=True)
def test_a_room_that_gains_events_while_the_job_runs_keeps_its_index(spark, monkeypatch):
    from jobs import definitions

    built = rooms()[1:3]
    for room in built:
        store_room(room)
    # a NUL in content is valid JSON that PostgreSQL's jsonb refuses: the read must not trip on it
    first = built[0]
    store([("$nul", {"type": "m.room.topic", "state_key": "", "sender": "@a:s1", "room_id": first.room_id,
                     "auth_events": [first.order[0]], "content": {"topic": "a\u0000b"}})], first.room_id)
    store([("$last", {"type": "m.room.topic", "state_key": "", "sender": "@a:s1", "room_id": built[1].room_id,
                      "auth_events": [built[1].order[0]], "content": {}})], built[1].room_id)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM event_auth_chain_links")  # both rooms damaged
    real_bounds = definitions._stream_bounds

    def bounds_before_the_last_event(rooms_):
        low, high = real_bounds(rooms_)
        return low, high - 1  # the last stored event (of the second room) came "during the job"

    monkeypatch.setattr(definitions, "_stream_bounds", bounds_before_the_last_event)
    fix = run_job("rebuild_chain_cover")
    assert fix.status == JobRun.Status.SUCCEEDED, fix.error
    assert "1 room(s)" in fix.difference_sample[0]["note"]
    linked_rooms = {r for (r,) in rows("SELECT DISTINCT room_id FROM event_auth_chain_links")}
    assert linked_rooms == {built[0].room_id}


def test_rooms_straddling_arrow_batches_are_indexed_whole():
    # the Python pass streams a partition's batches (sorted by room): a room cut by a batch
    # boundary, or spanning several batches, must still be one pass over all its rows
    import pandas as pd

    from jobs.chain_cover_job import room_chain_cover, rooms_of_sorted_batches

    data = sorted(event_rows(rooms()), key=lambda r: r[0])
    frame = pd.DataFrame(data, columns=list(EVENTS_COLUMNS))
    whole = pd.concat([room_chain_cover(g) for _, g in frame.groupby("room_id")], ignore_index=True)

    def rows(frames):
        out = pd.concat(list(frames), ignore_index=True)
        return sorted(tuple(None if pd.isna(v) else v for v in r) for r in out.itertuples(index=False))

    for size in (1, 7, 40, 41, len(frame)):
        batches = [frame.iloc[i:i + size] for i in range(0, len(frame), size)]
        assert rows(rooms_of_sorted_batches(iter(batches))) == rows([whole]), size


def test_links_on_one_side_only_count_with_their_multiplicity(spark):
    from jobs.chain_cover_job import chain_cover_differences

    pos = "room_id string, event_id string, chain_id long, sequence_number long"
    lnk = ("room_id string, origin_chain_id long, origin_sequence_number long, target_chain_id long, "
           "target_sequence_number long")
    # the same chains (named $a, $b) under other numbers on each side
    expected_positions = spark.createDataFrame([("!r", "$a", 1, 1), ("!r", "$b", 2, 1), ("!r", "$c", 2, 2)], pos)
    stored_positions = spark.createDataFrame([("!r", "$a", 7, 1), ("!r", "$b", 9, 1), ("!r", "$c", 9, 2)], pos)
    expected_links = spark.createDataFrame([("!r", 2, 2, 1, 1), ("!r", 2, 2, 1, 1), ("!r", 2, 1, 1, 1)], lnk)
    stored_links = spark.createDataFrame([("!r", 9, 2, 7, 1), ("!r", 9, 1, 7, 1), ("!r", 9, 1, 7, 1),
                                          ("!r", 9, 1, 7, 1), ("!r", 7, 1, 9, 1)], lnk)
    got = sorted(((r.event_id, r.expected, r.found) for r in chain_cover_differences(
        expected_positions, expected_links, stored_positions, stored_links).collect()), key=str)
    assert got == sorted([("$a", None, "link $a 1 -> $b 1"), ("$b", "link $b 2 -> $a 1", None),
                          ("$b", None, "link $b 1 -> $a 1"), ("$b", None, "link $b 1 -> $a 1")], key=str)
