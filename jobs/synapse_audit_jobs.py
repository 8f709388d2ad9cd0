"""The Synapse audit jobs (docs/jobs.md, "Synapse audits"), each ``(spark, rooms) -> Outcome``:
read Synapse's tables inside one read-only cut (``synapse_source``), hand them to a pure
function of ``synapse_audit``, report its findings. Nothing is ever written to Synapse.

``rooms`` are Synapse's room IDs (they need not be known to this project's room store).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from jobs import synapse_audit as audit
from jobs.outcome import SAMPLE_LIMIT, Outcome, counted_sample
from jobs.synapse_source import MAIN, STATE, SynapseCut, synapse_cut

logger = logging.getLogger(__name__)

#: a state event's JSON, with the \\u0000 escape jsonb and json's accessors refuse made harmless
_JSON = "replace(j.json, '\\u0000', '\\u0001')::json"


def _rooms_sql(column: str, rooms: Sequence[str] | None) -> str:
    """``AND column IN (...)`` for ``rooms`` (nothing for every room)."""
    if not rooms:
        return ""
    quoted = []
    for room in rooms:
        if "\x00" in room:
            raise ValueError("room IDs cannot contain NUL")
        quoted.append("'" + room.replace("'", "''") + "'")
    return f" AND {column} IN ({', '.join(quoted)})"


def _report(findings: Any, rows_in: int, extra: list[dict[str, Any]] | None = None) -> Outcome:
    """The outcome of an audit: every finding counted, the first :data:`SAMPLE_LIMIT` kept
    (then ``extra``: figures that are not findings, shown after them)."""
    n, sample = counted_sample(findings, audit.sorted_findings)
    return Outcome(rows_in=rows_in, rows_out=0, differences=n, sample=sample + (extra or [])[:SAMPLE_LIMIT])


def _audit(run: Callable[[Any, SynapseCut, Sequence[str] | None], Outcome]) -> Callable[..., Outcome]:
    """A job that runs ``run`` inside one cut of Synapse's database(s)."""
    def job(spark: Any, rooms: Sequence[str] | None) -> Outcome:
        with synapse_cut() as cut:
            return run(spark, cut, rooms)
    job.__name__ = job.__qualname__ = run.__name__.lstrip("_")
    job.__doc__ = run.__doc__
    job.reads_synapse = True  # type: ignore[attr-defined]  # its rooms are Synapse's (runner)
    return job


# -- synapse_check_orderings ----------------------------------------------------------------------

#: the tables that repeat an event's stream ordering in Synapse 1.163.2, and their column
STREAM_ORDERING_COPIES = (("room_memberships", "event_stream_ordering"),
                          ("current_state_events", "event_stream_ordering"),
                          ("local_current_membership", "event_stream_ordering"),
                          ("event_search", "stream_ordering"))


def _synapse_check_orderings(spark: Any, cut: SynapseCut, rooms: Sequence[str] | None) -> Outcome:
    """topological_ordering and depth against event_json and event_edges; stream orderings
    unique and the same wherever Synapse repeats them."""
    where = _rooms_sql("e.room_id", rooms)
    events = cut.read(spark, "SELECT e.room_id, e.event_id, e.stream_ordering, e.topological_ordering, e.depth, "
                             f"j.room_id AS json_room_id, ({_JSON} ->> 'depth')::bigint AS json_depth "
                             f"FROM events e LEFT JOIN event_json j ON j.event_id = e.event_id WHERE TRUE{where}",
                      "room_id string, event_id string, stream_ordering long, topological_ordering long, "
                      "depth long, json_room_id string, json_depth long", partition_column="stream_ordering")
    edges = cut.read(spark, "SELECT x.event_id, x.prev_event_id, e.stream_ordering FROM event_edges x "
                            f"JOIN events e ON e.event_id = x.event_id WHERE TRUE{where}",
                     "event_id string, prev_event_id string", partition_column="stream_ordering")
    copies = " UNION ALL ".join(
        f"SELECT '{table}' AS table_name, t.event_id, t.{column} AS stream_ordering FROM {table} t "
        f"WHERE TRUE{_rooms_sql('t.room_id', rooms)}" for table, column in STREAM_ORDERING_COPIES)
    refs = cut.read(spark, copies, "table_name string, event_id string, stream_ordering long").withColumnRenamed(
        "table_name", "table")
    (rows_in,) = cut.rows(f"SELECT count(*) FROM events e WHERE TRUE{where}")[0]
    return _report(audit.ordering_findings(events, edges, refs), int(rows_in))


synapse_check_orderings = _audit(_synapse_check_orderings)


# -- synapse_forward_extremities ------------------------------------------------------------------

def extremity_threshold() -> int:
    from django.conf import settings

    return int((getattr(settings, "SYNAPSE_ATTACH", {}) or {}).get(
        "EXTREMITY_THRESHOLD", audit.DEFAULT_EXTREMITY_THRESHOLD))


def _synapse_forward_extremities(spark: Any, cut: SynapseCut, rooms: Sequence[str] | None) -> Outcome:
    """Per room, the forward extremities: rooms over SYNAPSE_EXTREMITY_THRESHOLD listed first
    (most first), then extremities that are none (an outlier, unknown, or with events after it)."""
    from pyspark.sql import functions as F

    where = _rooms_sql("f.room_id", rooms)
    extremities = cut.read(spark, f"SELECT f.room_id, f.event_id FROM event_forward_extremities f WHERE TRUE{where}",
                           "room_id string, event_id string")
    edges = cut.read(spark, "SELECT x.event_id, x.prev_event_id FROM event_edges x "
                            "JOIN event_forward_extremities f ON f.event_id = x.prev_event_id "
                            f"WHERE TRUE{where}", "event_id string, prev_event_id string")
    events = cut.read(spark, "SELECT e.event_id, e.outlier, EXISTS (SELECT 1 FROM rejections r "
                             "WHERE r.event_id = e.event_id) AS rejected FROM events e WHERE e.event_id IN "
                             f"(SELECT f.event_id FROM event_forward_extremities f WHERE TRUE{where}) OR e.event_id IN "
                             "(SELECT x.event_id FROM event_edges x JOIN event_forward_extremities f "
                             f"ON f.event_id = x.prev_event_id WHERE TRUE{where})",
                      "event_id string, outlier boolean, rejected boolean")
    threshold = extremity_threshold()
    over = F.col("finding") == "too_many_forward_extremities"

    def crowded_first(findings: Any) -> Any:
        """The rooms over the threshold (most extremities first), then the other findings."""
        return findings.orderBy((~over).cast("int"), F.when(over, F.col("found").cast("long")).desc_nulls_last(),
                                *audit.FINDINGS_ORDER)

    n, sample = counted_sample(audit.extremity_findings(extremities, events, edges, threshold=threshold),
                               crowded_first)
    (rows_in,) = cut.rows(f"SELECT count(*) FROM event_forward_extremities f WHERE TRUE{where}")[0]
    logger.info("synapse_forward_extremities: %s extremities, %s room(s) over %s", rows_in,
                sum(1 for d in sample if d["finding"] == "too_many_forward_extremities"), threshold)
    return Outcome(rows_in=int(rows_in), rows_out=0, differences=n, sample=sample)


synapse_forward_extremities = _audit(_synapse_forward_extremities)


# -- synapse_state_group_health -------------------------------------------------------------------

def _state_rows_sql(where: str) -> str:
    """Every state group of the rooms with its parent and its own rows (one row with null type
    for a group without rows of its own)."""
    return ("SELECT g.room_id, g.id AS state_group, eg.prev_state_group, s.type, s.state_key, s.event_id "
            "FROM state_groups g LEFT JOIN state_group_edges eg ON eg.state_group = g.id "
            f"LEFT JOIN state_groups_state s ON s.state_group = g.id WHERE TRUE{where}")


STATE_ROWS_SCHEMA = ("room_id string, state_group long, prev_state_group long, type string, state_key string, "
                     "event_id string")


def _synapse_state_group_health(spark: Any, cut: SynapseCut, rooms: Sequence[str] | None) -> Outcome:
    """State groups no event refers to, broken delta edges; per room the rows, groups, longest
    delta chain and the rows a compression would leave (a dry run, listed after the findings)."""
    from pyspark.sql import functions as F

    g_where = _rooms_sql("g.room_id", rooms)
    groups = cut.read(spark, f"SELECT g.id AS state_group, g.room_id FROM state_groups g WHERE TRUE{g_where}",
                      "state_group long, room_id string", database=STATE, partition_column="state_group")
    edges = cut.read(spark, "SELECT eg.state_group, eg.prev_state_group FROM state_group_edges eg "
                            f"JOIN state_groups g ON g.id = eg.state_group WHERE TRUE{g_where}",
                     "state_group long, prev_state_group long", database=STATE, partition_column="state_group")
    references = cut.read(spark, "SELECT s.event_id, e.room_id, s.state_group FROM event_to_state_groups s "
                                 f"JOIN events e ON e.event_id = s.event_id WHERE TRUE{_rooms_sql('e.room_id', rooms)}",
                          "event_id string, room_id string, state_group long", database=MAIN,
                          partition_column="state_group")
    newest = cut.newest_referenced_group if cut.databases.state_url else None
    findings = audit.state_group_findings(groups, edges, references, newest_judged=newest)
    rows = cut.read(spark, _state_rows_sql(g_where), STATE_ROWS_SCHEMA, database=STATE,
                    partition_column="state_group")
    health = audit.state_health_by_room(rows).orderBy(F.col("rows").desc(), "room_id").limit(SAMPLE_LIMIT).collect()
    summaries = [{"finding": "room_state_summary", "room_id": h.room_id, "event_id": None,
                  "key": "state_groups_state",
                  "found": f"{h.rows} rows in {h.groups} groups ({h.snapshots} snapshots), longest delta chain "
                           f"{h.max_delta_depth}",
                  "expected": f"{h.rows_after_compression} rows after compression (dry run, levels "
                              f"{','.join(map(str, audit.COMPRESSOR_LEVELS))})"} for h in health]
    (rows_in,) = cut.rows("SELECT count(*) FROM state_groups_state s JOIN state_groups g ON g.id = s.state_group "
                          f"WHERE TRUE{g_where}", database=STATE)[0]
    return _report(findings, int(rows_in), summaries)


synapse_state_group_health = _audit(_synapse_state_group_health)


# -- synapse_check_chain_cover --------------------------------------------------------------------

def _synapse_check_chain_cover(spark: Any, cut: SynapseCut, rooms: Sequence[str] | None) -> Outcome:
    """The auth-chain cover index against the closure of event_auth, by reachability, in rooms
    that have the index; events waiting in event_auth_chain_to_calculate are a backlog, listed
    after the findings and not counted as damage."""
    where = _rooms_sql("e.room_id", rooms)
    positions = cut.read(spark, "SELECT e.room_id, c.event_id, c.chain_id, c.sequence_number FROM event_auth_chains c "
                                f"JOIN events e ON e.event_id = c.event_id WHERE TRUE{where}",
                         "room_id string, event_id string, chain_id long, sequence_number long",
                         partition_column="chain_id")
    links = cut.read(spark, "SELECT origin_chain_id, origin_sequence_number, target_chain_id, target_sequence_number "
                            "FROM event_auth_chain_links",
                     "origin_chain_id long, origin_sequence_number long, target_chain_id long, "
                     "target_sequence_number long", partition_column="origin_chain_id")
    auth = cut.read(spark, "SELECT a.room_id, a.event_id, a.auth_id, e.stream_ordering FROM event_auth a "
                           f"JOIN events e ON e.event_id = a.event_id WHERE e.state_key IS NOT NULL{where}",
                    "room_id string, event_id string, auth_id string", partition_column="stream_ordering")
    covered = cut.read(spark, "SELECT e.room_id, e.event_id, e.stream_ordering FROM events e "
                              "JOIN rooms r ON r.room_id = e.room_id WHERE e.state_key IS NOT NULL "
                              "AND r.has_auth_chain_index AND NOT EXISTS (SELECT 1 FROM event_auth_chain_to_calculate t "
                              f"WHERE t.event_id = e.event_id){where}",
                       "room_id string, event_id string", partition_column="stream_ordering")
    backlog = [{"finding": "chain_cover_backlog", "room_id": room, "event_id": event,
                "key": "event_auth_chain_to_calculate", "found": "waiting",
                "expected": "indexed when the room next persists an event"}
               for room, event in cut.rows("SELECT e.room_id, e.event_id FROM event_auth_chain_to_calculate e "
                                           f"WHERE TRUE{where} ORDER BY 1, 2 LIMIT {SAMPLE_LIMIT}")]
    (rows_in,) = cut.rows("SELECT count(*) FROM events e JOIN rooms r ON r.room_id = e.room_id "
                          f"WHERE e.state_key IS NOT NULL AND r.has_auth_chain_index{where}")[0]
    return _report(audit.chain_cover_findings(positions, links, auth, covered), int(rows_in), backlog)


synapse_check_chain_cover = _audit(_synapse_check_chain_cover)

# -- synapse_check_state --------------------------------------------------------------------------

def _synapse_check_state(spark: Any, cut: SynapseCut, rooms: Sequence[str] | None) -> Outcome:
    """The state Synapse stored for every event (its group, folded down the delta chain)
    against the state our Matrix core computes from the events themselves."""
    where = _rooms_sql("e.room_id", rooms)
    events = cut.read(spark, "SELECT e.room_id, r.room_version, e.event_id, j.json, e.outlier, "
                             "EXISTS (SELECT 1 FROM rejections x WHERE x.event_id = e.event_id) AS rejected, "
                             "e.stream_ordering, s.state_group FROM events e "
                             "JOIN event_json j ON j.event_id = e.event_id LEFT JOIN rooms r ON r.room_id = e.room_id "
                             f"LEFT JOIN event_to_state_groups s ON s.event_id = e.event_id WHERE TRUE{where}",
                      "room_id string, room_version string, event_id string, json string, outlier boolean, "
                      "rejected boolean, stream_ordering long, state_group long", partition_column="stream_ordering")
    state_rows = cut.read(spark, _state_rows_sql(_rooms_sql("g.room_id", rooms)), STATE_ROWS_SCHEMA,
                          database=STATE, partition_column="state_group")
    (rows_in,) = cut.rows(f"SELECT count(*) FROM events e WHERE NOT e.outlier{where}")[0]
    return _report(audit.state_findings(events, state_rows), int(rows_in))


synapse_check_state = _audit(_synapse_check_state)

#: the audits by job name (``job_registry``)
AUDIT_JOBS = {
    "synapse_check_orderings": synapse_check_orderings,
    "synapse_forward_extremities": synapse_forward_extremities,
    "synapse_state_group_health": synapse_state_group_health,
    "synapse_check_chain_cover": synapse_check_chain_cover,
    "synapse_check_state": synapse_check_state,
}
