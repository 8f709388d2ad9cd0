"""The observer's live view between processes: the running observer publishes it
(:func:`publish`), any web process reads it (:func:`observer_statuses`) for ``/status.json`` and
``/metrics`` (docs/attach.md, "On the dashboard")."""
from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import Any

#: How often the observer publishes its view.
PUBLISH_INTERVAL = 2.0
#: A view older than this is shown as stale (the observer is not running, or hangs).
STALE_AFTER_SECONDS = 15.0
#: Views older than this are no longer shown at all (an observer long gone).
FORGET_AFTER = timedelta(hours=1)


def publish(name: str, subscribed: bool, view: dict[str, Any], now: datetime | None = None) -> None:
    from .models import ObserverStatus

    ObserverStatus.objects.update_or_create(name=name, defaults={
        "pid": os.getpid(), "subscribed": subscribed, "updated_at": now or datetime.now(timezone.utc),
        "view": view})


def observer_statuses(now: datetime | None = None) -> list[dict[str, Any]]:
    """Every observer heard from within :data:`FORGET_AFTER`, with its view and whether it is
    stale; times in the view are seconds before ``updated`` (Unix time)."""
    from .models import ObserverStatus

    now = now or datetime.now(timezone.utc)
    out = []
    for row in ObserverStatus.objects.filter(updated_at__gte=now - FORGET_AFTER).order_by("name"):
        age = (now - row.updated_at).total_seconds()
        out.append({"source": "synapse", "observer": row.name, "pid": row.pid, "subscribed": row.subscribed,
                    "updated": row.updated_at.timestamp(), "age_seconds": round(age, 1),
                    "stale": age > STALE_AFTER_SECONDS, "view": row.view})
    return out


def streams_shaped_like_ours(status: dict[str, Any]) -> list[dict[str, Any]]:
    """An observer's streams in the shape of ``/status.json``'s own streams (name, writers,
    positions, laggard), with ``source: synapse`` and the live figures per writer."""
    out = []
    for name, entry in status["view"].get("streams", {}).items():
        writers = entry["writers"]
        stuck = [w["instance"] for w in writers if w["stuck"]]
        out.append({"source": "synapse", "name": name, "writers": [w["instance"] for w in writers],
                    "positions": {w["instance"]: w["position"] for w in writers if w["position"] is not None},
                    "highest": entry["highest"], "laggard": stuck[0] if stuck else None,
                    "writer_status": {w["instance"]: w for w in writers}})
    return out
