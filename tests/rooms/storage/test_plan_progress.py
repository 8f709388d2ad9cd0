"""The planner's working state (``plan_progress``): new groups take the snapshot's reserved
IDs in order, and a batch that needs more than were reserved is an error, not an ID taken
from elsewhere."""
from __future__ import annotations

import pytest

from rooms.storage.plan_progress import OutOfGroupIds, Progress
from rooms.storage.plan_snapshot import Snapshot
from rooms.storage.state_groups import NewGroup
from tests.rooms.storage.test_planner import MemoryStore


def test_group_ids_are_the_reserved_ones_in_order():
    p = Progress.start([], Snapshot(rooms={}, group_ids=[7, 9]), MemoryStore().reader, backfill=False, now_ms=1)
    assert p.next_group_id() == 7 and p.next_group_id() == 7  # taken once a group is appended
    p.groups.append(NewGroup(7, "!r", "$e", None, {}, 1))
    assert p.next_group_id() == 9
    p.groups.append(NewGroup(9, "!r", "$f", None, {}, 1))
    with pytest.raises(OutOfGroupIds):
        p.next_group_id()


def test_the_lineage_is_the_readers():
    store = MemoryStore()
    p = Progress.start([], Snapshot(rooms={}), store.reader, backfill=True, now_ms=5)
    assert p.lineage is store.reader.lineage and p.backfill and p.now_ms == 5 and p.rooms == {}
