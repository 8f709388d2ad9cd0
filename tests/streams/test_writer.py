"""The write path (StreamWriter + write_facts) and the append-only rule, on PostgreSQL and SQLite."""
from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from io import StringIO
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connections
from hypothesis import given, settings
from hypothesis import strategies as st

from rooms.models import Event
from streams.conf import stream_writers
from streams.direction import BACKWARDS
from streams.models import FactsAreAppendOnly, Receipt, StreamPosition
from streams.notifier import PositionAdvanced
from streams.runtime import StreamRuntime
from streams.writer import json_text_encoder

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
BOTH = pytest.mark.parametrize("using", ["default", "sqlite"])


@pytest.fixture
def make_runtime():
    made = []

    def make(using="default", instance="master", writers=""):
        vendor = connections[using].vendor
        rt = StreamRuntime(instance_name=instance, writers=stream_writers(writers, vendor=vendor), using=using)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()


@BOTH
def test_append_writes_rows_and_advances(make_runtime, using):
    rt = make_runtime(using)
    seen: list[PositionAdvanced] = []
    rt.notifier.subscribe(seen.append)
    w = rt.writer("receipts")
    rng = random.Random(1)
    start = w.generator.get_current_token()
    ids = w.append([[(Receipt, Receipt.synthetic(rng, i))] for i in range(5)])
    assert ids == list(range(start + 1, start + 6))
    assert list(Receipt.objects.using(using).order_by("stream_id").values_list("stream_id", flat=True)) == ids
    assert w.generator.get_current_token() == ids[-1]
    assert StreamPosition.objects.using(using).get(stream_name="receipts", instance_name="master").stream_id == ids[-1]
    assert seen == [PositionAdvanced("receipts", "master", start, ids[-1])]


@BOTH
def test_multi_row_fact_shares_one_id(make_runtime, using):
    rt = make_runtime(using)
    w = rt.writer("events")
    from rooms.models import CurrentStateDelta

    rng = random.Random(2)
    ev = Event.synthetic(rng, 0) | {"type": "m.room.name", "state_key": ""}
    (sid,) = w.append([[(Event, ev), (CurrentStateDelta, {
        "room_id": ev["room_id"], "type": "m.room.name", "state_key": "", "event_id": ev["event_id"]})]])
    assert Event.objects.using(using).get().stream_ordering == sid
    assert CurrentStateDelta.objects.using(using).get().stream_id == sid


@BOTH
def test_failed_write_completes_and_leaves_nothing(make_runtime, using):
    """A transaction that fails mid-way writes no row, and its ID still completes."""
    rt = make_runtime(using)
    w = rt.writer("receipts")
    rng = random.Random(3)
    good = Receipt.synthetic(rng, 0)
    bad = dict(good)
    del bad["room_id"]  # required column missing
    with pytest.raises(ValueError, match="room_id is required"):
        w.append([[(Receipt, good)], [(Receipt, bad)]])
    assert Receipt.objects.using(using).count() == 0
    ids = w.append([[(Receipt, good)]])
    # The two failed IDs completed (zero rows), so the position passes them.
    assert w.generator.get_current_token() == ids[0]
    assert w.generator.pending() == []


def test_database_error_rolls_back_and_completes(make_runtime):
    rt = make_runtime()
    w = rt.writer("events")
    ev = Event.synthetic(random.Random(4), 0)
    w.append([[(Event, ev)]])
    with pytest.raises(IntegrityError):
        w.append([[(Event, ev | {"received_ts": 1})]])  # duplicate event_id
    assert Event.objects.count() == 1
    assert w.generator.pending() == []
    assert w.generator.get_current_token() == w.generator.get_max_allocated_token()


def test_backfill_counts_down(make_runtime):
    rt = make_runtime()
    w = rt.writer("backfill")
    rng = random.Random(5)
    ids = w.append([[(Event, Event.synthetic(rng, i))] for i in range(3)])
    assert ids == sorted(ids, reverse=True) and ids[0] < 0
    assert w.generator.get_current_token() == ids[-1]
    assert sorted(Event.objects.values_list("stream_ordering", flat=True)) == sorted(ids)


def test_writer_rejects_foreign_table(make_runtime):
    rt = make_runtime()
    with pytest.raises(ValueError, match="not a backing table"):
        rt.writer("receipts").append([[(Event, Event.synthetic(random.Random(), 0))]])


@BOTH
def test_facts_are_append_only(make_runtime, using):
    rt = make_runtime(using)
    rt.writer("receipts").append([[(Receipt, Receipt.synthetic(random.Random(6), 0))]])
    r = Receipt.objects.using(using).get()
    with pytest.raises(FactsAreAppendOnly):
        r.save(using=using)
    with pytest.raises(FactsAreAppendOnly):
        r.delete()
    with pytest.raises(FactsAreAppendOnly):
        Receipt.objects.using(using).update(user_id="@x:hs")
    with pytest.raises(FactsAreAppendOnly):
        Receipt.objects.using(using).all().delete()
    assert Receipt.objects.using(using).get().user_id == r.user_id


def test_write_facts_command():
    out = StringIO()
    call_command("write_facts", "account_data", "--count", "25", "--per-txn", "10", "--no-progress", stdout=out)
    from streams.models import AccountData

    assert AccountData.objects.count() == 25
    ids = list(AccountData.objects.order_by("stream_id").values_list("stream_id", flat=True))
    assert len(set(ids)) == 25
    assert f"IDs {ids[0]}..{ids[-1]}" in out.getvalue()
    # The closing line says what "linear" means, so a low one does not read like an error.
    assert "(linear: the highest ID up to which every writer of account_data has finished" in out.getvalue()


def test_write_facts_stamps_each_fact(tmp_path):
    stamps = tmp_path / "stamps.txt"
    before = time.time()
    call_command("write_facts", "account_data", "--count", "7", "--per-txn", "3", "--no-progress",
                 "--stamps", str(stamps), stdout=StringIO())
    from streams.models import AccountData

    lines = [line.split() for line in stamps.read_text().splitlines()]
    assert sorted(int(i) for i, _ in lines) == sorted(AccountData.objects.values_list("stream_id", flat=True))
    assert all(before <= float(t) <= time.time() for _, t in lines)


def test_write_facts_stops_after_its_transaction_on_sigterm():
    """SIGTERM (sent here from the rate limiter's sleep, between two transactions) ends the
    loop: what was written is complete and the command returns normally."""
    from streams.models import AccountData

    real_sleep = time.sleep
    slept = []
    written_at_signal = []
    me = threading.current_thread()

    def sleep_then_sigterm(delay):
        if threading.current_thread() is not me:  # (time.sleep is patched for every thread)
            return real_sleep(delay)
        slept.append(delay)
        if len(slept) == 2:
            # The limiter sleeps only when ahead of schedule, so on a loaded machine more
            # than two transactions may precede this second sleep: count what is written.
            written_at_signal.append(AccountData.objects.count())
            os.kill(os.getpid(), signal.SIGTERM)
        real_sleep(min(delay, 0.01))

    handler = signal.getsignal(signal.SIGTERM)
    out = StringIO()
    with mock.patch.object(time, "sleep", sleep_then_sigterm):
        call_command("write_facts", "account_data", "--count", "1000", "--per-txn", "2", "--rate", "100",
                     "--no-progress", stdout=out)
    # nothing after the signal, and only whole transactions of 2 before it
    written = written_at_signal[0]
    assert written >= 4 and written % 2 == 0
    assert AccountData.objects.count() == written
    assert f"wrote {written} facts" in out.getvalue()
    assert signal.getsignal(signal.SIGTERM) is handler  # put back


def test_write_facts_rate_limit():
    t0 = time.monotonic()
    call_command("write_facts", "caches", "--count", "10", "--rate", "50", "--no-progress", stdout=StringIO())
    # 10 facts at 50/s: the last one is due at 0.2 s. (A lower bound only: never a ceiling.)
    assert time.monotonic() - t0 >= 0.18


@pytest.mark.parametrize("args, message", [
    (["typing", "--count", "1", "--url", "http://127.0.0.1:9"], "could not reach the typing writer"),
    (["typing", "--count", "1", "--per-txn", "0"], "--per-txn"),
    (["nope", "--count", "1"], "unknown stream"),
    (["receipts", "--count", "1", "--per-txn", "0"], "--per-txn"),
    (["receipts", "--count", "-1"], "--count"),
    (["receipts", "--count", "1", "--concurrency", "0"], "--concurrency"),
    (["backfill", "--count", "1"], "does not write backfill"),
])
def test_write_facts_bad_input(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("write_facts", *args, stdout=StringIO())


def test_write_facts_as_non_writer(settings):
    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "INSTANCE_NAME": "worker9"}
    from django.apps import apps

    apps.get_app_config("streams").runtime = None
    try:
        with pytest.raises(CommandError, match="not a writer"):
            call_command("write_facts", "receipts", "--count", "1", stdout=StringIO())
    finally:
        apps.get_app_config("streams").runtime = None


@BOTH
def test_rows_stored_exactly_as_given(make_runtime, using):
    """Batched inserts (COPY on PostgreSQL) keep every value: JSON, bytes, nulls, booleans, and
    text with COPY's special characters (tab, newline, backslash, \\N)."""
    rt = make_runtime(using)
    rng = random.Random(7)
    receipts = [Receipt.synthetic(rng, i) for i in range(5)]
    receipts[1]["thread_id"] = "$thread:hs"
    receipts[3] |= {"thread_id": "\\N", "user_id": "@a\tb\nc\\d\r:hs", "data": {"s": "\\N\t\\\n"}}
    receipts[4]["thread_id"] = ""
    receipts[2]["data"] = {"nested": {"list": [1, 2.5, None, "é\u2603"], "big": 2**60}, "empty": {}}
    ids = rt.writer("receipts").append([[(Receipt, r)] for r in receipts])
    stored = {r.stream_id: r for r in Receipt.objects.using(using).all()}
    for sid, sent in zip(ids, receipts):
        got = stored[sid]
        assert {k: getattr(got, k) for k in sent} == sent
        assert got.instance_name == "master"

    events = [Event.synthetic(rng, i) for i in range(3)]
    events[0]["json"] = b'{"weird":  "\\u00e9",\n "n": 12345678901234567890}'
    events[1] |= {"outlier": True, "rejected": True, "state_key": "", "membership": "join"}
    events[2]["json"] = bytes(range(256)) + b"\\N\t\n\\"
    ids = rt.writer("events").append([[(Event, e)] for e in events])
    for sid, sent in zip(ids, events):
        got = Event.objects.using(using).get(stream_ordering=sid)
        assert {k: (bytes(getattr(got, k)) if k == "json" else getattr(got, k)) for k in sent} == sent


def test_batched_insert_errors_are_django_errors(make_runtime):
    rt = make_runtime()
    w = rt.writer("events")
    ev = Event.synthetic(random.Random(8), 0)
    with pytest.raises(IntegrityError):
        w.append([[(Event, ev)], [(Event, ev)]])  # duplicate event_id within one batch
    assert Event.objects.count() == 0
    assert w.generator.pending() == []


def test_write_facts_concurrency_keeps_transactions_in_flight_and_positions_contiguous():
    """--concurrency 4: several transactions open at once on their own connections; every fact
    written once, the writer's position published in order over contiguous IDs only."""
    import threading

    from streams.models import StreamReservation
    from streams.runtime import runtime

    rt = runtime()
    writer = rt.writer("receipts")
    start = writer.generator.get_current_token()
    seen: list[PositionAdvanced] = []
    unsubscribe = rt.notifier.subscribe(seen.append)
    # The first two transactions each wait inside their open transaction until the other is
    # open too: proof that two are in flight at once (and the second completes its IDs first).
    # (append runs the transaction itself: BEGIN with the reservation, then in _commit_rows
    # the rows, completion, COMMIT; the first two wait there, their IDs reserved, until both are.)
    both_open = threading.Barrier(2, timeout=30)
    backends: set[int] = set()
    real_commit_rows = writer._commit_rows
    calls = []

    def commit_rows(by_model, sql, params, **kwargs):
        backends.add(connections["default"].connection.info.backend_pid)
        calls.append(by_model)
        if len(calls) <= 2:
            both_open.wait()
        real_commit_rows(by_model, sql, params, **kwargs)

    out = StringIO()
    try:
        with mock.patch.object(writer, "_commit_rows", commit_rows):
            call_command("write_facts", "receipts", "--count", "500", "--per-txn", "10", "--concurrency", "4",
                         "--seed", "5", "--no-progress", stdout=out)
    finally:
        unsubscribe()
    ids = list(Receipt.objects.order_by("stream_id").values_list("stream_id", flat=True))
    assert len(ids) == len(set(ids)) == 500
    assert len(backends) >= 2
    assert "4 transactions in flight" in out.getvalue()
    assert f"IDs {ids[0]}..{ids[-1]}" in out.getvalue()
    # advances chain: each starts where the previous ended, up to the last ID written
    assert seen and seen[0].prev_token == start and seen[-1].new_token == ids[-1]
    assert all(a.new_token == b.prev_token for a, b in zip(seen, seen[1:]))
    assert StreamPosition.objects.get(stream_name="receipts", instance_name="master").stream_id == ids[-1]
    assert not StreamReservation.objects.filter(stream_name="receipts").exists()
    # the same rows as one transaction at a time would write, for the same seed
    rng = random.Random(5)
    assert sorted(Receipt.objects.values_list("event_id", flat=True)) == \
        sorted(Receipt.synthetic(rng, n)["event_id"] for n in range(500))


def test_wire_journal_takes_in_stream_order():
    from streams.writer import WireJournal

    journal = WireJournal()
    journal.record([5, 3, 4], {3: [["c"]], 5: [["e"]]})
    journal.record([7, 6], {})
    assert journal.take(3, 6) == [(4, []), (5, [["e"]]), (6, [])]
    assert len(journal) == 2
    backwards = WireJournal()  # backwards streams: external IDs negative, taken by factor * id
    backwards.record([-2, -4, -3], {-3: [["x"]]})
    assert backwards.take(1, 3, BACKWARDS) == [(-2, []), (-3, [["x"]])]
    assert len(backwards) == 1


def test_wire_row_of_a_written_row_is_the_tables_row_format():
    """The writing thread's one-call wire row (``_wire_maker``) is the table's own row format
    of the wire fields, for every table any stream writes (both the plain list and the
    tables with a format of their own)."""
    from streams.models import FactModel
    from streams.registry import STREAMS
    from streams.writer import _wire_maker

    tables = [t for spec in STREAMS.values() for t in spec.tables if issubclass(t.model, FactModel)]
    assert any(t.wire_row is None and "wire_row" not in vars(t.model) for t in tables)
    assert any("wire_row" in vars(t.model) for t in tables)
    for table in tables:
        names = [f.name for f in table.model._meta.concrete_fields]
        index = [names.index(name) for name in table.fields]
        raw = tuple(f"value of {name}" for name in names)
        assert _wire_maker(index, table)(raw) == table.to_wire([raw[i] for i in index]), table.model


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_json_text_encoder_writes_what_json_dumps_writes(value):
    """The writer's JSON for COPY (an encoder built once) is json.dumps's text."""
    assert json_text_encoder(None)(value) == json.dumps(value)


def test_json_text_encoder_refuses_what_json_dumps_refuses():
    with pytest.raises(TypeError, match="not JSON serializable"):
        json_text_encoder(None)({"x": object()})
