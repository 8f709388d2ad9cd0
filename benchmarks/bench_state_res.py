"""State resolution of a fork in a big room: ours (``rooms.matrix.state_res``) against
Synapse's Python implementation (``synapse.state.v2``), on the same events, in the same run.

    .venv/bin/python benchmarks/bench_state_res.py [--members 10000] [--repeat 7] [--quick]

The room: a create event, the admin's join, power levels, public join rules, then
``--members`` joins, all in one line; then a fork. On one branch the admin changes the power
levels, topic, name and history visibility and 46 members change their display names; on the
other a moderator bans 10 of those members, changes the same four keys (some of it fails auth),
and the other 36 members rename themselves differently. That gives 50 conflicted keys over
two state sets of ~10,000 entries each. Room versions 10 (state res v2) and 12 (v2.1).

Measured (median of ``--repeat`` rounds, each running the three in turn, one process):
* **synapse**: ``resolve_events_with_store`` with its events already in memory (the store
  answers ``get_events`` from a dict, as a warm event cache would) and the auth difference /
  conflicted subgraph precomputed (as its chain cover index would give them), so only the
  algorithm is timed;
* **ours, same inputs**: ``resolve`` with the same precomputed auth-graph facts;
* **ours, walking**: ``resolve`` computing the auth difference and subgraph itself by walking
  the auth graph (what it does with no index).
The results of all three are checked equal. Goal: ours >= 2x faster than Synapse's.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import synapse.event_auth  # noqa: E402,F401  (must precede synapse.state: circular import)
from synapse.api.room_versions import KNOWN_ROOM_VERSIONS as SYNAPSE_VERSIONS  # noqa: E402
from synapse.events import make_event_from_dict  # noqa: E402
from synapse.state import v2 as synapse_v2  # noqa: E402
from synapse.storage.databases.main.event_federation import StateDifference  # noqa: E402

from benchmarks._machine import cpu_description, load_average  # noqa: E402
from rooms.matrix import chain_index  # noqa: E402
from rooms.matrix.auth_rules import auth_types_for_event  # noqa: E402
from rooms.matrix.event_format import parse_pdu, with_content_hash  # noqa: E402
from rooms.matrix.room_versions import KNOWN_ROOM_VERSIONS  # noqa: E402
from rooms.matrix.state_res import auth_difference, conflicted_subgraph, resolve, split  # noqa: E402
from testing.synapse_oracle import NoWaitClock, run_sync  # noqa: E402  (Synapse called synchronously, as the tests do)

ADMIN, MOD = "@admin:s1", "@mod:s2"


class Room:
    """A room built without per-event state copies (the benchmark's rooms are big)."""

    def __init__(self, version_id: str):
        self.version = KNOWN_ROOM_VERSIONS[version_id]
        self.events = {}
        self.pdus = []
        self.ts = 1_700_000_000_000
        self.room_id = None if self.version.room_id_from_create_event else "!bench:s1"

    def add(self, state: dict, prev: str | None, sender, etype, content, state_key=None) -> str:
        self.ts += 1
        pdu = {"type": etype, "sender": sender, "content": content, "depth": len(self.pdus) + 1,
               "origin_server_ts": self.ts, "prev_events": [prev] if prev else [],
               "auth_events": []}
        if state_key is not None:
            pdu["state_key"] = state_key
        if self.room_id is not None:
            pdu["room_id"] = self.room_id
        if prev is not None:
            draft = parse_pdu(with_content_hash(pdu), self.version)
            auth = [state[k] for k in sorted(auth_types_for_event(draft)) if k in state]
            if self.version.room_id_from_create_event:
                auth = [a for a in auth if self.events[a].key != ("m.room.create", "")]
            pdu["auth_events"] = auth
        pdu = with_content_hash(pdu)
        event = parse_pdu(pdu, self.version)
        if self.room_id is None:
            self.room_id = event.room_id
        self.events[event.event_id] = event
        self.pdus.append(pdu)
        if state_key is not None:
            state[event.key] = event.event_id
        return event.event_id


def build(version_id: str, members: int):
    room = Room(version_id)
    v = room.version
    state: dict = {}
    create = {"room_version": version_id}
    if not v.implicit_room_creator:
        create["creator"] = ADMIN
    head = room.add(state, None, ADMIN, "m.room.create", create, "")
    head = room.add(state, head, ADMIN, "m.room.member", {"membership": "join"}, ADMIN)
    users = {MOD: 50} if v.creators_have_infinite_power else {ADMIN: 100, MOD: 50}
    head = room.add(state, head, ADMIN, "m.room.power_levels", {"users": users}, "")
    head = room.add(state, head, ADMIN, "m.room.join_rules", {"join_rule": "public"}, "")
    head = room.add(state, head, MOD, "m.room.member", {"membership": "join"}, MOD)
    names = [f"@u{i}:s{3 + i % 5}" for i in range(members)]
    for user in names:
        head = room.add(state, head, user, "m.room.member", {"membership": "join"}, user)

    # branch X: the admin
    sx, hx = dict(state), head
    hx = room.add(sx, hx, ADMIN, "m.room.power_levels",
                  {"users": dict(users, **{names[0]: 50}), "kick": 50, "ban": 50}, "")
    for etype, content in (("m.room.topic", {"topic": "x"}), ("m.room.name", {"name": "x"}),
                           ("m.room.history_visibility", {"history_visibility": "joined"})):
        hx = room.add(sx, hx, ADMIN, etype, content, "")
    for user in names[1:47]:
        hx = room.add(sx, hx, user, "m.room.member", {"membership": "join", "displayname": "x"}, user)
    # branch Y: the moderator, interleaved in time with X's events
    sy, hy = dict(state), head
    hy = room.add(sy, hy, MOD, "m.room.power_levels",
                  {"users": dict(users, **{names[1]: 25}), "kick": 50, "ban": 50}, "")
    for etype, content in (("m.room.topic", {"topic": "y"}), ("m.room.name", {"name": "y"}),
                           ("m.room.history_visibility", {"history_visibility": "shared"})):
        hy = room.add(sy, hy, MOD, etype, content, "")
    for user in names[1:11]:
        hy = room.add(sy, hy, MOD, "m.room.member", {"membership": "ban"}, user)
    for user in names[11:47]:
        hy = room.add(sy, hy, user, "m.room.member", {"membership": "join", "displayname": "y"}, user)
    return room, [sx, sy]


class _Store:
    def __init__(self, events, difference, subgraph):
        self.events, self.difference, self.subgraph = events, difference, subgraph

    async def get_events(self, event_ids, allow_rejected=False):
        events = self.events
        return {e: events[e] for e in event_ids if e in events}

    async def get_auth_chain_difference(self, room_id, state_sets, conflicted_state=None,
                                        additional_backwards_reachable_conflicted_events=None):
        return StateDifference(auth_difference=set(self.difference),
                               conflicted_subgraph=set(self.subgraph) if conflicted_state is not None else None)


def _interleaved_medians(fns: dict, repeat: int) -> tuple[dict, dict]:
    """Median seconds of each function, run in turn within every round (so a load change on
    the shared machine hits all of them alike); and each one's last result."""
    times = {name: [] for name in fns}
    results = {}
    for _ in range(repeat):
        for name, fn in fns.items():
            gc.collect()
            t0 = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}, results


def bench(version_id: str, members: int, repeat: int) -> dict:
    t0 = time.perf_counter()
    room, state_sets = build(version_id, members)
    synapse_events = {}
    for pdu in room.pdus:
        e = make_event_from_dict(dict(pdu), SYNAPSE_VERSIONS[version_id])
        synapse_events[e.event_id] = e
    built = time.perf_counter() - t0
    v = room.version
    _, conflicted = split(state_sets)
    conflicted_ids = set().union(*conflicted.values())
    difference = auth_difference([set(s.values()) for s in state_sets], room.events)
    subgraph = conflicted_subgraph(conflicted_ids, room.events)

    def precomputed(sets, conflicted_or_none):
        return difference, (subgraph if conflicted_or_none is not None else None)

    index = chain_index.build(chain_index.IndexEvent(e.event_id, e.type, e.state_key, e.auth_event_ids)
                              for e in room.events.values() if e.is_state)  # as the persist path keeps it
    indexed = index.graph_facts(room.events)
    store = _Store(synapse_events, difference, subgraph)
    seconds, results = _interleaved_medians({
        "synapse": lambda: dict(run_sync(synapse_v2.resolve_events_with_store(
            NoWaitClock(), room.room_id, SYNAPSE_VERSIONS[version_id], state_sets, None, store))),
        "ours": lambda: resolve(v, state_sets, room.events, (), graph_facts=precomputed),
        "walking": lambda: resolve(v, state_sets, room.events, ()),
        "index": lambda: resolve(v, state_sets, room.events, (), graph_facts=indexed),
    }, repeat)
    ours = results["ours"]
    assert ours == results["synapse"] == results["walking"] == results["index"], "results differ"
    theirs_s, ours_s, walk_s = seconds["synapse"], seconds["ours"], seconds["walking"]
    changed = sum(1 for k in conflicted if ours.get(k) in state_sets[1].values()
                  and ours.get(k) != state_sets[0].get(k))
    return {"version": version_id, "events": len(room.events), "conflicted_keys": len(conflicted),
            "full_conflicted": len(conflicted_ids | difference | (subgraph if v.state_res.value == 3 else set())),
            "won_by_branch_y": changed, "build_s": built,
            "synapse_ms": theirs_s * 1e3, "ours_ms": ours_s * 1e3, "ours_walking_ms": walk_s * 1e3,
            "ours_index_ms": seconds["index"] * 1e3}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    args = parser.parse_args(argv)
    repeat = 3 if args.quick else args.repeat
    print(f"machine: {cpu_description()}; load {load_average()}; "
          f"{args.members} members, median of {repeat}")
    for version_id in ("10", "12"):
        r = bench(version_id, args.members, repeat)
        print(f"room v{r['version']}: {r['events']} events, {r['conflicted_keys']} conflicted keys, "
              f"full conflicted set {r['full_conflicted']}, {r['won_by_branch_y']} keys won by the "
              f"moderator's branch (built in {r['build_s']:.1f} s)")
        print(f"  synapse (precomputed auth difference) {r['synapse_ms']:8.2f} ms")
        print(f"  ours    (same inputs)                 {r['ours_ms']:8.2f} ms   "
              f"{r['synapse_ms'] / r['ours_ms']:.1f}x faster (goal >= 2x)")
        print(f"  ours    (walking the auth graph)      {r['ours_walking_ms']:8.2f} ms   "
              f"{r['synapse_ms'] / r['ours_walking_ms']:.1f}x")
        print(f"  ours    (chain cover index)           {r['ours_index_ms']:8.2f} ms   "
              f"{r['synapse_ms'] / r['ours_index_ms']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
