"""The stored chain cover index: ``event_auth_chains`` (each state event's position) and
``event_auth_chain_links``, extended for each persisted batch inside the persist transaction
(the pure algorithm is ``rooms.matrix.chain_index``; docs/storage.md).

``index_events`` loads only what the batch needs -- the positions of its events' auth events,
the heads of their chains, and the links reachable from those chains (one recursive query) --
places the batch's state events, and writes the new rows. A state event whose auth events
are not all indexed (an out-of-band membership, history we have not fetched) waits in
``event_auth_chain_to_calculate`` and is placed with a later batch of its room that brings
them, in the same order a rebuild from scratch would place it.

Chain IDs: PostgreSQL allocates them from the ``event_auth_chain_id`` sequence (several event
writers never clash); SQLite, with one writer, takes the next after the largest.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rooms.matrix.chain_index import Added, ChainIndex, IndexEvent, auth_events_of
from rooms.storage.sql import array, delete_rows, in_array, insert_rows, is_sqlite

#: chain numbers of a batch before real IDs are allocated (above any real one)
_LOCAL_CHAINS = 1 << 62


@dataclass(frozen=True, slots=True)
class ChainEvent:
    """A state event to index: its room and what the index reads of it."""

    room_id: str
    event: IndexEvent


def chain_event(event_id: str, room_id: str, type: str, state_key: str, body: dict) -> ChainEvent:
    """A stored or incoming event's index input, its auth events read from its JSON."""
    return ChainEvent(room_id, IndexEvent(event_id, type, state_key, auth_events_of(body, room_id)))


def index_events(cursor: Any, events: Iterable[ChainEvent]) -> Added:
    """Index a batch's state events (non-state and already indexed ones are skipped), with
    the waiting events of their rooms. Call inside the transaction that stores the events,
    after their ``events`` rows, with ``cursor`` from ``sql.store_cursor`` and the events in
    stream order (the order a rebuild places them in); rejected events and outliers too.
    Returns the rows added (chain IDs as stored)."""
    batch = [e for e in events if e.event.state_key is not None]
    if not batch:
        return Added()
    rooms = sorted({e.room_id for e in batch})
    waiting = _waiting_events(cursor, rooms)
    todo: dict[str, ChainEvent] = {}
    for e in waiting + batch:
        todo.setdefault(e.event.event_id, e)
    cursor.execute(f"SELECT event_id FROM event_auth_chains WHERE {in_array(cursor, 'event_id')}",
                   [array(cursor, list(todo))])
    for (done,) in cursor.fetchall():  # persisted again (de-outliered): keeps its position
        del todo[done]
    if not todo:
        return Added()
    room_of = {e: c.room_id for e, c in todo.items()}
    index = _load_for(cursor, todo.values())
    added = index.extend(c.event for c in todo.values())
    added = _allocate(cursor, added)

    insert_rows(cursor, "event_auth_chains", ("event_id", "room_id", "chain_id", "sequence_number"),
                ("text", "text", "bigint", "bigint"),
                [(e, room_of[e], c, s) for e, c, s in added.positions])
    room_of_chain = {c: room_of[e] for e, c, _ in added.positions}
    insert_rows(cursor, "event_auth_chain_links",
                ("room_id", "origin_chain_id", "origin_sequence_number", "target_chain_id", "target_sequence_number"),
                ("text", "bigint", "bigint", "bigint", "bigint"),
                [(room_of_chain[oc], oc, os_, tc, ts) for oc, os_, tc, ts in added.links])
    was_waiting = {e.event.event_id for e in waiting}
    delete_rows(cursor, "event_auth_chain_to_calculate", ("event_id",), ("text",),
                [(e,) for e, _, _ in added.positions if e in was_waiting])
    insert_rows(cursor, "event_auth_chain_to_calculate", ("event_id", "room_id", "type", "state_key"),
                ("text", "text", "text", "text"),
                [(e, room_of[e], todo[e].event.type, todo[e].event.state_key)
                 for e in added.pending if e not in was_waiting],
                suffix="ON CONFLICT (event_id) DO NOTHING")
    return added


def _waiting_events(cursor: Any, rooms: Sequence[str]) -> list[ChainEvent]:
    """The rooms' events waiting for their auth chains, oldest first, auth events from JSON."""
    cursor.execute(
        "SELECT w.event_id, w.room_id, w.type, w.state_key, e.json FROM event_auth_chain_to_calculate w "
        f"JOIN events e ON e.event_id = w.event_id WHERE {in_array(cursor, 'w.room_id')} "
        "ORDER BY e.stream_ordering", [array(cursor, rooms)])
    return [chain_event(e, r, t, k, json.loads(bytes(body))) for e, r, t, k, body in cursor.fetchall()]


def _load_for(cursor: Any, events: Iterable[ChainEvent]) -> ChainIndex:
    """An index holding what placing ``events`` reads: their auth events' positions and keys,
    their chains' heads, and every link reachable from those chains."""
    index = ChainIndex()
    index.next_chain_id = _LOCAL_CHAINS
    events = list(events)
    own = {e.event.event_id for e in events}
    wanted = sorted({a for e in events for a in e.event.auth_event_ids if a not in own})
    if not wanted:
        return index
    cursor.execute(
        "SELECT c.event_id, c.chain_id, c.sequence_number, e.type, e.state_key FROM event_auth_chains c "
        f"JOIN events e ON e.event_id = c.event_id WHERE {in_array(cursor, 'c.event_id')}",
        [array(cursor, wanted)])
    for event_id, chain, seq, type_, state_key in cursor.fetchall():
        index.add_position(event_id, (type_, state_key), chain, seq)
    index.next_chain_id = _LOCAL_CHAINS
    chains = sorted(index.chains)
    if not chains:
        return index
    cursor.execute(
        "SELECT chain_id, max(sequence_number) FROM event_auth_chains "
        f"WHERE {in_array(cursor, 'chain_id')} GROUP BY chain_id", [array(cursor, chains)])
    for chain, head in cursor.fetchall():
        events_of_chain = index.chains[chain]
        events_of_chain.extend([""] * (head - len(events_of_chain)))
    seed = "SELECT value FROM json_each(%s)" if is_sqlite(cursor) else "SELECT unnest(%s::bigint[])"
    cursor.execute(
        f"WITH RECURSIVE reach(chain_id) AS ({seed} UNION SELECT l.target_chain_id FROM "
        "event_auth_chain_links l JOIN reach r ON l.origin_chain_id = r.chain_id) "
        "SELECT origin_chain_id, origin_sequence_number, target_chain_id, target_sequence_number "
        "FROM event_auth_chain_links WHERE origin_chain_id IN (SELECT chain_id FROM reach)",
        [array(cursor, chains)])
    for link in cursor.fetchall():
        index.add_link(tuple(link))
    return index


def _allocate(cursor: Any, added: Added) -> Added:
    """Replace the batch's local chain numbers by allocated chain IDs."""
    local = sorted({c for _, c, _ in added.positions if c >= _LOCAL_CHAINS})
    if not local:
        return added
    if is_sqlite(cursor):
        cursor.execute("SELECT coalesce(max(chain_id), 0) FROM event_auth_chains")
        first = cursor.fetchone()[0] + 1
        ids = list(range(first, first + len(local)))
    else:
        cursor.execute("SELECT nextval('event_auth_chain_id') FROM generate_series(1, %s)", [len(local)])
        ids = sorted(r[0] for r in cursor.fetchall())
    real = dict(zip(local, ids))

    def chain_id(c):
        return real.get(c, c)

    return Added(
        positions=[(e, chain_id(c), s) for e, c, s in added.positions],
        links=[(chain_id(oc), os_, chain_id(tc), ts) for oc, os_, tc, ts in added.links],
        pending=added.pending,
    )


def load_room(cursor: Any, room_id: str) -> ChainIndex:
    """A room's whole stored index (for checks, tests and small rooms' questions)."""
    index = ChainIndex()
    cursor.execute(
        "SELECT c.event_id, c.chain_id, c.sequence_number, e.type, e.state_key FROM event_auth_chains c "
        "JOIN events e ON e.event_id = c.event_id WHERE c.room_id = %s ORDER BY c.chain_id, c.sequence_number",
        [room_id])
    for event_id, chain, seq, type_, state_key in cursor.fetchall():
        index.add_position(event_id, (type_, state_key), chain, seq)
    cursor.execute(
        "SELECT origin_chain_id, origin_sequence_number, target_chain_id, target_sequence_number "
        "FROM event_auth_chain_links WHERE room_id = %s", [room_id])
    for link in cursor.fetchall():
        index.add_link(tuple(link))
    return index


def reset_chain_id_sequence(cursor: Any) -> None:
    """PostgreSQL: the sequence continues after the largest stored chain ID (after a rebuild)."""
    if not is_sqlite(cursor):
        cursor.execute("SELECT setval('event_auth_chain_id', "
                       "greatest((SELECT coalesce(max(chain_id), 0) FROM event_auth_chains), 1))")
