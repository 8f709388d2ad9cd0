"""The Synapse audits' pure ``DataFrame -> DataFrame`` functions (docs/jobs.md, "Synapse
audits"): Synapse's own tables in, findings out, one row per finding:

``finding`` (what is wrong, a short code), ``room_id``, ``event_id`` (or the state group, for
the state-group audits), ``key`` (the column, table or state key concerned), ``found`` (what
Synapse stored) and ``expected`` (what the recomputation gives).

A healthy Synapse gives no findings. Each function takes the columns its docstring names, as
``synapse_audit_jobs`` reads them (Synapse 1.163.2's schema).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Iterable

import pandas as pd

from rooms.matrix.auth_rules import AuthFailed, MissingAuthEvent, auth_state_from, check_state_dependent, check_state_independent
from rooms.matrix.event_format import BadEventFormat, Event, parse_pdu
from rooms.matrix.room_versions import UnknownRoomVersion, room_version
from rooms.matrix.state_res import resolve

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

FINDING_COLUMNS = ("finding", "room_id", "event_id", "key", "found", "expected")
FINDING_SCHEMA = ("finding string, room_id string, event_id string, key string, found string, "
                  "expected string")

#: Synapse's dummy events start at more than this many forward extremities in a room
#: (``dummy_events_threshold``, default 10): beyond it, every new event of the room resolves
#: that many state sets (matrix-org/synapse#1760)
DEFAULT_EXTREMITY_THRESHOLD = 10


def _finding(df: DataFrame, finding: str, room: Column | str, event: Column | str | None, key: Column | str,
             found: Column | str | None, expected: Column | str | None) -> DataFrame:
    from pyspark.sql import functions as F

    def text(value: Column | str | None, literal: bool = False) -> Column:
        if value is None:
            return F.lit(None).cast("string")
        if isinstance(value, str):
            return F.lit(value) if literal else F.col(value).cast("string")
        return value.cast("string")

    return df.select(F.lit(finding).alias("finding"), text(room).alias("room_id"), text(event).alias("event_id"),
                     text(key, literal=True).alias("key"), text(found).alias("found"),
                     text(expected).alias("expected"))


def _union(parts: Iterable[DataFrame]) -> DataFrame:
    out: DataFrame | None = None
    for part in parts:
        out = part if out is None else out.unionByName(part)
    assert out is not None
    return out


# -- synapse_check_orderings -----------------------------------------------------------------------

def ordering_findings(events: DataFrame, edges: DataFrame, stream_refs: DataFrame) -> DataFrame:
    """Orderings Synapse stored that contradict each other or the DAG.

    ``events``: room_id, event_id, stream_ordering, topological_ordering, depth (the
    ``events`` columns), json_room_id and json_depth (from ``event_json``; null without a row).
    ``edges``: event_id, prev_event_id (``event_edges``). ``stream_refs``: table, event_id,
    stream_ordering: the other tables that repeat an event's stream ordering
    (``room_memberships``, ``current_state_events``, ``local_current_membership``,
    ``event_search``).

    Synapse writes ``topological_ordering = depth = the event's depth`` and each event's
    stream ordering once, from one sequence; an event sorts after its prev events in
    ``/messages`` only if its ordering is above theirs."""
    from pyspark.sql import functions as F

    e = events
    topo = _finding(e.where(~F.col("topological_ordering").eqNullSafe(F.col("depth"))),
                    "topological_ordering_not_depth", "room_id", "event_id", "events.topological_ordering",
                    "topological_ordering", "depth")
    no_json = _finding(e.where(F.col("json_room_id").isNull()), "event_json_missing", "room_id", "event_id",
                       "event_json", None, F.lit("a row"))
    json_room = _finding(e.where(F.col("json_room_id").isNotNull() & (F.col("json_room_id") != F.col("room_id"))),
                         "event_json_room_differs", "room_id", "event_id", "event_json.room_id", "json_room_id",
                         "room_id")
    depth = _finding(e.where(F.col("json_room_id").isNotNull() & ~F.col("depth").eqNullSafe(F.col("json_depth"))),
                     "depth_not_the_events", "room_id", "event_id", "events.depth", "depth", "json_depth")
    no_stream = _finding(e.where(F.col("stream_ordering").isNull()), "stream_ordering_missing", "room_id",
                         "event_id", "events.stream_ordering", None, F.lit("a stream ordering"))
    dupes = (e.where(F.col("stream_ordering").isNotNull()).groupBy("stream_ordering")
             .agg(F.count("*").alias("n")).where(F.col("n") > 1))
    duplicate = _finding(e.join(dupes, "stream_ordering"), "stream_ordering_duplicate", "room_id", "event_id",
                         "events.stream_ordering", F.concat(F.col("stream_ordering").cast("string"), F.lit(" (x"),
                                                            F.col("n").cast("string"), F.lit(")")), F.lit("unique"))
    prev = e.select(F.col("event_id").alias("prev_event_id"), F.col("topological_ordering").alias("prev_topo"))
    latest_prev = (edges.join(prev, "prev_event_id").groupBy("event_id")
                   .agg(F.max("prev_topo").alias("prev_topo")))
    before = _finding(e.join(latest_prev, "event_id").where(F.col("topological_ordering") <= F.col("prev_topo")),
                      "ordering_not_after_prev_events", "room_id", "event_id", "events.topological_ordering",
                      "topological_ordering", F.concat(F.lit("> "), F.col("prev_topo").cast("string")))
    r = stream_refs.alias("r")
    refs = (r.join(e.select("event_id", "room_id", F.col("stream_ordering").alias("so")), "event_id")
            .where(F.col("r.stream_ordering").isNotNull() & ~F.col("r.stream_ordering").eqNullSafe(F.col("so"))))
    ref = _finding(refs, "stream_ordering_differs", "room_id", "event_id",
                   F.concat(F.col("table"), F.lit(".stream_ordering")), "stream_ordering", "so")
    return _union([topo, no_json, json_room, depth, no_stream, duplicate, before, ref])


# -- synapse_forward_extremities --------------------------------------------------------------------

def extremity_counts(extremities: DataFrame) -> DataFrame:
    """``event_forward_extremities`` (room_id, event_id) -> room_id, extremities."""
    from pyspark.sql import functions as F

    return extremities.groupBy("room_id").agg(F.count("*").alias("extremities"))


def extremity_findings(extremities: DataFrame, events: DataFrame, edges: DataFrame, *,
                       threshold: int = DEFAULT_EXTREMITY_THRESHOLD) -> DataFrame:
    """Rooms with more than ``threshold`` forward extremities, and extremities that are none.

    ``extremities``: room_id, event_id (``event_forward_extremities``); ``events``: event_id,
    outlier, rejected (``rejections`` present); ``edges``: event_id, prev_event_id. A forward
    extremity is an event of the room that no accepted event names as a prev event yet; an
    outlier or an unknown event never is one (Synapse's ``_update_forward_extremities``)."""
    from pyspark.sql import functions as F

    counts = extremity_counts(extremities)
    over = _finding(counts.where(F.col("extremities") > threshold), "too_many_forward_extremities", "room_id",
                    None, "event_forward_extremities", "extremities", F.lit(f"<= {threshold}"))
    x = extremities.join(events, "event_id", "left")
    unknown = _finding(x.where(F.col("outlier").isNull()), "forward_extremity_unknown", "room_id", "event_id",
                       "events", None, F.lit("an event"))
    outlier = _finding(x.where(F.col("outlier")), "forward_extremity_is_outlier", "room_id", "event_id",
                       "events.outlier", F.lit("outlier"), F.lit("not an outlier"))
    accepted_children = (edges.join(events.where(~F.col("outlier") & ~F.col("rejected")).select("event_id"),
                                    "event_id")
                         .groupBy(F.col("prev_event_id").alias("event_id")).agg(F.count("*").alias("children")))
    children = _finding(extremities.join(accepted_children, "event_id"), "forward_extremity_has_children",
                        "room_id", "event_id", "event_edges",
                        F.concat(F.col("children").cast("string"), F.lit(" event(s) after it")), F.lit("none"))
    return _union([over, unknown, outlier, children])


# -- synapse_state_group_health ----------------------------------------------------------------------

def state_group_findings(groups: DataFrame, edges: DataFrame, references: DataFrame, *,
                         newest_judged: int | None = None) -> DataFrame:
    """Damage in the state-group tree.

    ``groups``: state_group, room_id (``state_groups``); ``edges``: state_group,
    prev_state_group (``state_group_edges``); ``references``: event_id, room_id, state_group
    (``event_to_state_groups`` with the event's room). A group no event refers to and no
    group builds on is dead weight (matrix-org/synapse#3364); a delta's parent must exist, be
    older (Synapse's reads take the highest group per key) and be of the same room.
    ``newest_judged``: groups above it are not called unreferenced (written after the cut of
    the main database, for events it does not hold)."""
    from pyspark.sql import functions as F

    g = groups
    referenced = references.select("state_group").union(edges.select(F.col("prev_state_group").alias("state_group")))
    unreferenced_groups = g.join(referenced, "state_group", "left_anti")
    if newest_judged is not None:
        unreferenced_groups = unreferenced_groups.where(F.col("state_group") <= newest_judged)
    unreferenced = _finding(unreferenced_groups, "state_group_unreferenced", "room_id", "state_group",
                            "state_groups", F.lit("no event, no child group"), F.lit("referenced or deleted"))
    child = g.alias("c")
    parent = g.select(F.col("state_group").alias("p_group"), F.col("room_id").alias("p_room"))
    e = edges.join(child, "state_group").join(parent, F.col("prev_state_group") == F.col("p_group"), "left")
    dangling = _finding(e.where(F.col("p_group").isNull()), "state_group_parent_missing", "room_id", "state_group",
                        "state_group_edges.prev_state_group", "prev_state_group", F.lit("a state group"))
    not_older = _finding(e.where(F.col("prev_state_group") >= F.col("state_group")), "state_group_parent_not_older",
                         "room_id", "state_group", "state_group_edges.prev_state_group", "prev_state_group",
                         F.concat(F.lit("< "), F.col("state_group").cast("string")))
    other_room = _finding(e.where(F.col("p_group").isNotNull() & (F.col("p_room") != F.col("room_id"))),
                          "state_group_parent_other_room", "room_id", "state_group", "state_groups.room_id",
                          "p_room", "room_id")
    r = references.join(g.select("state_group", F.col("room_id").alias("g_room")), "state_group", "left")
    missing = _finding(r.where(F.col("g_room").isNull()), "event_state_group_missing", "room_id", "event_id",
                       "event_to_state_groups.state_group", "state_group", F.lit("a state group"))
    wrong_room = _finding(r.where(F.col("g_room").isNotNull() & (F.col("g_room") != F.col("room_id"))),
                          "event_state_group_other_room", "room_id", "event_id", "state_groups.room_id", "g_room",
                          "room_id")
    return _union([unreferenced, dangling, not_older, other_room, missing, wrong_room])


#: rust-synapse-compress-state's default levels: a new delta chain every 100, 50, 25 groups
COMPRESSOR_LEVELS = (100, 50, 25)
ROOM_HEALTH_SCHEMA = ("room_id string, groups long, snapshots long, rows long, max_delta_depth long, "
                      "rows_after_compression long")


def room_state_health(rows: pd.DataFrame, levels: tuple[int, ...] = COMPRESSOR_LEVELS) -> pd.DataFrame:
    """One room's state groups -> its health figures, pure pandas.

    ``rows``: one row per ``state_groups_state`` row (state_group, prev_state_group, type,
    state_key, event_id), plus one with null type for a group with no rows of its own. Gives
    the groups, the snapshots (groups without a parent), the rows stored, the longest delta
    chain (hops from a group to its snapshot) and the rows the tree would hold after
    rust-synapse-compress-state's dry run (its ``Compressor``): groups in ID order, each hung
    on the head of the first of ``levels`` with room (a full level starts a new chain at the
    group, which moves on to the next level), stored as its differences from that head's full
    state, or from the first group up the new tree holding no key it lacks, or whole; a group
    that keeps its parent keeps its rows."""
    room = str(rows["room_id"].iat[0]) if len(rows) else ""
    parents: dict[int, int | None] = {}
    own: dict[int, dict[tuple[str, str], str]] = {}
    stored = 0
    for group, prev, type_, key, event in zip(rows["state_group"], rows["prev_state_group"], rows["type"],
                                              rows["state_key"], rows["event_id"]):
        g = int(group)
        parents[g] = None if prev is None or pd.isna(prev) else int(prev)
        entries = own.setdefault(g, {})
        if type_ is not None and not (isinstance(type_, float) and pd.isna(type_)):
            entries[(str(type_), str(key))] = str(event)
            stored += 1
    full: dict[int, dict[tuple[str, str], str]] = {}
    depth: dict[int, int] = {}

    def resolve(group: int) -> None:
        chain: list[int] = []
        g: int | None = group
        while g is not None and g not in full and g in parents and len(chain) <= len(parents):
            chain.append(g)
            g = parents[g]
        base: dict[tuple[str, str], str] = dict(full[g]) if g is not None and g in full else {}
        hops = depth[g] + 1 if g is not None and g in depth else 0
        for item in reversed(chain):
            base = {**base, **own[item]}
            full[item] = base
            depth[item] = hops
            hops += 1

    for g in sorted(parents):
        resolve(g)
    lengths = [0] * len(levels)
    heads: list[int | None] = [None] * len(levels)
    new_parents: dict[int, int | None] = {}
    after = 0
    for g in sorted(parents):
        parent: int | None = None
        for i, size in enumerate(levels):
            if lengths[i] < size:
                parent = heads[i]
                heads[i], lengths[i] = g, lengths[i] + 1
                break
            heads[i], lengths[i] = g, 1
        state = full[g]
        if parent == parents[g]:  # the same parent: its delta stays as it is
            new_parents[g] = parent
            after += len(own[g])
            continue
        # a base must hold no key the group lacks (a delta cannot remove one): up the new tree
        while parent is not None and any(k not in state for k in full[parent]):
            parent = new_parents[parent]
        new_parents[g] = parent
        if parent is None:
            after += len(state)
        else:
            base = full[parent]
            after += sum(1 for k, v in state.items() if base.get(k) != v)
    return pd.DataFrame({
        "room_id": [room], "groups": [len(parents)],
        "snapshots": [sum(1 for p in parents.values() if p is None)], "rows": [stored],
        "max_delta_depth": [max(depth.values(), default=0)], "rows_after_compression": [after]})


def _health_of_rooms(pdf: pd.DataFrame) -> pd.DataFrame:
    return room_state_health(pdf)


def state_health_by_room(rows: DataFrame) -> DataFrame:
    """(room_id, state_group, prev_state_group, type, state_key, event_id) -> one row of
    :data:`ROOM_HEALTH_SCHEMA` per room (:func:`room_state_health`, a room per call)."""
    return rows.groupBy("room_id").applyInPandas(_health_of_rooms, schema=ROOM_HEALTH_SCHEMA)


# -- synapse_check_chain_cover ------------------------------------------------------------------------

COVER_SCHEMA = "finding string, room_id string, event_id string, key string, found string, expected string"


def _cover_ancestors(event: str, positions: dict[str, tuple[int, int]],
                     links: dict[int, list[tuple[int, int, int]]],
                     chains: dict[int, list[tuple[int, str]]]) -> set[str]:
    """The auth chain of ``event`` as the cover index gives it (Synapse's
    ``_get_auth_chain_ids_using_cover_index_txn``): its own chain below it, then every link
    whose origin is reached, recursively, each making its target chain reached up to the
    link's target."""
    chain, seq = positions[event]
    link_reach = {chain: seq}  # links leave from the event itself and below
    reach = {chain: seq - 1}  # ancestors: strictly below it on its own chain
    todo = [chain]
    while todo:
        c = todo.pop()
        for origin_seq, target, target_seq in links.get(c, ()):
            if origin_seq <= link_reach[c] and target_seq > link_reach.get(target, 0):
                link_reach[target] = target_seq
                reach[target] = max(reach.get(target, 0), target_seq)
                todo.append(target)
    return {e for c, up_to in reach.items() for s, e in chains.get(c, ()) if s <= up_to}


def _closures(auth: dict[str, list[str]]) -> dict[str, frozenset[str]]:
    """The transitive closure of ``auth`` (event -> its auth events), memoised, no recursion."""
    done: dict[str, frozenset[str]] = {}
    for start in auth:
        stack = [(start, False)]
        while stack:
            e, expanded = stack.pop()
            if e in done:
                continue
            if not expanded:
                stack.append((e, True))
                stack.extend((a, False) for a in auth.get(e, ()) if a not in done)
                continue
            out: set[str] = set()
            for a in auth.get(e, ()):
                out.add(a)
                out |= done.get(a, frozenset())
            done[e] = frozenset(out)
    return done


def _ids(events: Iterable[str], limit: int = 3) -> str:
    shown = sorted(events)
    return ", ".join(shown[:limit]) + (f" (+{len(shown) - limit})" if len(shown) > limit else "")


def room_cover_findings(rows: pd.DataFrame) -> pd.DataFrame:
    """One room's chain cover against the closure of its ``event_auth``, pure pandas.

    ``rows``: kind 'p' (event_id, chain_id, sequence_number: an ``event_auth_chains`` row),
    'l' (chain_id, sequence_number -> target_chain_id, target_sequence_number: a link whose
    origin chain is the room's), 'a' (event_id, auth_id: an ``event_auth`` row of a state
    event), 's' (event_id: a state event the index should cover). Compared by reachability,
    never by chain IDs or link rows, which depend on how Synapse batched its persists."""
    room = str(rows["room_id"].iat[0]) if len(rows) else ""
    positions: dict[str, tuple[int, int]] = {}
    chains: dict[int, list[tuple[int, str]]] = {}
    links: dict[int, list[tuple[int, int, int]]] = {}
    auth: dict[str, list[str]] = {}
    indexed: list[str] = []
    for kind, event, other, chain, seq, target, target_seq in zip(
            rows["kind"], rows["event_id"], rows["other_id"], rows["chain_id"], rows["sequence_number"],
            rows["target_chain_id"], rows["target_sequence_number"]):
        if kind == "p":
            positions[str(event)] = (int(chain), int(seq))
            chains.setdefault(int(chain), []).append((int(seq), str(event)))
        elif kind == "l":
            links.setdefault(int(chain), []).append((int(seq), int(target), int(target_seq)))
        elif kind == "a":
            auth.setdefault(str(event), []).append(str(other))
        elif kind == "s":
            indexed.append(str(event))
    closure = _closures(auth)
    out: list[tuple[str, str, str, str, str | None, str]] = []
    for event in sorted(indexed):
        expected = set(closure.get(event, frozenset()))
        if event not in positions:
            out.append(("chain_position_missing", room, event, "event_auth_chains", None, "a chain position"))
            continue
        got = _cover_ancestors(event, positions, links, chains)
        if got != expected:
            lacks, extra = expected - got, got - expected
            found = "; ".join(part for part in (f"lacks {_ids(lacks)}" if lacks else "",
                                                f"adds {_ids(extra)}" if extra else "") if part)
            out.append(("auth_chain_cover_differs", room, event, "event_auth_chains/links", found,
                        f"{len(expected)} auth events (closure of event_auth)"))
    return pd.DataFrame(out, columns=list(FINDING_COLUMNS))


def _cover_rooms(pdf: pd.DataFrame) -> pd.DataFrame:
    return room_cover_findings(pdf)


COVER_ROWS_SCHEMA = ("kind string, room_id string, event_id string, other_id string, chain_id long, "
                     "sequence_number long, target_chain_id long, target_sequence_number long")


def chain_cover_findings(positions: DataFrame, links: DataFrame, auth: DataFrame, state_events: DataFrame) -> DataFrame:
    """The chain cover index against ``event_auth``, by reachability, a room per call.

    ``positions``: room_id, event_id, chain_id, sequence_number (``event_auth_chains`` with
    the event's room); ``links``: the ``event_auth_chain_links`` columns; ``auth``: room_id,
    event_id, auth_id (``event_auth``); ``state_events``: room_id, event_id, the events the
    index must cover (state events of indexed rooms, not waiting in
    ``event_auth_chain_to_calculate``). A link belongs to its origin chain's room."""
    from pyspark.sql import functions as F

    none_s, none_l = F.lit(None).cast("string"), F.lit(None).cast("long")
    chain_rooms = positions.select("chain_id", "room_id").distinct()
    p = positions.select(F.lit("p").alias("kind"), "room_id", "event_id", none_s.alias("other_id"), "chain_id",
                         "sequence_number", none_l.alias("target_chain_id"), none_l.alias("target_sequence_number"))
    lk = links.join(chain_rooms, links["origin_chain_id"] == chain_rooms["chain_id"]).select(
        F.lit("l").alias("kind"), "room_id", none_s.alias("event_id"), none_s.alias("other_id"),
        F.col("origin_chain_id").alias("chain_id"), F.col("origin_sequence_number").alias("sequence_number"),
        "target_chain_id", "target_sequence_number")
    a = auth.select(F.lit("a").alias("kind"), "room_id", "event_id", F.col("auth_id").alias("other_id"),
                    none_l.alias("chain_id"), none_l.alias("sequence_number"), none_l.alias("target_chain_id"),
                    none_l.alias("target_sequence_number"))
    s = state_events.select(F.lit("s").alias("kind"), "room_id", "event_id", none_s.alias("other_id"),
                            none_l.alias("chain_id"), none_l.alias("sequence_number"),
                            none_l.alias("target_chain_id"), none_l.alias("target_sequence_number"))
    return _union([p, lk, a, s]).groupBy("room_id").applyInPandas(_cover_rooms, schema=COVER_SCHEMA)


#: the order findings are listed in (a run's sample)
FINDINGS_ORDER = ("finding", "room_id", "event_id", "key")


def sorted_findings(findings: DataFrame) -> DataFrame:
    return findings.orderBy(*FINDINGS_ORDER)



# -- synapse_check_state ---------------------------------------------------------------------------

def _full_states(parents: dict[int, int | None],
                 own: dict[int, dict[tuple[str, str], str]]) -> dict[int, dict[tuple[str, str], str]]:
    """Every group's full state: its snapshot's rows, then each delta down to it (a child's
    row wins), as Synapse's ``_get_state_groups_from_groups_txn`` folds them. A group whose
    chain is broken (a parent missing) is folded from what there is."""
    full: dict[int, dict[tuple[str, str], str]] = {}
    for start in sorted(parents):
        chain: list[int] = []
        g: int | None = start
        while g is not None and g not in full and g in parents and len(chain) <= len(parents):
            chain.append(g)
            g = parents[g]
        base = full.get(g, {}) if g is not None else {}
        for item in reversed(chain):
            base = {**base, **own.get(item, {})}
            full[item] = base
    return full


def _key_text(key: tuple[str, str]) -> str:
    return f"{key[0]}|{key[1]}"


def room_state_findings(rows: pd.DataFrame) -> pd.DataFrame:
    """One room's stored state per event against the state our Matrix core computes from the
    events themselves, pure pandas.

    ``rows``: kind 'e', one per event (event_id, json: ``event_json.json``, outlier, rejected:
    in ``rejections``, stream_ordering, state_group: its ``event_to_state_groups`` row,
    room_version: ``rooms.room_version``) and kind 'g', one per ``state_groups_state`` row
    (state_group, prev_state_group, type, state_key, event_id; type null for a group without
    rows of its own). Each accepted event, in DAG order: the state before it is its prev
    event's state after, or the resolution of several (``rooms.matrix.state_res``, the room
    version's algorithm, Synapse's rejections as given); it is authorised against it
    (``rooms.matrix.auth_rules``) and its verdict compared with Synapse's; the state after it
    (with it, if it is an accepted state event) is compared key by key with the state of its
    group. A prev event outside the room's events (an outlier, or history Synapse never
    fetched) brings its stored state instead."""
    room = str(rows["room_id"].iat[0]) if len(rows) else ""
    out: list[tuple[str, str, str | None, str, str | None, str | None]] = []
    versions = [v for v in rows["room_version"] if isinstance(v, str)]
    try:
        version = room_version(versions[0] if versions else None)
    except UnknownRoomVersion as e:
        return pd.DataFrame([("room_version_unknown", room, None, "rooms.room_version", str(e), "a known version")],
                            columns=list(FINDING_COLUMNS))
    events: dict[str, Event] = {}
    groups_of: dict[str, int] = {}
    rejected: set[str] = set()
    timeline: list[tuple[int, int, str]] = []
    parents: dict[int, int | None] = {}
    own: dict[int, dict[tuple[str, str], str]] = {}
    for kind, event_id, text, outlier, is_rejected, stream, group, prev, type_, key in zip(
            rows["kind"], rows["event_id"], rows["json"], rows["outlier"], rows["rejected"], rows["stream_ordering"],
            rows["state_group"], rows["prev_state_group"], rows["type"], rows["state_key"]):
        if kind == "g":
            g = int(group)
            parents[g] = None if prev is None or pd.isna(prev) else int(prev)
            if isinstance(type_, str):
                own.setdefault(g, {})[(type_, str(key))] = str(event_id)
            continue
        event_id = str(event_id)
        try:
            pdu = json.loads(text)
            if version.event_ids_are_hashes:
                pdu.pop("event_id", None)
            event = parse_pdu(pdu, version, stored_id=event_id)
        except (ValueError, TypeError, BadEventFormat) as e:
            out.append(("event_unparsable", room, event_id, "event_json.json", str(e)[:200], "an event of its version"))
            continue
        events[event_id] = event
        if bool(is_rejected):
            rejected.add(event_id)
        if group is not None and not pd.isna(group):
            groups_of[event_id] = int(group)
        if not bool(outlier):
            timeline.append((event.depth, int(stream) if stream is not None and not pd.isna(stream) else 0, event_id))
    full = _full_states(parents, own)
    after: dict[str, dict[tuple[str, str], str]] = {}
    for _depth, _stream, event_id in sorted(timeline):
        event = events[event_id]
        sets: list[dict[tuple[str, str], str]] = []
        for prev_id in event.prev_event_ids:
            if prev_id in after:
                sets.append(after[prev_id])
            elif prev_id in groups_of and groups_of[prev_id] in full:
                sets.append(full[groups_of[prev_id]])
        if event.prev_event_ids and not sets:
            continue  # history Synapse never fetched: its state came from a remote server
        try:
            before = sets[0] if len(sets) == 1 else resolve(version, sets, events, rejected) if sets else {}
            try:
                check_state_independent(event, events.get, rejected)
                check_state_dependent(event, auth_state_from(event, before, events.get))
                allowed = True
            except AuthFailed:
                allowed = False
        except (MissingAuthEvent, KeyError, ValueError) as e:
            out.append(("state_not_recomputable", room, event_id, "auth events", str(e)[:200], "every auth event"))
            continue
        if allowed == (event_id in rejected):
            out.append(("rejection_differs", room, event_id, "rejections",
                        "rejected" if event_id in rejected else "accepted", "accepted" if allowed else "rejected"))
        state = before
        if event.is_state and event_id not in rejected:
            state = {**before, event.key: event_id}
        after[event_id] = state
        if event_id not in groups_of:
            out.append(("state_group_missing", room, event_id, "event_to_state_groups", None, "a state group"))
            continue
        stored = full.get(groups_of[event_id], {})
        if stored is not state:
            for k in sorted(set(stored) | set(state)):
                if stored.get(k) != state.get(k):
                    out.append(("state_differs", room, event_id, _key_text(k), stored.get(k), state.get(k)))
    return pd.DataFrame(out, columns=list(FINDING_COLUMNS))


def _state_rooms(pdf: pd.DataFrame) -> pd.DataFrame:
    return room_state_findings(pdf)


def state_findings(events: DataFrame, state_rows: DataFrame) -> DataFrame:
    """The stored state of every event against the recomputed one, a room per call.

    ``events``: room_id, room_version, event_id, json, outlier, rejected, stream_ordering,
    state_group; ``state_rows``: room_id, state_group, prev_state_group, type, state_key,
    event_id (the groups of the room with their ``state_groups_state`` rows)."""
    from pyspark.sql import functions as F

    none_s, none_l = F.lit(None).cast("string"), F.lit(None).cast("long")
    e = events.select(F.lit("e").alias("kind"), "room_id", "room_version", "event_id", "json", "outlier", "rejected",
                      "stream_ordering", "state_group", none_l.alias("prev_state_group"), none_s.alias("type"),
                      none_s.alias("state_key"))
    g = state_rows.select(F.lit("g").alias("kind"), "room_id", none_s.alias("room_version"), "event_id",
                          none_s.alias("json"), F.lit(None).cast("boolean").alias("outlier"),
                          F.lit(None).cast("boolean").alias("rejected"), none_l.alias("stream_ordering"),
                          "state_group", "prev_state_group", "type", "state_key")
    return e.unionByName(g).groupBy("room_id").applyInPandas(_state_rooms, schema=FINDING_SCHEMA)
