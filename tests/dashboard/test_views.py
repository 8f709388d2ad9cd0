import random

import pytest

from streams.conf import stream_writers
from streams.models import Receipt
from streams.runtime import StreamRuntime

pytestmark = pytest.mark.django_db(transaction=True)


def test_streams_page_shows_positions_and_pending(client):
    rt = StreamRuntime(instance_name="master", writers=stream_writers(""))
    try:
        w = rt.writer("receipts")
        (sid,) = w.append([[(Receipt, Receipt.synthetic(random.Random(), 0))]])
        with w.generator.get_next() as pending_id:
            page = client.get("/")
            data = client.get("/status.json").json()
    finally:
        rt.close()
    assert page.status_code == 200
    body = page.content.decode()
    assert f"master: {sid}" in body
    receipts = next(s for s in data["streams"] if s["name"] == "receipts")
    assert receipts["positions"] == {"master": sid}
    assert receipts["linear"] == sid
    assert [(p["writer"], p["stream_ids"], p["stuck"]) for p in receipts["pending"]] == [("master", [pending_id], False)]
