"""Visibility recomputed from stored state: per (room, user), the ranges of the room's ordering
the user may see. The batch twin of ``rooms.storage.visibility_ranges`` (rules: docs/storage.md,
"Visibility"), written independently from the spec so the consistency check cross-checks them.

Per room, one pass over the accepted, non-outlier events in ``(topological, stream)`` order:

* the state after each event comes from its state group (``state(g) = state(parent) + rows``,
  only history-visibility and member keys kept), so forks are seen as the persist path saw them;
* the users the state *grants* each new event (``join``, or ``invite`` under ``invited``) change
  only where the state group changes, so a message costs nothing and only the keys that changed
  are re-examined (the whole map only across a fork);
* boundary events add points: a history-visibility event is also seen under the value before it;
  a user's own member event follows Synapse's own-membership rule;
* ``'*'`` gets the world-readable events, ``'*shared'`` the shared-era ones; a user's own rows
  hold only what their membership grants. "Joined at any point after it" is not copied into
  them: the reads clip ``'*shared'`` at the user's latest join, and the check compares what
  each side lets a user see that way (:func:`differences_of_room`), so rows an older persist
  path wrote with the eras copied in compare equal.

Runs are kept as event indices and turned into key ranges at the end; a user still granted
after the last event keeps an open range (null end), as the persist path leaves it.
"""
from __future__ import annotations

import bisect
import json
from typing import TYPE_CHECKING, Any, Iterable

import pandas as pd

from jobs.room_groups import cogroup_rooms

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ANYONE, SHARED_ERAS = "*", "*shared"
HV, MEMBER = "m.room.history_visibility", "m.room.member"
_KNOWN_VIS = ("world_readable", "shared", "invited", "joined")
_PRIORITY = ("join", "invite", "knock", "leave", "ban")

EVENTS_SCHEMA = ("room_id string, event_id string, topological_ordering long, stream_ordering long, "
                 "type string, state_key string, membership string, outlier boolean, rejected boolean, "
                 "state_group long, prev_events array<string>")  # or their JSON text (the job's read)
GROUPS_SCHEMA = ("room_id string, state_group long, prev_state_group long, type string, state_key string, "
                 "membership string, history_visibility string")
RANGES_SCHEMA = ("room_id string, user_id string, start_topological long, start_stream long, "
                 "end_topological long, end_stream long")
DIFF_SCHEMA = "room_id string, event_id string, user_id string, expected string, found string"

#: A key of a room's state as this job reads it: ``("v",)`` (history visibility) or
#: ``("m", user)`` (a membership).
StateKey = tuple[str, ...]
#: Those keys' values: the visibility, or the membership.
State = dict[StateKey, Any]
#: An event's place in the room: (topological ordering, stream ordering).
EventKey = tuple[int, int]
#: Event indices ``[first, last]`` (both included), extended in place as events are read.
Run = list[int]


def _vis(value: Any) -> str:
    return value if isinstance(value, str) and value in _KNOWN_VIS else "shared"


def _grants(membership: str | None, vis: str) -> bool:
    return membership == "join" or (membership == "invite" and vis == "invited")


def _rank(m: str | None) -> int:
    return _PRIORITY.index(m) if m in _PRIORITY else len(_PRIORITY)


def _none(v: Any) -> Any:
    return None if v is None or (isinstance(v, float) and pd.isna(v)) else v


class _States:
    """The (visibility, members) state of each group of one room, built parent first."""

    def __init__(self, groups: pd.DataFrame) -> None:
        self.parent: dict[int, int | None] = {}
        self.rows: dict[int, State] = {}
        for g, p, t, k, m, hv in zip(groups["state_group"], groups["prev_state_group"], groups["type"],
                                     groups["state_key"], groups["membership"], groups["history_visibility"]):
            g = int(g)
            self.parent[g] = None if _none(p) is None else int(p)
            rows = self.rows.setdefault(g, {})
            if t == HV:
                rows[("v",)] = _vis(_none(hv))
            elif t == MEMBER:
                rows[("m", k)] = _none(m) or "leave"
        self._recent: dict[int, State] = {}  # a few reconstructed states (forks revisit them)

    def state(self, g: int | None) -> State:
        """The state of group ``g``, rebuilt from its snapshot (at most 100 hops away); the
        caller must not change it."""
        if g is None:
            return {}
        got = self._recent.get(g)
        if got is not None:
            return got
        chain = []
        h: int | None = g
        while h is not None:
            chain.append(h)
            h = self.parent.get(h)
        state: State = {}
        for h in reversed(chain):  # ids grow along chains: snapshot first
            state.update(self.rows.get(h, {}))
        if len(self._recent) >= 32:
            self._recent.pop(next(iter(self._recent)))
        self._recent[g] = state
        return state

    def values_at(self, g: int | None, keys: Iterable[StateKey]) -> State:
        """The values of ``keys`` in group ``g``'s state (a key it lacks is left out): each
        from the nearest group of the chain holding it, without building the state -- a big
        room's is ~80,000 members, and a fork in it needs a handful of keys."""
        out: State = {}
        pending = set(keys)
        h = g
        while h is not None and pending:
            rows = self.rows.get(h)
            if rows:
                hit = [k for k in rows if k in pending] if len(rows) < len(pending) else [k for k in pending if k in rows]
                for k in hit:
                    out[k] = rows[k]
                pending.difference_update(hit)
            h = self.parent.get(h)
        return out

    def fork(self, a: int, b: int) -> tuple[State, set[StateKey]] | None:
        """Going from group ``a``'s state to group ``b``'s: the keys that may differ (those in
        the rows of the groups between their nearest common ancestor and each of them) and
        their values in ``b``'s state (a key it lacks is left out); None when the two share
        no ancestor (different snapshots). Every other key has the ancestor's value in both."""
        up_from_a: dict[int, int] = {}
        path_a: list[int] = []
        h: int | None = a
        while h is not None:
            up_from_a[h] = len(path_a)
            path_a.append(h)
            h = self.parent.get(h)
        path_b: list[int] = []
        h = b
        while h is not None and h not in up_from_a:
            path_b.append(h)
            h = self.parent.get(h)
        if h is None:
            return None
        ancestor = h
        keys: set[StateKey] = set()
        for x in path_a[:up_from_a[ancestor]]:
            keys.update(self.rows.get(x, ()))
        values: State = {}
        for x in reversed(path_b):  # from the ancestor's child down to b: the nearest row wins
            values.update(self.rows.get(x, {}))
        keys.update(values)
        values.update(self.values_at(ancestor, keys - values.keys()))
        return values, keys


def room_visibility(events: pd.DataFrame, groups: pd.DataFrame) -> tuple[
        list[EventKey], dict[str, list[Run]], dict[str, bool], dict[str, int]]:
    """One room: the ordered event keys, each holder's runs of event indices (a user's: what
    their own membership grants), whether each holder's last run stays open for events after
    the last one, and each user's latest join (an event index)."""
    states = _States(groups)
    ev = events[(~events["outlier"].astype(bool)) & (~events["rejected"].astype(bool))]
    ev = ev.sort_values(["topological_ordering", "stream_ordering"], kind="stable")
    keys = list(zip(ev["topological_ordering"].tolist(), ev["stream_ordering"].tolist()))
    group_of = {e: (None if _none(g) is None else int(g)) for e, g in zip(events["event_id"], events["state_group"])}
    usable = events[~events["outlier"].astype(bool)]
    key_of = dict(zip(usable["event_id"], zip(usable["topological_ordering"], usable["stream_ordering"])))
    runs: dict[str, list[Run]] = {}
    open_from: dict[str, int] = {}  # user -> index where their current grant began
    last_join: dict[str, int] = {}

    def point(user: str, i: int) -> None:
        if user in open_from:
            return
        r = runs.setdefault(user, [])
        if r and r[-1][1] >= i - 1:
            r[-1][1] = max(r[-1][1], i)
        else:
            r.append([i, i])

    def close(user: str, i: int) -> None:  # granted up to i - 1
        start = open_from.pop(user)
        if start <= i - 1:
            r = runs.setdefault(user, [])
            if r and r[-1][1] >= start - 1:
                r[-1][1] = max(r[-1][1], i - 1)
            else:
                r.append([start, i - 1])

    cur: State = {}  # the state after the previous event (mutated in place along a chain)
    cur_group: int | None = -1
    # The members of ``cur`` whose membership is "invite": the only ones a change of history
    # visibility can grant or stop granting (a join grants whatever it is, nothing else
    # ever does), so such a change re-checks them, not every member (~80,000 in a big room).
    invited: set[str] = set()
    users: list[str] | set[str]  # whose grant may have changed with the state

    def member_set(user: str, m: str | None) -> None:  # keeps ``invited`` in step with ``cur``
        if m == "invite":
            invited.add(user)
        else:
            invited.discard(user)
    for i, (eid, etype, skey, membership, prevs) in enumerate(zip(
            ev["event_id"], ev["type"], ev["state_key"], ev["membership"], ev["prev_events"])):
        g = group_of.get(eid)
        before: State | None = None
        if g != cur_group:
            parent = states.parent.get(g) if g is not None else None
            own = states.rows.get(g, {}) if g is not None else {}
            if g is not None and cur_group != -1 and parent == cur_group:
                # the next link of the chain: only its own rows change (a linear room's case)
                if len(own) <= 1:
                    before = {k: cur[k] for k in own if k in cur}  # what this event's key was
                    before[("v",)] = cur.get(("v",))
                vis_changed = ("v",) in own and own[("v",)] != cur.get(("v",))
                cur.update(own)
                users = [k[1] for k in own if k[0] == "m"]
                for u in users:
                    member_set(u, cur[("m", u)])
                if vis_changed:
                    users = invited.union(users)
            else:  # a fork, a snapshot, or the first event
                moved = states.fork(cur_group, g) if g is not None and cur_group not in (-1, None) else None
                if moved is None:  # no common ancestor: compare whole member maps
                    old = cur
                    cur = dict(states.state(g))
                    users = {k[1] for k in cur if k[0] == "m"} | {k[1] for k in old if k[0] == "m"} | set(open_from)
                    invited = {k[1] for k, m in cur.items() if k[0] == "m" and m == "invite"}
                else:  # only the keys on the two paths from the common ancestor can differ
                    theirs, may_differ = moved
                    users = set()
                    vis_changed = False
                    for k in may_differ:
                        v = theirs.get(k)
                        if cur.get(k) == v:
                            continue
                        if v is None:
                            del cur[k]
                        else:
                            cur[k] = v
                        if k[0] == "m":
                            users.add(k[1])
                            member_set(k[1], v)
                        else:
                            vis_changed = True
                    if vis_changed:
                        users |= invited
                if parent is not None and len(own) <= 1:  # what this event's rules read of it
                    before = states.values_at(parent, [("v",), *own, ("m", skey)])
            vis = _vis(cur.get(("v",)))
            for u in users:
                now = _grants(cur.get(("m", u)), vis)
                if now and u not in open_from:
                    open_from[u] = i
                elif not now and u in open_from:
                    close(u, i)
            cur_group = g
        vis = _vis(cur.get(("v",)))
        # the state before this event, for the boundary rules of state events: the parent of
        # its own one-row delta group, else resolved from the states after its prev_events
        if etype in (HV, MEMBER) and skey is not None and before is None:
            before = _resolve_before(prevs, group_of, key_of, states, [("v",), ("m", skey)])
        values = [vis]
        if etype == HV and skey == "" and before is not None:
            values.append(_vis(before.get(("v",))))
        if "world_readable" in values:
            point(ANYONE, i)
        if any(v in ("shared", "world_readable") for v in values):
            point(SHARED_ERAS, i)
        if etype == HV and skey == "" and before is not None:
            # the members granted under the old or the new visibility see this event: a
            # joined one is in ``open_from`` already (a point is nothing new), so the invited
            if any(_grants("invite", v) for v in values):
                for u in invited:
                    point(u, i)
        if etype == MEMBER and skey is not None:
            new = _none(membership) or "leave"
            prev = (before or {}).get(("m", skey)) or "leave"
            if new == "leave" and prev in ("join", "invite"):
                point(skey, i)
            else:
                m = min((new, prev), key=_rank)
                if any(_grants(m, v) for v in values):
                    point(skey, i)
            if new == "join":
                last_join[skey] = i
    n = len(keys)
    still_open = {u: True for u in open_from}
    for u in list(open_from):
        close(u, n)
    for u, r in runs.items():
        runs[u] = _merge(r)
    # '*' and '*shared' stay open while the current state keeps new events in their era
    final_vis = _vis(cur.get(("v",)))
    if n:
        if final_vis == "world_readable":
            still_open[ANYONE] = True
        if final_vis in ("shared", "world_readable"):
            still_open[SHARED_ERAS] = True
    return keys, runs, still_open, last_join


def seen_runs(runs: list[Run], shared: list[Run], join: int | None) -> list[Run]:
    """What a user sees by their own runs and the shared-era runs before their latest join
    ``join`` (an event index; None: never joined) -- the reads' rule, ``*`` aside."""
    if join is None:
        return runs
    return _merge([*runs, *([s, min(e, join - 1)] for s, e in shared if s < join)])


def latest_joins(ev: pd.DataFrame) -> dict[str, int]:
    """user -> index of their latest join among ``ev`` (accepted, non-outlier, in key order)."""
    joins = (ev["type"].to_numpy() == MEMBER) & (ev["membership"].to_numpy() == "join")
    out: dict[str, int] = {}
    for i in joins.nonzero()[0].tolist():
        out[ev["state_key"].iloc[i]] = i
    return out


def _resolve_before(prevs: Any, group_of: dict[str, int | None], key_of: dict[str, EventKey], states: _States,
                    keys: list[StateKey]) -> State:
    """``keys`` in the state before an event, from the states after its prev_events: the
    latest prev's, then the others' for keys it lacks (the persist path's resolution)."""
    if isinstance(prevs, str):  # the job reads them as a JSON array
        prevs = json.loads(prevs)
    cands = sorted(((key_of[p], group_of.get(p)) for p in (prevs if _none(prevs) is not None else [])
                    if p in key_of), key=lambda c: c[0], reverse=True)
    result: State = {}
    for _, g in cands:
        missing = [k for k in keys if k not in result]
        if not missing:
            break
        result.update(states.values_at(g, missing))
    return result


def _merge(runs: list[Run]) -> list[Run]:
    out: list[Run] = []
    for s, e in sorted(runs):
        if out and s <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def ranges_of_room(events: pd.DataFrame, groups: pd.DataFrame) -> pd.DataFrame:
    """One room's visibility as table rows (what ``room_visibility_ranges`` holds)."""
    keys, runs, still_open, _ = room_visibility(events, groups)
    room = events["room_id"].iloc[0]
    rows: list[tuple[Any, ...]] = []
    n = len(keys)
    for user, user_runs in runs.items():
        for s, e in user_runs:
            end = None if (e == n - 1 and still_open.get(user)) else keys[e]
            rows.append((room, user, keys[s][0], keys[s][1], None if end is None else end[0],
                         None if end is None else end[1]))
    # open ends stay None in object columns: Arrow reads them as nullable int64 (pandas'
    # nullable Int64 arrives as a chunked array that applyInPandas cannot take)
    return pd.DataFrame(rows, columns=["room_id", "user_id", "start_topological", "start_stream",
                                       "end_topological", "end_stream"], dtype=object)


def canonical_runs(keys: list[EventKey], ranges: Iterable[tuple[Any, ...]]) -> tuple[list[Run], bool]:
    """Ranges of keys -> the runs of event indices they cover, and whether they stay open.

    Two range sets that cover the same events (with different bounds) give the same runs."""
    runs: list[Run] = []
    is_open, n = False, len(keys)
    for st, ss, et, es in ranges:
        s = bisect.bisect_left(keys, (st, ss))
        if _none(et) is None:
            e, is_open = n - 1, True
        else:
            e = bisect.bisect_right(keys, (et, es)) - 1
        if s <= e:
            runs.append([s, e])
    return _merge(runs), is_open


def _expand(runs: list[Run]) -> set[int]:
    return {i for s, e in runs for i in range(s, e + 1)}


def differences_of_room(events: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """``ranges`` has a ``side`` column (``expected``/``found``): one row per event a user sees
    on one side only, and one (event null) per user whose open end differs. What a user sees
    on a side is their rows plus that side's ``*shared`` rows before their latest join (as
    the reads decide it): a side whose user rows also hold those eras (written before the
    eras stopped being copied) shows the same events."""
    ev = events[(~events["outlier"].astype(bool)) & (~events["rejected"].astype(bool))]
    ev = ev.sort_values(["topological_ordering", "stream_ordering"], kind="stable")
    keys = list(zip(ev["topological_ordering"].tolist(), ev["stream_ordering"].tolist()))
    ids = ev["event_id"].tolist()
    room = events["room_id"].iloc[0] if len(events) else ranges["room_id"].iloc[0]
    sides: dict[tuple[str, str], list[tuple[int, int, Any, Any]]] = {}
    for side, user, st, ss, et, es in zip(ranges["side"], ranges["user_id"], ranges["start_topological"],
                                          ranges["start_stream"], ranges["end_topological"], ranges["end_stream"]):
        sides.setdefault((side, user), []).append((int(st), int(ss), _none(et), _none(es)))
    joins = latest_joins(ev)
    shared = {side: canonical_runs(keys, sides.get((side, SHARED_ERAS), []))[0] for side in ("expected", "found")}
    shared_alike = shared["expected"] == shared["found"]  # (once: ~2,300 eras in a big room)
    out: list[tuple[Any, ...]] = []
    for user in sorted({u for _, u in sides}):
        exp_runs, exp_open = canonical_runs(keys, sides.get(("expected", user), []))
        got_runs, got_open = canonical_runs(keys, sides.get(("found", user), []))
        # Own runs alike and shared eras alike: what the user sees is alike, with no merge of
        # the eras before their join (a big room has ~2,300 of them and ~80,000 members: the
        # merges were the check's time at 10 M otherwise)
        if not user.startswith("*") and not (exp_runs == got_runs and shared_alike):
            exp_runs = seen_runs(exp_runs, shared["expected"], joins.get(user))
            got_runs = seen_runs(got_runs, shared["found"], joins.get(user))
        if exp_runs != got_runs:
            exp, got = _expand(exp_runs), _expand(got_runs)
            for i in sorted(exp ^ got):
                out.append((room, ids[i], user, "visible" if i in exp else "hidden",
                            "visible" if i in got else "hidden"))
        if exp_open != got_open:
            out.append((room, None, user, "open" if exp_open else "closed", "open" if got_open else "closed"))
    return pd.DataFrame(out, columns=["room_id", "event_id", "user_id", "expected", "found"])


# -- Spark ------------------------------------------------------------------------------------

def _ranges_per_room(events: pd.DataFrame, groups: pd.DataFrame) -> pd.DataFrame:
    return ranges_of_room(events, groups) if len(events) else pd.DataFrame()


def _diffs_per_room(events: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    return differences_of_room(events, ranges)


def visibility_ranges(events: DataFrame, groups: DataFrame) -> DataFrame:
    """events (EVENTS_SCHEMA) and state groups (GROUPS_SCHEMA) -> ranges (RANGES_SCHEMA)."""

    return cogroup_rooms(events, groups, _ranges_per_room, RANGES_SCHEMA)


def visibility_differences(events: DataFrame, expected: DataFrame, found: DataFrame) -> DataFrame:
    """Per-event differences between two range tables of the same rooms (DIFF_SCHEMA)."""
    from pyspark.sql import functions as F

    cols = ["room_id", "user_id", "start_topological", "start_stream", "end_topological", "end_stream"]
    both = (expected.select(*cols).withColumn("side", F.lit("expected"))
            .unionByName(found.select(*cols).withColumn("side", F.lit("found"))))
    return cogroup_rooms(events, both, _diffs_per_room, DIFF_SCHEMA)
