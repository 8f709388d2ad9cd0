import pytest
from django.core.exceptions import ImproperlyConfigured

from streams.conf import parse_stream_writers, stream_writers
from streams.registry import STREAMS, BackingTable, StreamSpec, declare


def test_parse():
    assert parse_stream_writers("events=master,w1; receipts = w2") == {
        "events": ("master", "w1"), "receipts": ("w2",),
    }
    assert parse_stream_writers("") == {}


@pytest.mark.parametrize("text", ["events", "events=", "=w1", "events=w1,w1"])
def test_parse_errors(text):
    with pytest.raises(ImproperlyConfigured):
        parse_stream_writers(text)


def test_defaults_every_stream_to_master():
    writers = stream_writers("", vendor="postgresql")
    assert writers["events"] == ("master",)
    assert writers["backfill"] == ("master",)
    assert writers["caches"] is None  # any process may write
    assert set(writers) == set(STREAMS)


def test_backfill_follows_events_writers():
    writers = stream_writers("events=w1,w2", vendor="postgresql")
    assert writers["backfill"] == ("w1", "w2")


def test_several_writers_on_sqlite_is_a_configuration_error():
    with pytest.raises(ImproperlyConfigured, match="needs PostgreSQL"):
        stream_writers("events=w1,w2", vendor="sqlite")
    assert stream_writers("events=w1", vendor="sqlite")["events"] == ("w1",)


@pytest.mark.parametrize("text, message", [
    ("account_data=w1,w2", "exactly one writer"),
    ("nope=w1", "unknown stream"),
    ("backfill=w1", "events writers"),
    ("caches=w1", "any process"),
])
def test_invalid_layouts(text, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        stream_writers(text, vendor="postgresql")


def test_sqlite_multi_writer_fails_at_startup(tmp_path):
    """The configuration error surfaces when the process starts, not at the first write."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3",
           "STREAM_WRITERS": "receipts=w1,w2", "STATE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=root, env=env,
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "needs PostgreSQL" in result.stderr


def test_registry_rejects_duplicates_and_missing_sequence():
    with pytest.raises(ValueError, match="twice"):
        declare(StreamSpec("events"))
    from streams.models import Receipt

    with pytest.raises(ValueError, match="sequence"):
        declare(StreamSpec("x_no_seq", tables=(BackingTable(Receipt),)))
    assert "x_no_seq" not in STREAMS


def test_registry_wire_formats():
    assert STREAMS["events"].row_fields == (
        "event_id", "room_id", "type", "state_key", "redacts", "relates_to", "membership", "rejected", "outlier",
    )
    assert STREAMS["backfill"].row_fields == ("event_id", "room_id", "type", "state_key", "redacts", "relates_to")
    assert STREAMS["receipts"].row_fields == ("room_id", "receipt_type", "user_id", "event_id", "thread_id", "data")
    assert STREAMS["caches"].row_fields == ("cache_func", "keys", "invalidation_ts")
    assert STREAMS["account_data"].row_fields == ("user_id", "room_id", "account_data_type")
    assert STREAMS["to_device"].row_fields == ("user_id",)
    assert STREAMS["typing"].row_fields == ("room_id", "user_ids")
    assert not STREAMS["typing"].db_backed
    ev = STREAMS["events"].tables[0]
    assert ev.to_wire(["$e", "!r", "m.room.member", "@u", None, None, "join", False, False]) == [
        "ev", ["$e", "!r", "m.room.member", "@u", None, None, "join", False, False]]
    assert STREAMS["events"].tables[2].to_wire(["!r", "m.room.name", "", "$e"]) == ["state", ["!r", "m.room.name", "", "$e"]]
    assert STREAMS["backfill"].tables[0].to_wire(["$e", "!r", "t", None, None, None]) == ["$e", "!r", "t", None, None, None]
