"""The catch-up endpoint and the update function behind it (docs/replication.md, "Catch-up")."""
import random

import pytest

from replication.http.replication_secret import bearer_header
from replication.worker.catchup_client import new_txn_id
from rooms.models import CurrentStateDelta, Event
from streams.conf import stream_writers
from streams.models import Receipt
from streams.registry import get_stream
from streams.runtime import StreamRuntime
from streams.updates_since import get_updates_since

pytestmark = pytest.mark.django_db(transaction=True)
URL = "/_synapse/replication/get_repl_stream_updates/{}/"


def url(stream: str) -> str:
    """Synapse's form, with a fresh transaction ID (a repeated one gets a kept answer)."""
    return URL.format(stream) + new_txn_id()


@pytest.fixture
def client(settings):
    """A client that carries REPLICATION_SECRET (here: the one generated into STATE_DIR)."""
    from django.test import Client

    assert settings.REPLICATION_SECRET
    return Client(headers=bearer_header(settings.REPLICATION_SECRET))


@pytest.fixture
def rt():
    rt = StreamRuntime(instance_name="master", writers=stream_writers("receipts=master,w2;events=master"))
    yield rt
    rt.close()


def test_pages_without_splitting_a_token(rt, client):
    rng = random.Random(1)
    w = rt.writer("events")
    facts = []
    for i in range(150):
        ev = Event.synthetic(rng, i)
        rows = [(Event, ev)]
        if i % 3 == 0:  # every third fact has 2 extra state rows
            rows += [(CurrentStateDelta, {"room_id": ev["room_id"], "type": "t", "state_key": str(k),
                                          "event_id": ev["event_id"]}) for k in range(2)]
        facts.append(rows)
    ids = w.append(facts)
    seen: list[tuple[int, list]] = []
    current, pages = ids[0] - 1, 0
    while True:
        data = client.get(url("events"), {"from_token": current, "upto_token": ids[-1],
                                                 "instance_name": "master"}).json()
        pages += 1
        seen += [(t, row) for t, row in data["updates"]]
        tokens = [t for t, _ in data["updates"]]
        assert tokens == sorted(tokens) and all(current < t <= data["upto_token"] for t in tokens)
        current = data["upto_token"]
        if not data["limited"]:
            break
    assert pages > 1
    assert current == ids[-1]
    # Every row exactly once; each fact's rows together, ev row first.
    assert len(seen) == 150 + 2 * 50
    by_token = {}
    for t, row in seen:
        by_token.setdefault(t, []).append(row[0])
    assert sorted(by_token) == ids
    assert all(kinds[0] == "ev" and kinds[1:] == ["state"] * (len(kinds) - 1) for kinds in by_token.values())


def test_one_token_with_more_rows_than_a_page(rt):
    ev = Event.synthetic(random.Random(2), 0)
    rows = [(Event, ev)] + [(CurrentStateDelta, {"room_id": ev["room_id"], "type": "t", "state_key": str(k),
                                                 "event_id": None}) for k in range(150)]
    (sid,) = rt.writer("events").append([rows])
    result = get_updates_since(get_stream("events"), "master", sid - 1, sid + 5)
    assert {t for t, _ in result.updates} == {sid}
    assert len(result.updates) == 151


def test_filters_by_writer_and_defaults_to_this_instance(rt, client):
    rng = random.Random(3)
    ids = rt.writer("receipts").append([[(Receipt, Receipt.synthetic(rng, i))] for i in range(3)])
    data = client.get(url("receipts"), {"from_token": 0, "upto_token": ids[-1]}).json()
    assert [t for t, _ in data["updates"]] == ids
    assert data["upto_token"] == ids[-1] and data["limited"] is False
    other = client.get(url("receipts"), {"from_token": 0, "upto_token": ids[-1], "instance_name": "w2"}).json()
    assert other["updates"] == []


def test_backfill_tokens_are_positive(rt, client):
    rng = random.Random(4)
    ids = rt.writer("backfill").append([[(Event, Event.synthetic(rng, i))] for i in range(2)])
    data = client.get(url("backfill"), {"from_token": 0, "upto_token": -ids[-1]}).json()
    assert [t for t, _ in data["updates"]] == [-i for i in ids]
    assert len(data["updates"][0][1]) == 6


@pytest.mark.parametrize("stream, params, status, message", [
    ("nope", {"from_token": 0, "upto_token": 1}, 400, "Unknown stream"),
    ("events", {"from_token": "x", "upto_token": 1}, 400, "integers"),
    ("events", {"upto_token": 1}, 400, "from_token"),
    ("events", {"from_token": -5, "upto_token": 1}, 400, "negative"),
    ("events", {"from_token": 0, "upto_token": 1, "limit": "x"}, 400, "limit"),
    ("events", {"from_token": 0, "upto_token": 1, "limit": 0}, 400, "limit"),
])
def test_bad_requests(client, stream, params, status, message):
    response = client.get(url(stream), params)
    assert response.status_code == status
    assert message in response.json()["error"]


def test_post_not_allowed(client):
    assert client.post(url("events")).status_code == 405


def test_range_and_page_size_caps(rt, client, settings):
    """REPLICATION_CATCHUP_MAX_RANGE / _MAX_LIMIT: beyond them a 400 that says which cap."""
    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "REPLICATION_CATCHUP_MAX_RANGE": 50,
                             "REPLICATION_CATCHUP_MAX_LIMIT": 20}
    ids = rt.writer("receipts").append([[(Receipt, Receipt.synthetic(random.Random(5), i))]
                                        for i in range(30)])
    base = ids[0] - 1  # the sequence is shared with earlier tests: IDs need not start at 1
    too_long = client.get(url("receipts"), {"from_token": base, "upto_token": base + 51})
    assert too_long.status_code == 400
    assert "REPLICATION_CATCHUP_MAX_RANGE" in too_long.json()["error"]
    too_big = client.get(url("receipts"), {"from_token": base, "upto_token": base + 50, "limit": 21})
    assert too_big.status_code == 400
    assert "REPLICATION_CATCHUP_MAX_LIMIT" in too_big.json()["error"]
    page = client.get(url("receipts"), {"from_token": base, "upto_token": ids[-1], "limit": 20}).json()
    assert [t for t, _ in page["updates"]] == ids[:20] and page["limited"]


def test_worker_asks_for_a_long_range_in_pieces(rt, live_server, settings):
    """fetch_catch_up_page splits a range longer than the cap: the follower keeps asking."""
    from replication.worker.catchup_client import fetch_catch_up_page

    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "REPLICATION_CATCHUP_MAX_RANGE": 10}
    ids = rt.writer("receipts").append([[(Receipt, Receipt.synthetic(random.Random(6), i))]
                                        for i in range(25)])
    start, seen, pages = ids[0] - 1, [], 0
    while True:
        page = fetch_catch_up_page(live_server.url, "receipts", "master", start, ids[-1],
                                   secret=settings.REPLICATION_SECRET, max_range=10)
        pages += 1
        assert page.upto_token - start <= 10
        seen += [t for t, _ in page.updates]
        start = page.upto_token
        if not page.limited:
            break
    assert seen == ids and pages >= 3


def test_worker_asks_for_big_pages_and_falls_back_when_refused(rt, live_server, settings):
    """page_limit (the worker passes REPLICATION_CATCHUP_MAX_LIMIT): one request where the
    server's default of 100 rows would take three; a server capping lower is asked again
    without a limit instead of failing forever."""
    from replication.worker.catchup_client import fetch_catch_up_page

    ids = rt.writer("receipts").append([[(Receipt, Receipt.synthetic(random.Random(7), i))]
                                        for i in range(250)])
    start = ids[0] - 1
    default = fetch_catch_up_page(live_server.url, "receipts", "master", start, ids[-1],
                                  secret=settings.REPLICATION_SECRET)
    assert len(default.updates) == 100 and default.limited
    big = fetch_catch_up_page(live_server.url, "receipts", "master", start, ids[-1],
                              secret=settings.REPLICATION_SECRET, page_limit=1000)
    assert [t for t, _ in big.updates] == ids and not big.limited
    settings.SYNAPSE_REPL = {**settings.SYNAPSE_REPL, "REPLICATION_CATCHUP_MAX_LIMIT": 50}
    refused = fetch_catch_up_page(live_server.url, "receipts", "master", start, ids[-1],
                                  secret=settings.REPLICATION_SECRET, page_limit=1000)
    assert [t for t, _ in refused.updates] == ids[:50] and refused.limited


# --- Synapse's transaction IDs ---------------------------------------------------------------


def test_a_repeated_txn_id_gets_the_first_answer_whatever_is_asked(rt, client):
    """As Synapse (checked against the real one in tests/interop/): the answer is kept under the
    txn_id alone for 30 minutes, so a reused ID gets a stale answer -- for any stream, any
    tokens. This is why the worker must never reuse one."""
    rng = random.Random(8)
    w = rt.writer("receipts")
    first_ids = w.append([[(Receipt, Receipt.synthetic(rng, i))] for i in range(2)])
    txn = URL.format("receipts") + "same-txn-id"
    first = client.get(txn, {"from_token": first_ids[0] - 1, "upto_token": first_ids[-1]})
    assert first.status_code == 200
    assert [t for t, _ in first.json()["updates"]] == first_ids
    later_ids = w.append([[(Receipt, Receipt.synthetic(rng, i))] for i in range(2, 5)])
    # Same ID, more rows written, a wider range: still the first answer.
    again = client.get(txn, {"from_token": first_ids[0] - 1, "upto_token": later_ids[-1]})
    assert again.status_code == 200 and again.json() == first.json()
    # Same ID under another stream's path: the first answer too (Synapse keys by the ID alone).
    other_stream = client.get(URL.format("events") + "same-txn-id", {"from_token": 0, "upto_token": 1})
    assert other_stream.json() == first.json()
    # A fresh ID is answered afresh.
    fresh = client.get(url("receipts"), {"from_token": first_ids[0] - 1, "upto_token": later_ids[-1]})
    assert [t for t, _ in fresh.json()["updates"]] == first_ids + later_ids


def test_a_refusal_is_not_kept(rt, client):
    path = URL.format("receipts") + "refused-then-asked-well"
    assert client.get(path, {"from_token": "x", "upto_token": 1}).status_code == 400
    answer = client.get(path, {"from_token": 0, "upto_token": 1})
    assert answer.status_code == 200 and "updates" in answer.json()


def test_a_txn_id_out_of_bounds_is_refused_before_any_query(rt, client):
    from replication.http.catchup import RESPONSES

    kept = RESPONSES.size_bytes
    for txn_id in ("a" * 65, "a" * 100_000, "caf%C3%A9", "sp%20ace"):
        response = client.get(URL.format("receipts") + txn_id, {"from_token": 0, "upto_token": 1})
        assert response.status_code == 400, txn_id
        assert response.json()["errcode"] == "M_INVALID_PARAM"
        assert "transaction ID must be 1 to 64" in response.json()["error"]
    assert RESPONSES.size_bytes == kept  # nothing kept under them
    assert client.get(URL.format("receipts") + "a" * 64, {"from_token": 0, "upto_token": 1}).status_code == 200


def test_the_form_without_a_txn_id_is_unrecognized_as_in_synapse(client):
    response = client.get(URL.format("receipts"), {"from_token": 0, "upto_token": 1})
    assert response.status_code == 404
    assert response.json()["errcode"] == "M_UNRECOGNIZED"
    assert "transaction ID" in response.json()["error"]


def test_fetch_catch_up_page_sends_a_fresh_txn_id_each_time(rt, live_server, settings):
    """Two requests for the same range, rows written in between: the second sees them (with a
    reused ID it would get the first, stale answer)."""
    from replication.worker.catchup_client import fetch_catch_up_page

    rng = random.Random(9)
    w = rt.writer("receipts")
    ids = w.append([[(Receipt, Receipt.synthetic(rng, 0))]])
    start = ids[0] - 1
    first = fetch_catch_up_page(live_server.url, "receipts", "master", start, start + 10,
                                secret=settings.REPLICATION_SECRET)
    more = w.append([[(Receipt, Receipt.synthetic(rng, i))] for i in range(1, 3)])
    second = fetch_catch_up_page(live_server.url, "receipts", "master", start, start + 10,
                                 secret=settings.REPLICATION_SECRET)
    assert [t for t, _ in first.updates] == ids
    assert [t for t, _ in second.updates] == ids + [t for t in more if t <= start + 10]
