"""synapse_attach/catalogue.py against the pinned Synapse's own STREAMS_MAP (read in process:
the test set holds Synapse; the deployable app never imports it)."""
from __future__ import annotations

from synapse_attach.catalogue import OTHER_GENERATORS, STREAMS, SYNAPSE_VERSION, generators
from testing.synapse_homeserver import SYNAPSE_VERSION as PINNED


def test_every_stream_of_streams_map_in_its_order():
    from synapse.replication.tcp.streams import STREAMS_MAP

    assert SYNAPSE_VERSION == PINNED
    assert [s.name for s in STREAMS] == list(STREAMS_MAP)


def test_in_memory_streams_have_no_database_side():
    assert {s.name for s in STREAMS if s.in_memory} == {"presence_federation", "typing", "federation"}
    assert all(s.tables and s.positions_name for s in generators())


def test_names_that_differ_from_the_replication_name():
    renamed = {s.name: s.positions_name for s in STREAMS if s.positions_name not in (None, s.name)}
    assert renamed == {"presence": "presence_stream", "push_rules": "push_rules_stream",
                       "device_lists": "device_lists_stream",
                       "un_partial_stated_room": "un_partial_stated_room_stream",
                       "un_partial_stated_event": "un_partial_stated_event_stream"}
    assert [s.name for s in STREAMS if not s.positive] == ["backfill"]
    assert [s.name for s in STREAMS + OTHER_GENERATORS if not s.records_positions] == [
        "caches", "e2e_cross_signing_keys"]
