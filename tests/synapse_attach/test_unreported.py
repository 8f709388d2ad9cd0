"""The unreported-ID rule (synapse_attach/unreported.py), by value with a fake clock."""
from synapse_attach.unreported import MAX_CHECKPOINTS, UnreportedTracker, covered, observe_report


def test_an_id_in_flight_for_a_moment_is_never_overdue():
    t = UnreportedTracker(after=60)
    assert t.observe("events", 11, 10, now=0).count == 1
    # reported within seconds, as every healthy write is
    u = t.observe("events", 11, 11, now=3)
    assert (u.count, u.age, u.overdue) == (0, 0.0, False)
    # a busy stream: always something in flight, never the same IDs for long
    for i in range(100):
        u = t.observe("events", 20 + 2 * i, 19 + 2 * i, now=5 + 5 * i)
        assert u.count == 1 and u.age == 0.0 and not u.overdue


def test_an_id_never_reported_is_overdue_after_the_threshold_and_clears_when_covered():
    t = UnreportedTracker(after=60)
    t.observe("receipts", 5, 5, now=0)
    assert t.observe("receipts", 7, 5, now=10).age == 0
    u = t.observe("receipts", 9, 5, now=40)
    assert (u.count, u.age, u.overdue) == (4, 30, False)
    u = t.observe("receipts", 9, 5, now=70)
    assert (u.count, u.age, u.overdue) == (4, 60, True)
    # the cover passes the first batch: the age is the second batch's (first seen at 40)
    u = t.observe("receipts", 9, 7, now=80)
    assert (u.count, u.age, u.overdue) == (2, 40, False)
    u = t.observe("receipts", 9, 9, now=81)
    assert (u.count, u.overdue) == (0, False)


def test_checkpoints_stay_bounded_and_keep_the_oldest():
    t = UnreportedTracker(after=60)
    for i in range(10 * MAX_CHECKPOINTS):
        u = t.observe("presence", 100 + i, 50, now=i)
    assert len(t._checkpoints["presence"]) <= MAX_CHECKPOINTS + 1
    assert u.age == 10 * MAX_CHECKPOINTS - 1 and u.overdue


def test_the_cover_is_the_highest_of_rows_stored_ids_and_live_positions():
    assert covered(None, 3, 9, None, 4) == 9 and covered() == 0
    streams = [
        # an idle writer's old row does not hold anything back: the other's row and the stored IDs cover
        {"stream": "events", "replicated": True, "allocated": 30, "max_stored": 29, "persisted_upto": 20,
         "writers": [{"instance": "master", "position": 12}, {"instance": "persister1", "position": 29}]},
        # a failed write's ID: no row, no stored row, but the writer announced its position past it
        {"stream": "receipts", "replicated": True, "allocated": 8, "max_stored": 7, "persisted_upto": 7,
         "writers": [{"instance": "master", "position": 7}]},
        {"stream": "typing", "replicated": True, "allocated": None, "max_stored": None, "persisted_upto": None,
         "writers": []},
    ]
    live = {"receipts": {"highest": 8}}
    got = {u.stream: u.count for u in observe_report(UnreportedTracker(), streams, live, now=0)}
    assert got == {"events": 1, "receipts": 0}
    got = {u.stream: u.count for u in observe_report(UnreportedTracker(), streams, {}, now=0)}
    assert got == {"events": 1, "receipts": 1}


def test_ids_a_never_written_streams_schema_handed_out_are_not_unreported():
    """Synapse's schema delta 92/08 calls nextval on thread_subscriptions_sequence: ID 2 is
    handed out and no writer ever reports it (seen on the real fixture)."""
    t = UnreportedTracker(after=60)
    stream = {"stream": "thread_subscriptions", "replicated": True, "allocated": 2, "max_stored": 0,
              "persisted_upto": 1, "writers": []}
    for now in (0, 100, 200):
        [u] = observe_report(t, [stream], {}, now=now)
        assert (u.count, u.overdue) == (0, False)
    # the first write taken and never finished still counts
    for now in (205, 300):
        [u] = observe_report(t, [{**stream, "allocated": 3}], {}, now=now)
    assert (u.count, u.age, u.overdue) == (1, 95, True)
    # a stream that has been written is never taken for schema IDs
    t = UnreportedTracker(after=60)
    written = {**stream, "allocated": 9, "max_stored": 7, "writers": [{"instance": "master", "position": 7}]}
    for now in (0, 61):
        [u] = observe_report(t, [written], {}, now=now)
    assert (u.count, u.overdue) == (2, True)
