"""The observer's live view between processes: the running observer publishes it
(:func:`publish`), any web process reads it (:func:`observer_statuses`) for ``/status.json`` and
``/metrics`` (docs/attach.md, "On the dashboard")."""
from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # (prometheus_client loads where /metrics is served, not in every process)
    from prometheus_client.core import Metric

#: The observer's figures on ``/metrics`` (docs/dashboard.md, "Metrics").
METRIC_PREFIX = "synapse_repl_synapse"
#: How often the observer publishes its view.
PUBLISH_INTERVAL = 2.0
#: How often the observer reads Synapse's database for its view (when SYNAPSE_DATABASE_URL is
#: set), unless ``SYNAPSE_DATABASE_INTERVAL_SECONDS`` says otherwise: one snapshot per read
#: (``reader.py``), in the observer's process, never a web request's.
DATABASE_INTERVAL = 5.0
#: A view older than this is shown as stale (the observer is not running, or hangs).
STALE_AFTER_SECONDS = 15.0
#: Views older than this are no longer shown at all (an observer long gone).
FORGET_AFTER = timedelta(hours=1)


def publish(name: str, subscribed: bool, view: dict[str, Any], now: datetime | None = None) -> None:
    from .models import ObserverStatus

    ObserverStatus.objects.update_or_create(name=name, defaults={
        "pid": os.getpid(), "subscribed": subscribed, "updated_at": now or datetime.now(timezone.utc),
        "view": view})


def sources_of(view: dict[str, Any]) -> list[str]:
    """What an observer's view was made from: ``redis`` (what Synapse's processes said on it)
    and/or ``database`` (a read of Synapse's database)."""
    if "sources" in view:
        return list(view["sources"])
    return ["redis"] + (["database"] if view.get("database") else [])


def observer_statuses(now: datetime | None = None) -> list[dict[str, Any]]:
    """Every observer heard from within :data:`FORGET_AFTER`, with its view and whether it is
    stale; times in the view are seconds before ``updated`` (Unix time). ``subscribed`` is None
    for an observer that reads Synapse's database only (it has no Redis to be subscribed to)."""
    from .models import ObserverStatus

    now = now or datetime.now(timezone.utc)
    out = []
    for row in ObserverStatus.objects.filter(updated_at__gte=now - FORGET_AFTER).order_by("name"):
        age = (now - row.updated_at).total_seconds()
        sources = sources_of(row.view)
        out.append({"source": "synapse", "sources": sources, "observer": row.name, "pid": row.pid,
                    "subscribed": row.subscribed if "redis" in sources else None,
                    "updated": row.updated_at.timestamp(), "age_seconds": round(age, 1),
                    "stale": age > STALE_AFTER_SECONDS, "view": row.view})
    return out


def streams_shaped_like_ours(status: dict[str, Any]) -> list[dict[str, Any]]:
    """An observer's streams in the shape of ``/status.json``'s own streams (name, writers,
    positions, laggard), with ``source: synapse``: the streams heard on Synapse's Redis, then
    those of its database report not heard (the catalogue's order; in-memory ones left out).

    ``positions`` are the writers' live positions when the observer listens to Redis, their
    recorded ones (``stream_positions``) when it reads the database only (``positions_from``
    says which); ``recorded`` are the recorded ones (None: no database read). Without Redis,
    what only Redis tells (``highest``, ``laggard``, ``writer_status``) is None: unknown."""
    view = status["view"]
    listening = "redis" in sources_of(view)
    database = view.get("database") or {}
    by_name = {s["stream"]: s for s in database.get("streams", []) if s["replicated"] and not s["in_memory"]}
    live = view.get("streams", {})
    out = []
    for name in list(live) + [n for n in by_name if n not in live]:
        db = by_name.get(name)
        recorded = None if db is None else {w["instance"]: w["position"] for w in db["writers"]}
        entry = {"source": "synapse", "name": name, "positions_from": "redis" if listening else "database",
                 "recorded": recorded,
                 "persisted_upto": None if db is None else db["persisted_upto"],
                 "allocated": None if db is None else db["allocated"]}
        if listening:
            writers = live.get(name, {}).get("writers", [])
            stuck = [w["instance"] for w in writers if w["stuck"]]
            names = [w["instance"] for w in writers]
            entry.update({
                "writers": names + sorted(set(recorded or ()) - set(names)),
                "positions": {w["instance"]: w["position"] for w in writers if w["position"] is not None},
                "highest": live.get(name, {}).get("highest"), "laggard": stuck[0] if stuck else None,
                "writer_status": {w["instance"]: w for w in writers}})
        else:
            entry.update({"writers": sorted(recorded or ()), "positions": dict(recorded or {}),
                          "highest": None, "laggard": None, "writer_status": None})
        out.append(entry)
    return out


def page_sections(statuses: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each observer's section of the streams page (docs/dashboard.md, "Synapse streams"):
    per stream of its database report (the catalogue's order) and of what it heard, per writer
    the recorded position and the live one; persisted-upto, allocated and unreported IDs; its
    stuck writers, processes and findings. Figures the observer did not get are ``None``."""
    out = []
    for status in observer_statuses() if statuses is None else statuses:
        view = status["view"]
        listening = "redis" in sources_of(view)
        database = view.get("database") or {}
        live = view.get("streams", {})
        unreported = {u["stream"]: u for u in database.get("unreported", [])}
        rows = []
        names = [s["stream"] for s in database.get("streams", []) if s["replicated"]]
        names += [n for n in live if n not in names]
        by_name = {s["stream"]: s for s in database.get("streams", [])}
        for name in names:
            db = by_name.get(name, {})
            live_writers = {w["instance"]: w for w in live.get(name, {}).get("writers", [])}
            recorded = {w["instance"]: w["position"] for w in db.get("writers", [])}
            writers = [{"instance": i, "recorded": recorded.get(i), "live": live_writers.get(i)}
                       for i in sorted(set(recorded) | set(live_writers))]
            rows.append({"name": name, "in_memory": db.get("in_memory", False), "writers": writers,
                         "persisted_upto": db.get("persisted_upto"),
                         "persisted_upto_complete": db.get("persisted_upto_complete") is not False,
                         "allocated": db.get("allocated"), "highest": live.get(name, {}).get("highest"),
                         "unreported": unreported.get(name),
                         # unknown (None), not 0, without Redis: facts are counted as heard there
                         "facts_per_second": (round(sum(w["facts_per_second"] for w in live_writers.values()), 2)
                                              if listening else None),
                         "stuck": any(w["stuck"] for w in live_writers.values())})
        updated = status["updated"]
        out.append({
            "observer": status["observer"], "stale": status["stale"], "subscribed": status["subscribed"],
            "age_seconds": status["age_seconds"], "listening": listening,
            "server_name": (view.get("redis") or {}).get("channel") or view.get("label", ""),
            "streams": rows, "stuck": view.get("stuck", []),
            "stuck_after": view.get("stuck_after_seconds"),
            "database_interval": database.get("interval_seconds"),
            "instances": [{**i, "last_seen": datetime.fromtimestamp(updated - i["last_seen_seconds_ago"], timezone.utc)}
                          for i in view.get("instances", [])],
            "database": database,
            "database_read": (datetime.fromtimestamp(database["read"], timezone.utc)
                              if database.get("read") else None),
            "overdue": [u for u in database.get("unreported", []) if u["overdue"]],
        })
    return out


def chart_rates(sections: list[dict[str, Any]]) -> dict[str, float]:
    """Facts/s per stream heard live, as the chart's series ``Synapse <stream>``."""
    return {f"Synapse {s['name']}": s["facts_per_second"]
            for o in sections if not o["stale"] and o["listening"]
            for s in o["streams"] if any(w["live"] for w in s["writers"])}


def status_json_entries() -> list[dict[str, Any]]:
    """What each observer of an attached Synapse last heard and read (docs/attach.md): its
    streams in the shape of ours, with ``source: synapse``, its processes, its stuck writers,
    and the database's persisted-upto, unreported IDs and findings. What comes from Redis only
    is None (unknown) for an observer that reads the database only; the database's figures are
    None for one that does not read it."""
    out = []
    for status in observer_statuses():
        view = status.pop("view")
        listening = "redis" in status["sources"]
        database = view.get("database")
        out.append({**status, "streams": streams_shaped_like_ours({"view": view}),
                    "instances": view.get("instances", []) if listening else None,
                    "stuck": view.get("stuck", []) if listening else None,
                    "lines": view.get("lines", 0) if listening else None,
                    "bad_lines": view.get("bad_lines", 0) if listening else None,
                    "redis": view.get("redis", {}) if listening else None,
                    "database": None if database is None else {
                        "url": database.get("url"), "read": database.get("read"), "error": database.get("error"),
                        "server_version": database.get("server_version"),
                        "unreported": database.get("unreported", []), "findings": database.get("findings", [])}})
    return out


def synapse_metrics() -> Iterator[Metric]:
    """What each observer of an attached Synapse last heard on its Redis (docs/attach.md)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    up = GaugeMetricFamily(f"{METRIC_PREFIX}_observer_up",
                           "1 while the observer of a Synapse reports and, when it listens to Synapse's Redis, "
                           "is subscribed to it", labels=["observer"])
    recorded = GaugeMetricFamily(f"{METRIC_PREFIX}_writer_recorded_position",
                                 "A Synapse writer's position in stream_positions (from the observer's last read "
                                 "of Synapse's database)", labels=["stream", "writer"])
    position = GaugeMetricFamily(f"{METRIC_PREFIX}_writer_position",
                                 "The last position a Synapse writer announced on Redis", labels=["stream", "writer"])
    facts = CounterMetricFamily(f"{METRIC_PREFIX}_writer_facts", "RDATA rows a Synapse writer sent, as heard",
                                labels=["stream", "writer"])
    behind = GaugeMetricFamily(f"{METRIC_PREFIX}_writer_behind_seconds",
                               "How long a Synapse writer has stayed below a position another writer of its "
                               "stream announced (0: not behind)", labels=["stream", "writer"])
    stuck = GaugeMetricFamily(f"{METRIC_PREFIX}_stuck_writer_seconds",
                              "How long a Synapse writer has been behind, once that is SYNAPSE_STUCK_AFTER_SECONDS "
                              "or more (0: not stuck)", labels=["stream", "writer"])
    seen = GaugeMetricFamily(f"{METRIC_PREFIX}_instance_last_seen_timestamp_seconds",
                             "When a Synapse process was last heard on Redis (Unix time)", labels=["instance"])
    unreported = GaugeMetricFamily(f"{METRIC_PREFIX}_unreported_ids",
                                   "Sequence IDs a Synapse stream handed out that no writer has reported persisted "
                                   "(from the observer's last read of Synapse's database)", labels=["stream"])
    unreported_age = GaugeMetricFamily(f"{METRIC_PREFIX}_unreported_ids_age_seconds",
                                       "How long the oldest of them has been handed out and unreported (0: none)",
                                       labels=["stream"])
    overdue = GaugeMetricFamily(f"{METRIC_PREFIX}_unreported_ids_overdue",
                                "1 once a Synapse stream's oldest unreported ID has stayed so "
                                "SYNAPSE_UNREPORTED_AFTER_SECONDS or more", labels=["stream"])
    database_up = GaugeMetricFamily(f"{METRIC_PREFIX}_database_up",
                                    "1 while the observer's last read of Synapse's database succeeded, 0 while "
                                    "its reads fail (the figures from the database are then those of the last "
                                    "read that succeeded)", labels=["observer"])
    database_read = GaugeMetricFamily(f"{METRIC_PREFIX}_database_last_read_timestamp_seconds",
                                      "When the observer last read Synapse's database successfully (Unix time)",
                                      labels=["observer"])
    persisted = GaugeMetricFamily(f"{METRIC_PREFIX}_persisted_upto",
                                  "A Synapse stream's persisted-upto position, as Synapse's MultiWriterIdGenerator "
                                  "computes it from its database", labels=["stream"])
    for status in observer_statuses():
        up.add_metric([status["observer"]], 0 if status["stale"] or status["subscribed"] is False else 1)
        if status["stale"]:
            continue
        view = status["view"]
        for stream, entry in view.get("streams", {}).items():
            for w in entry["writers"]:
                labels = [stream, w["instance"]]
                if w["position"] is not None:
                    position.add_metric(labels, w["position"])
                facts.add_metric(labels, w["facts"])
                behind.add_metric(labels, w["behind_seconds"] or 0)
                stuck.add_metric(labels, w["behind_seconds"] if w["stuck"] else 0)
        for i in view.get("instances", []):
            seen.add_metric([i["instance"]], status["updated"] - i["last_seen_seconds_ago"])
        database = view.get("database") or {}
        if database:
            database_up.add_metric([status["observer"]], 0 if database.get("error") or not database.get("read") else 1)
            if database.get("read"):
                database_read.add_metric([status["observer"]], database["read"])
        for u in database.get("unreported", []):
            unreported.add_metric([u["stream"]], u["count"])
            unreported_age.add_metric([u["stream"]], u["age_seconds"])
            overdue.add_metric([u["stream"]], 1 if u["overdue"] else 0)
        for s in database.get("streams", []):
            if s["persisted_upto"] is not None:
                persisted.add_metric([s["stream"]], s["persisted_upto"])
            for w in s["writers"]:
                recorded.add_metric([s["stream"], w["instance"]], w["position"])
    yield from (up, position, facts, behind, stuck, seen, database_up, database_read, unreported, unreported_age,
                overdue, persisted, recorded)
