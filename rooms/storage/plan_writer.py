"""The SQL of a :class:`~rooms.storage.plan.Plan`: one statement per table, whatever the
batch size (``INSERT ... SELECT FROM unnest`` on PostgreSQL, ``executemany`` on SQLite; see
``sql.py``), all sent in one pipeline by the caller. Nothing here decides anything: every row
comes from the plan (docs/storage.md, "The persist path").
"""
from __future__ import annotations

from typing import Any, Sequence

from rooms.models import CurrentStateDelta, Event
from rooms.storage.chain_index_store import index_events
from rooms.storage.plan import EVENT_AUTH_COLUMNS, EVENT_EDGES_COLUMNS, EVENT_TO_STATE_GROUPS_COLUMNS, MEMBERSHIP_COLUMNS, Plan
from rooms.storage.redactions import mark_redacted
from rooms.storage.sql import array, delete_rows, delete_rows_after, in_array, insert_rows
from rooms.storage.state_groups import NewGroup, packed_copies


def write_plan(cur: Any, writer: Any, ids: Sequence[int], plan: Plan) -> None:
    """Write ``plan`` with ``cur``, inside ``writer``'s transaction that reserved ``ids``."""
    for stream_id, fields in plan.ex_outlier_wire:
        # before the events' rows: at one token the ``ev`` row comes before the ``state`` rows
        writer.record_wire_row(stream_id, Event.wire_row(fields))
    _write_events(writer, ids, plan)
    if plan.ex_outliers:
        cur.execute("UPDATE events SET outlier = FALSE WHERE " + in_array(cur, "event_id"),
                    [array(cur, [r.event_id for r in plan.ex_outliers])])
        insert_rows(cur, "ex_outlier_stream", ["event_stream_ordering", "event_id", "state_group", "instance_name"],
                    ["bigint", "text", "bigint", "text"],
                    [(*r, writer.generator.instance_name) for r in plan.ex_outliers])
    mark_redacted(cur, plan.redacted_stored)
    insert_rows(cur, "redactions", ["event_id", "redacts", "received_ts"], ["text", "text", "bigint"],
                plan.redactions)
    insert_rows(cur, "rejections", ["event_id", "reason", "last_check"], ["text", "text", "text"], plan.rejections)
    write_state_groups(cur, plan.state_groups)
    # auth edges, and the chain cover index of the same auth graph
    insert_rows(cur, "event_auth", EVENT_AUTH_COLUMNS, ["text", "text", "text"], plan.event_auth)
    index_events(cur, plan.chain_events)
    insert_rows(cur, "event_to_state_groups", EVENT_TO_STATE_GROUPS_COLUMNS, ["text", "bigint"],
                plan.event_to_state_groups)
    insert_rows(cur, "event_edges", EVENT_EDGES_COLUMNS, ["text", "text", "text"], plan.event_edges)
    insert_rows(cur, "room_memberships", MEMBERSHIP_COLUMNS,
                ["text", "text", "text", "text", "text", "bigint", "bigint"], plan.memberships)
    cur.execute("DELETE FROM event_backward_extremities WHERE " + in_array(cur, "event_id"),
                [array(cur, plan.resolved_backward)])
    insert_rows(cur, "event_backward_extremities", ["event_id", "room_id"], ["text", "text"],
                plan.backward_extremities, suffix="ON CONFLICT DO NOTHING")
    if plan.forward_extremities:
        rooms = sorted(plan.forward_extremities)
        cur.execute("DELETE FROM event_forward_extremities WHERE " + in_array(cur, "room_id"), [array(cur, rooms)])
        insert_rows(cur, "event_forward_extremities", ["event_id", "room_id"], ["text", "text"],
                    [(eid, r) for r in rooms for eid in plan.forward_extremities[r]])
    _write_current_state(cur, plan)
    if plan.visibility_cuts:  # each pair's rows after its cut (VisibilityCut)
        delete_rows_after(cur, "room_visibility_ranges", ["room_id", "user_id"], ["start_topological", "start_stream"],
                          ["text", "text", "bigint", "bigint"], plan.visibility_cuts)
        insert_rows(cur, "room_visibility_ranges",
                    ["room_id", "user_id", "start_topological", "start_stream", "end_topological", "end_stream"],
                    ["text", "text", "bigint", "bigint", "bigint", "bigint"], plan.visibility_ranges)
    insert_rows(
        cur, "rooms", ["room_id", "head_topological", "head_stream", "last_stream", "current_state_group",
                       "min_depth", "room_version", "authorized", "late_stream"],
        ["text", "bigint", "bigint", "bigint", "bigint", "bigint", "text", "boolean", "bigint"], plan.rooms,
        suffix="ON CONFLICT (room_id) DO UPDATE SET head_topological = EXCLUDED.head_topological, "
               "head_stream = EXCLUDED.head_stream, last_stream = EXCLUDED.last_stream, "
               "current_state_group = EXCLUDED.current_state_group, min_depth = EXCLUDED.min_depth, "
               "room_version = coalesce(rooms.room_version, EXCLUDED.room_version), "
               "authorized = (rooms.authorized OR EXCLUDED.authorized), "
               # never lowered: a writer's context may be older than the row (another writer's mark)
               "late_stream = CASE WHEN rooms.late_stream IS NULL OR EXCLUDED.late_stream > rooms.late_stream "
               "THEN EXCLUDED.late_stream ELSE rooms.late_stream END",
    )


def _write_events(writer: Any, ids: Sequence[int], plan: Plan) -> None:
    """``events`` rows and their ``state`` rows, through the stream writer (replication sees
    them when the IDs complete)."""
    facts = []
    for row in plan.events:
        rows: list[tuple[Any, dict[str, Any]]] = [] if row.values is None else [(Event, row.values)]
        rows.extend((CurrentStateDelta, d) for d in row.state_deltas)
        facts.append(rows)
    writer.insert_rows(ids, facts)


def _write_current_state(cur: Any, plan: Plan) -> None:
    gone = [(r.room_id, r.type, r.state_key) for r in plan.current_state if r.event_id is None]
    delete_rows(cur, "current_state_events", ["room_id", "type", "state_key"], ["text", "text", "text"], gone)
    if len(gone) < len(plan.current_state):
        insert_rows(
            cur, "current_state_events",
            ["room_id", "type", "state_key", "event_id", "membership", "event_stream_ordering"],
            ["text", "text", "text", "text", "text", "bigint"],
            [r for r in plan.current_state if r.event_id is not None],
            suffix="ON CONFLICT (room_id, type, state_key) DO UPDATE SET event_id = EXCLUDED.event_id, "
                   "membership = EXCLUDED.membership, event_stream_ordering = EXCLUDED.event_stream_ordering",
        )


def write_state_groups(cur: Any, groups: Sequence[NewGroup]) -> None:
    """New groups: their ``state_groups`` row, the edge to the parent, their state rows, and a
    big group's packed copy on PostgreSQL."""
    insert_rows(cur, "state_groups", ["id", "room_id", "event_id", "chain_length"],
                ["bigint", "text", "text", "integer"],
                [(g.id, g.room_id, g.event_id, g.chain_length) for g in groups])
    insert_rows(cur, "state_group_edges", ["state_group", "prev_state_group"], ["bigint", "bigint"],
                [(g.id, g.parent) for g in groups if g.parent is not None])
    insert_rows(cur, "state_groups_state", ["state_group", "room_id", "type", "state_key", "event_id"],
                ["bigint", "text", "text", "text", "text"],
                [(g.id, g.room_id, t, k, e) for g in groups for (t, k), e in g.rows.items()])
    insert_rows(cur, "state_groups_packed", ["state_group", "members_count", "members", "others_count", "others"],
                ["bigint", "integer", "text", "integer", "text"], packed_copies(cur, groups))
