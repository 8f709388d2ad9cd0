"""The catch-up endpoint and the update function behind it (spec §10.2, §7)."""
import random

import pytest

from streams.conf import stream_writers
from streams.models import CurrentStateDelta, Event, Receipt
from streams.registry import get_stream
from streams.runtime import StreamRuntime
from streams.updates import get_updates_since

pytestmark = pytest.mark.django_db(transaction=True)
URL = "/_synapse/replication/get_repl_stream_updates/{}/"


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
        data = client.get(URL.format("events"), {"from_token": current, "upto_token": ids[-1],
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
    data = client.get(URL.format("receipts") + "abcdef1234", {"from_token": 0, "upto_token": ids[-1]}).json()
    assert [t for t, _ in data["updates"]] == ids
    assert data["upto_token"] == ids[-1] and data["limited"] is False
    other = client.get(URL.format("receipts"), {"from_token": 0, "upto_token": ids[-1], "instance_name": "w2"}).json()
    assert other["updates"] == []


def test_backfill_tokens_are_positive(rt, client):
    rng = random.Random(4)
    ids = rt.writer("backfill").append([[(Event, Event.synthetic(rng, i))] for i in range(2)])
    data = client.get(URL.format("backfill"), {"from_token": 0, "upto_token": -ids[-1]}).json()
    assert [t for t, _ in data["updates"]] == [-i for i in ids]
    assert len(data["updates"][0][1]) == 6


@pytest.mark.parametrize("stream, params, status, message", [
    ("nope", {"from_token": 0, "upto_token": 1}, 400, "Unknown stream"),
    ("events", {"from_token": "x", "upto_token": 1}, 400, "integers"),
    ("events", {"upto_token": 1}, 400, "from_token"),
    ("events", {"from_token": -5, "upto_token": 1}, 400, "negative"),
])
def test_bad_requests(client, stream, params, status, message):
    response = client.get(URL.format(stream), params)
    assert response.status_code == status
    assert message in response.json()["error"]


def test_post_not_allowed(client):
    assert client.post(URL.format("events")).status_code == 405
