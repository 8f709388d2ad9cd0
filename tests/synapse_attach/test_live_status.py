"""The observer's view handed to the web processes (synapse_attach/live_status.py): published
to the database, then read by /status.json and /metrics through the real views."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from synapse_attach.live_status import publish
from synapse_attach.observer import SynapseObserver
from tests.dashboard.test_views import staff_client  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db

ALERTS = Path(__file__).resolve().parents[2] / "contrib" / "prometheus" / "synapse_attach_alerts.yml"


def stuck_view() -> dict:
    """persister1 stopped at 10 while master moved on for 20 s (threshold 10 s)."""
    o = SynapseObserver(stuck_after=10.0, started=0.0)
    o.observe_line("POSITION events persister1 9 10", 0.0)
    o.observe_line('RDATA events persister1 10 ["ev",[]]', 0.0)
    for t in range(1, 21):
        o.observe_line(f'RDATA events master {10 + t} ["ev",[]]', float(t))
    o.observe_line("FEDERATION_ACK fed1 3", 20.0)
    return o.as_dict(21.0)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_status_json_shows_synapses_streams_in_our_shape(staff_client):  # noqa: F811
    publish("attach.test@host", True, stuck_view())
    body = staff_client.get("/status.json").json()
    [observer] = body["synapse"]
    assert observer["source"] == "synapse" and observer["observer"] == "attach.test@host"
    assert observer["subscribed"] is True and observer["stale"] is False
    [events] = observer["streams"]
    assert events["source"] == "synapse" and events["name"] == "events"
    assert events["writers"] == ["master", "persister1"]
    assert events["positions"] == {"master": 30, "persister1": 10}
    assert events["laggard"] == "persister1"
    assert events["writer_status"]["persister1"]["stuck"] is True
    assert observer["stuck"] == [{"stream": "events", "instance": "persister1", "position": 10, "highest": 30,
                                  "behind_seconds": 20.0}]
    assert {i["instance"] for i in observer["instances"]} == {"master", "persister1", "fed1"}


def test_metrics_carry_the_stuck_writer_and_every_metric_the_alerts_name(staff_client):  # noqa: F811
    view = stuck_view()
    view["database"] = database_view()
    publish("attach.test@host", True, view)
    text = staff_client.get("/metrics").content.decode()
    got = samples(text)
    events = lambda writer: (("stream", "events"), ("writer", writer))  # noqa: E731
    assert got[("synapse_repl_synapse_stuck_writer_seconds", events("persister1"))] == 20.0
    assert got[("synapse_repl_synapse_stuck_writer_seconds", events("master"))] == 0
    assert got[("synapse_repl_synapse_writer_position", events("persister1"))] == 10
    assert got[("synapse_repl_synapse_writer_position", events("master"))] == 30
    assert got[("synapse_repl_synapse_writer_facts_total", events("master"))] == 20
    assert got[("synapse_repl_synapse_observer_up", (("observer", "attach.test@host"),))] == 1
    named = set(re.findall(r"\bsynapse_repl_synapse_[a-z_]+", ALERTS.read_text()))
    assert named and named <= {name for name, _ in got}, named - {name for name, _ in got}


def test_a_failing_database_read_is_shown_down_with_the_last_good_read(staff_client):  # noqa: F811
    """The observer keeps showing the last read that worked when a later one fails (the page
    says the error): /metrics says the reads fail rather than leave the figures looking live."""
    good = database_view()
    publish("attach.test@host", True, {**stuck_view(), "database": good})
    observer = (("observer", "attach.test@host"),)
    got = samples(staff_client.get("/metrics").content.decode())
    assert got[("synapse_repl_synapse_database_up", observer)] == 1
    assert got[("synapse_repl_synapse_database_last_read_timestamp_seconds", observer)] == good["read"]
    failing = {**good, "error": "cannot read Synapse's database: connection refused"}
    publish("attach.test@host", True, {**stuck_view(), "database": failing})
    got = samples(staff_client.get("/metrics").content.decode())
    assert got[("synapse_repl_synapse_database_up", observer)] == 0
    assert got[("synapse_repl_synapse_database_last_read_timestamp_seconds", observer)] == good["read"]
    assert got[("synapse_repl_synapse_observer_up", observer)] == 1  # Redis is still heard
    # an observer that never read the database successfully has no read time to give
    publish("attach.test@host", True, {**stuck_view(), "database": {"url": "postgresql://x", "read": None,
                                                                     "error": "refused"}})
    got = samples(staff_client.get("/metrics").content.decode())
    assert got[("synapse_repl_synapse_database_up", observer)] == 0
    assert not any(name == "synapse_repl_synapse_database_last_read_timestamp_seconds" for name, _ in got)
    # one that does not read the database has no such figure
    publish("attach.test@host", True, stuck_view())
    got = samples(staff_client.get("/metrics").content.decode())
    assert not any(name == "synapse_repl_synapse_database_up" for name, _ in got)


def test_a_stale_observer_is_shown_down_and_its_figures_left_out(staff_client):  # noqa: F811
    publish("attach.test@host", True, stuck_view(), now=datetime.now(timezone.utc) - timedelta(seconds=60))
    got = samples(staff_client.get("/metrics").content.decode())
    assert got[("synapse_repl_synapse_observer_up", (("observer", "attach.test@host"),))] == 0
    assert not any(name == "synapse_repl_synapse_stuck_writer_seconds" for name, _ in got)
    assert staff_client.get("/status.json").json()["synapse"][0]["stale"] is True


@pytest.mark.django_db(transaction=True)
def test_the_observer_publishes_again_after_its_database_connection_died():
    """The observer process serves no request, so nothing between requests replaces a dead
    connection: publish_or_reconnect closes it after a failure and the next try works."""
    from django.db import InterfaceError, OperationalError, connection

    from synapse_attach.live_status import observer_statuses
    from synapse_attach.management.commands.synapse_observer import publish_or_reconnect

    publish_or_reconnect("o", True, {"lines": 1})
    connection.connection.close()  # the server side gone (a restart, a network cut)
    with pytest.raises((InterfaceError, OperationalError)):
        publish_or_reconnect("o", True, {"lines": 2})
    publish_or_reconnect("o", True, {"lines": 3})
    assert [s["view"] for s in observer_statuses()] == [{"lines": 3}]


def database_view() -> dict:
    """What the observer's database read adds: events with 3 IDs handed out above every cover
    for 75 s (threshold 60 s), receipts fully reported."""
    streams = [
        {"stream": "events", "replicated": True, "in_memory": False, "allocated": 33, "max_stored": 30,
         "persisted_upto": 10, "persisted_upto_complete": True,
         "writers": [{"instance": "master", "position": 30}, {"instance": "persister1", "position": 10}]},
        {"stream": "receipts", "replicated": True, "in_memory": False, "allocated": 7, "max_stored": 7,
         "persisted_upto": 7, "persisted_upto_complete": True, "writers": [{"instance": "master", "position": 7}]},
        {"stream": "typing", "replicated": True, "in_memory": True, "allocated": None, "max_stored": None,
         "persisted_upto": None, "persisted_upto_complete": None, "writers": []},
    ]
    return {"read": datetime.now(timezone.utc).timestamp(), "error": None, "server_version": "16.4",
            "streams": streams, "findings": [], "unreported_after_seconds": 60.0,
            "unreported": [{"stream": "events", "allocated": 33, "covered": 30, "count": 3, "age_seconds": 75.0,
                            "overdue": True},
                           {"stream": "receipts", "allocated": 7, "covered": 7, "count": 0, "age_seconds": 0.0,
                            "overdue": False}]}


def test_the_streams_page_shows_the_synapse_section(staff_client):  # noqa: F811
    view = stuck_view()
    view["redis"] = {"channel": "attach.test"}
    view["database"] = database_view()
    publish("attach.test@host", True, view)
    html = staff_client.get("/").content.decode()
    section = html.split('<section class="synapse-source"', 1)[1].split("</section>", 1)[0]
    assert "<h2>Synapse attach.test</h2>" in section
    # database position / live position per writer, persisted-upto, allocated with the unreported
    row = section.split('<tr data-stream="events"', 1)[1].split("</tr>", 1)[0]
    assert 'data-writer="persister1">10</span> / <span class="live-position" data-writer="persister1">10<' in row
    assert 'data-writer="master">30</span> / <span class="live-position" data-writer="master">30<' in row
    assert "STUCK 20 s" in row and '<td class="persisted-upto">10</td>' in row
    assert '33 <span class="warn">(3 for 75 s)</span>' in row
    assert "<strong>STUCK</strong> events: persister1 has stayed at 10, below 30" in section
    assert "<strong>UNREPORTED</strong> events: 3 IDs handed out up to 33" in section
    assert "receipts" in section and "(in memory)" in section
    assert 'data-instance="fed1"' in section and "FEDERATION_ACK 1" in section
    got = samples(staff_client.get("/metrics").content.decode())
    assert got[("synapse_repl_synapse_unreported_ids", (("stream", "events"),))] == 3
    assert got[("synapse_repl_synapse_unreported_ids_overdue", (("stream", "events"),))] == 1
    assert got[("synapse_repl_synapse_unreported_ids_overdue", (("stream", "receipts"),))] == 0
    assert got[("synapse_repl_synapse_persisted_upto", (("stream", "events"),))] == 10


def test_the_live_feed_carries_the_section_and_synapse_rates_for_the_chart():
    from dashboard.feed import collect_state

    view = stuck_view()
    view["redis"] = {"channel": "attach.test"}
    publish("attach.test@host", True, view)
    state = collect_state()
    assert "<h2>Synapse attach.test</h2>" in state["attached_html"]
    assert set(state["attached_rates"]) == {"Synapse events"} and state["attached_rates"]["Synapse events"] > 0


def test_the_observers_database_read_is_bounded_in_time_and_a_failure_is_one_line():
    """Nothing listens on the port: the read fails as one line (password masked), is shown
    with the view, and is not retried before DATABASE_INTERVAL has passed."""
    from synapse_attach.live_status import DATABASE_INTERVAL
    from synapse_attach.management.commands.synapse_observer import DatabaseView
    from testing.services import free_port

    database = DatabaseView({"DATABASE_URL": f"postgres://observer:s3cret-pw@127.0.0.1:{free_port()}/synapse",
                             "CONNECT_TIMEOUT_SECONDS": 2})
    view = database.view({}, now=100.0)
    assert view["error"] and "\n" not in view["error"] and "s3cret-pw" not in view["error"]
    read_at = database.read_at
    database.view({}, now=100.0 + DATABASE_INTERVAL / 2)
    assert database.read_at == read_at
    database.view({}, now=100.0 + DATABASE_INTERVAL)
    assert database.read_at == 100.0 + DATABASE_INTERVAL
