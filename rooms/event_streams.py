"""The ``events`` and ``backfill`` streams, declared by the room event store whose tables they are
(``rooms/apps.py`` declares them when Django loads the app, before any process starts work)."""
from __future__ import annotations

from rooms.models import CurrentStateDelta, Event, ExOutlier
from streams.registry import BackingTable, StreamSpec, declare


def declare_event_streams() -> None:
    declare(StreamSpec(
        "events",
        # a de-outliered event is an ``ev`` row at its ex_outlier_stream position (as in Synapse)
        # (at one token an ``ev`` row comes before the ``state`` rows, as Synapse merges them)
        tables=(BackingTable(Event),
                BackingTable(ExOutlier, wire_fields=Event.WIRE_FIELDS, wire_row=Event.wire_row,
                             rows=ExOutlier.with_event_fields),
                BackingTable(CurrentStateDelta)),
        sequence="events_stream_seq",
        multi_writer=True,
        description="new events (ev rows, de-outliered events too) and current-state changes (state rows)",
    ))
    declare(StreamSpec(
        "backfill",
        tables=(BackingTable(Event, wire_fields=Event.BACKFILL_WIRE_FIELDS, wire_row=list),),
        sequence="events_backfill_stream_seq",
        multi_writer=True,
        backwards=True,
        writers_from="events",
        description="events fetched from the past; negative stream orderings",
    ))
