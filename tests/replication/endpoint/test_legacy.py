"""The legacy generation's history reads (replication/endpoint/legacy.py), without sockets:
pages merged across writers, and live lines kept while reading."""
import random

import pytest

from replication.endpoint import legacy
from replication.endpoint.legacy import HistoryRead
from replication.protocol.commands import LegacyRdataCommand, PositionCommand, RdataCommand
from streams.conf import stream_writers
from streams.models import Receipt
from streams.registry import get_stream
from streams.runtime import StreamRuntime

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two_writers():
    writers = stream_writers("receipts=master,w2")
    runtimes = [StreamRuntime(instance_name=name, writers=writers) for name in ("master", "w2")]
    yield runtimes
    for rt in runtimes:
        rt.close()


def test_pages_merge_every_writer_in_token_order(two_writers):
    rng = random.Random(5)
    ids: dict[str, list[int]] = {"master": [], "w2": []}
    for chunk in range(12):  # interleaved runs of different lengths
        rt = two_writers[chunk % 2]
        n = 3 + chunk * 2
        ids[rt.instance_name] += rt.writer("receipts").append(
            [[(Receipt, Receipt.synthetic(rng, chunk * 100 + i))] for i in range(n)])
    positions = {w: tokens[-1] for w, tokens in ids.items()}
    start = min(ids["master"][0], ids["w2"][0]) + 4
    read = HistoryRead("receipts", start, positions)
    assert read.upto == max(positions.values())
    sent: list[int] = []
    pages = 0
    while not read.done:
        page = read.read_page(get_stream("receipts"), "default", limit=7)
        data, count = page.data, page.count
        pages += 1
        assert all(len(c.carry) <= 7 for c in read.writers.values())  # memory: a page per writer
        lines = data.decode().splitlines()
        assert len(lines) == count <= 14
        sent += [LegacyRdataCommand.from_body(line.removeprefix("RDATA ")).token for line in lines]
    expected = sorted(t for tokens in ids.values() for t in tokens if t > start)
    assert sent == expected  # every row once, in token order across both writers
    assert pages > len(expected) // 14


def test_live_lines_wait_for_the_read_and_overflow_to_a_new_target(monkeypatch):
    read = HistoryRead("receipts", 0, {"master": 10})
    batch = [RdataCommand("receipts", "master", 9, ["!r:hs", "m.read", "@u:hs", "$e", None, {}]),
             RdataCommand("receipts", "master", 11, ["!r:hs", "m.read", "@u:hs", "$f", None, {}]),
             RdataCommand("events", "master", 12, ["ev", []]),
             PositionCommand("receipts", "master", 11, 11)]
    read.offer(batch)
    assert read.buffered == 2  # token 11 and its POSITION: 9 is history, events is not ours
    assert read.buffer[0].startswith(b"RDATA receipts 11 ")
    monkeypatch.setattr(legacy, "MAX_BUFFERED_LINES", 3)
    read.offer(batch)
    assert read.overflowed and read.buffered == 0 and read.buffer == []
    read.extend({"master": 11, "w2": 4})  # read on to where the writers are now
    assert not read.overflowed and read.upto == 11
    assert read.writers["master"].target == 11 and read.writers["w2"].target == 4



def test_a_history_page_leaves_out_a_fact_with_a_line_over_the_limit():
    """The older generation has no catch-up: a fact whose line a peer would hang up on is
    left out of the page (and logged), the others go."""
    from replication.protocol.commands import MAX_LINE_LENGTH, batch_updates

    updates = batch_updates([(5, ["a"]), (6, ["b"]), (6, ["x" * MAX_LINE_LENGTH]), (7, ["c"])])
    lines = [LegacyRdataCommand("caches", token, row).to_line() for token, row in updates]
    kept = HistoryRead("caches", 0, {})._without_oversized_facts(updates, lines)
    assert kept == ['RDATA caches 5 ["a"]', 'RDATA caches 7 ["c"]']
