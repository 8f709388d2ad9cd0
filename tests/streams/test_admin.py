"""The fact tables in the Django admin: read-only, searchable and filterable, event JSON
shown exactly and pretty, and the panel hook for event storage."""
import json
import random

import pytest
from django.utils.html import format_html

from rooms.event_panels import EVENT_DETAIL_PANELS, event_detail_panel
from rooms.models import Event
from streams.conf import stream_writers
from streams.models import Receipt
from streams.runtime import StreamRuntime

pytestmark = pytest.mark.django_db(transaction=True)

FACT_ADMIN_PAGES = ["rooms/event", "rooms/currentstatedelta", "streams/receipt", "streams/cacheinvalidation",
                    "streams/accountdata", "streams/deviceinbox", "streams/streamposition", "streams/streamreservation"]


def event_fields(n: int, room: str, sender: str, raw: bytes) -> dict:
    fields = Event.synthetic(random.Random(n), n)
    fields.update(room_id=room, sender=sender, json=raw)
    return fields


@pytest.fixture
def facts():
    rt = StreamRuntime(instance_name="master", writers=stream_writers(""))
    try:
        # Stored bytes with odd spacing and key order, and non-ASCII: shown exactly as stored.
        raw = '{"type":"m.room.message",  "sender":"@ann:test","content":{"body":"h\\u00e9llo ✓"},"room_id":"!a:test"}'.encode()
        events = rt.writer("events").append([
            [(Event, event_fields(1, "!a:test", "@ann:test", raw))],
            [(Event, event_fields(2, "!b:test", "@bob:test", b'{"type":"m.room.message"}'))],
            [(Event, event_fields(3, "!a:test", "@bob:test", b'{"type":"m.room.message"}'))],
        ])
        receipts = rt.writer("receipts").append(
            [[(Receipt, Receipt.synthetic(random.Random(n), n))] for n in range(5)])
        yield {"events": events, "receipts": receipts, "raw": raw}
    finally:
        rt.close()


def changelist_ids(response, column="stream_ordering"):
    return sorted(getattr(obj, column) for obj in response.context["cl"].result_list)


@pytest.mark.parametrize("model", FACT_ADMIN_PAGES)
def test_every_fact_table_is_read_only(admin_client, facts, model):
    listing = admin_client.get(f"/admin/{model}/")
    assert listing.status_code == 200
    assert admin_client.get(f"/admin/{model}/add/").status_code == 403
    assert listing.context["has_add_permission"] is False
    assert f'href="/admin/{model}/add/"'.encode() not in listing.content
    actions = listing.context["cl"].model_admin.get_actions(listing.wsgi_request)
    assert "delete_selected" not in actions


def test_event_cannot_be_changed_or_deleted_through_the_admin(admin_client, facts):
    event = Event.objects.get(stream_ordering=facts["events"][0])
    detail = admin_client.get(f"/admin/rooms/event/{event.pk}/change/")
    assert detail.status_code == 200
    assert b'name="_save"' not in detail.content
    posted = admin_client.post(f"/admin/rooms/event/{event.pk}/change/", {"room_id": "!evil:test"})
    assert posted.status_code == 403
    assert admin_client.post(f"/admin/rooms/event/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    event.refresh_from_db()
    assert event.room_id == "!a:test"


def test_filters_by_room_sender_type_stream_id_and_writer(admin_client, facts):
    e1, e2, e3 = facts["events"]
    assert changelist_ids(admin_client.get("/admin/rooms/event/?by_room_id=!a:test")) == [e1, e3]
    assert changelist_ids(admin_client.get("/admin/rooms/event/?by_sender=@bob:test")) == [e2, e3]
    assert changelist_ids(admin_client.get("/admin/rooms/event/?by_room_id=!a:test&by_sender=@bob:test")) == [e3]
    assert changelist_ids(admin_client.get(f"/admin/rooms/event/?sid_from={e2}")) == [e2, e3]
    assert changelist_ids(admin_client.get(f"/admin/rooms/event/?sid_from={e1}&sid_to={e2}")) == [e1, e2]
    assert changelist_ids(admin_client.get("/admin/rooms/event/?type__exact=m.room.message")) == [e1, e2, e3]
    assert changelist_ids(admin_client.get("/admin/rooms/event/?instance_name__exact=master")) == [e1, e2, e3]
    assert changelist_ids(admin_client.get("/admin/rooms/event/?instance_name__exact=other")) == []
    # A number in the search box finds the fact with that stream ID.
    assert changelist_ids(admin_client.get(f"/admin/rooms/event/?q={e2}")) == [e2]
    r = facts["receipts"]
    assert changelist_ids(admin_client.get(f"/admin/streams/receipt/?sid_to={r[1]}"), "stream_id") == r[:2]


def test_a_stream_id_filter_that_is_not_a_number_says_so(admin_client, facts):
    response = admin_client.get("/admin/rooms/event/?sid_from=abc", follow=True)
    assert response.status_code == 200
    assert changelist_ids(response) == []
    assert "is not a whole number" in response.content.decode()


def test_event_detail_shows_json_exactly_and_pretty(admin_client, facts):
    event = Event.objects.get(stream_ordering=facts["events"][0])
    body = admin_client.get(f"/admin/rooms/event/{event.pk}/change/").content.decode()
    exact = body.split('<pre class="event-json exact">')[1].split("</pre>")[0]
    pretty = body.split('<pre class="event-json pretty">')[1].split("</pre>")[0]
    import html

    assert html.unescape(exact) == facts["raw"].decode()
    assert html.unescape(pretty) == json.dumps(json.loads(facts["raw"]), indent=2, ensure_ascii=False)
    assert "<h3>DAG edges</h3>" in body  # the room store's panels (tests/rooms/storage/test_admin_panels.py)


def test_event_detail_shows_added_panels(admin_client, facts):
    event = Event.objects.get(stream_ordering=facts["events"][0])

    @event_detail_panel("Extra")
    def state_group(ev):
        return format_html("<p class='state-group'>group of {}</p>", ev.event_id)

    try:
        body = admin_client.get(f"/admin/rooms/event/{event.pk}/change/").content.decode()
    finally:
        EVENT_DETAIL_PANELS.remove(("Extra", state_group))
    assert "<h3>Extra</h3>" in body
    # A panel's HTML is trusted only when built safely (format_html); plain text is escaped.
    assert f"<p class='state-group'>group of {event.event_id}</p>" in body


def test_admin_index_and_positions_page_carry_the_live_panel(admin_client, facts):
    for path in ("/admin/", "/admin/streams/streamposition/"):
        body = admin_client.get(path).content.decode()
        assert 'data-live="streams"' in body and "/static/dashboard/live.js" in body
        assert f'data-stream="receipts" data-writer="master">{facts["receipts"][-1]}<' in body


def test_event_detail_shows_when_it_was_received_as_a_time(admin_client, facts):
    """The stored milliseconds since the epoch read as the one time format (UTC), the number
    still there in the tooltip, not as "Received at (ms): 1700000000001"."""
    event = Event.objects.get(stream_ordering=facts["events"][0])
    assert event.received_ts == 1_700_000_000_001
    body = admin_client.get(f"/admin/rooms/event/{event.pk}/change/").content.decode()
    assert ('<time datetime="2023-11-14T22:13:20.001+00:00" title="1700000000001 ms since 1970-01-01 UTC">'
            "2023-11-14 22:13:20 UTC</time>") in body
    assert "(ms)" not in body


def test_list_cells_wrap_identifiers_only_after_their_separators(admin_client, facts):
    """Text columns carry a <wbr> after each separator (so the browser breaks there, never
    mid-word); their cells keep their field-<name> class and still sort by the field."""
    body = admin_client.get("/admin/rooms/event/").content.decode()
    assert '<td class="field-room_id">!a:<wbr>test</td>' in body
    assert '<td class="field-type">m.<wbr>room.<wbr>message</td>' in body
    assert '<td class="field-sender">@ann:<wbr>test</td>' in body
    by_room = admin_client.get("/admin/rooms/event/?o=2")  # column 2 (from 0): room ID
    assert [e.room_id for e in by_room.context["cl"].result_list] == ["!a:test", "!a:test", "!b:test"]
