"""What one fork costs the persist path's planner, against the room's state size.

    .venv/bin/python benchmarks/bench_forks.py [--sizes 1000,20000,100000] [--forks 30]
        [--baseline /path/to/older/checkout] [--rounds 2] [--quick]

A room (version 10) with ``size`` members is planned through ``plan_batch`` (in memory: a
reader over dicts, no database), then ``--forks`` times the fork ``generate_rooms`` makes in
its big rooms (``RoomGenerator._fork``): a history-visibility change on one branch, a message
on the other, a merge -- planned as one batch, with a few messages after it. The figure is
the process CPU time of planning the fork's batch (median, ms): state resolution (split, auth
difference), the merge's group, current state, visibility. The built room is frozen for the
garbage collector first (``gc.freeze``, as the persister does in bulk), so a collection
walking it does not land in a fork's time.

``--baseline``: the same measurement run with another checkout's ``streams`` (e.g. a
``git worktree`` of the commit before), in alternating subprocesses, so both see the same
load. Each subprocess builds its rooms once and reports every size.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HV = ("m.room.history_visibility", "")
VISIBILITIES = ["shared", "joined", "invited", "world_readable"]


def worker(sizes: list[int], forks: int) -> dict:
    """Runs inside the checkout under test (its ``streams`` first on sys.path)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")
    import django

    django.setup()
    from rooms.matrix.room_versions import KNOWN_ROOM_VERSIONS
    from rooms.storage import authorization, planner
    from rooms.storage.incoming_events import parse_events
    from rooms.storage.pdus import PduRoom
    from rooms.storage.plan_snapshot import KnownEvent, RoomContext, Snapshot
    from rooms.storage.state_groups import plan_group
    from rooms.storage.visibility_ranges import SHARED_ERAS, RangeSet

    try:
        from rooms.storage.state_deltas import GroupLineage
    except ImportError:  # a checkout from before forks were decided from deltas
        GroupLineage = None

    class Infos(authorization.RoomInfos):
        def __call__(self, body):
            return self.get(body.get("room_id"))

        def created(self, room_id, info) -> None:
            self._d.setdefault(room_id, info)

        def load(self, room_ids, cursor=None) -> None:
            return None

        def commit(self) -> None:
            return None

    class Reader:
        """The planner's reader over dicts; a group's state is built on demand from its
        nearest cached ancestor (a copy per group would make building a big room quadratic)."""

        def __init__(self, infos) -> None:
            self.matrix = authorization.MatrixEvents(infos)
            self.resolved = authorization.ResolvedStates()
            chains = authorization.RoomAuthChains()
            # a checkout whose planner reads the chains through a batch view
            if not hasattr(chains, "batch"):
                self.chains = chains
            else:
                try:
                    self.chains = chains.batch(stored=False)  # no database under this planner
                except TypeError:  # a checkout whose batch view reads through a cursor
                    self.chains = chains.batch(None)
            if GroupLineage is not None:
                self.lineage = GroupLineage()
            self.groups: dict = {}
            self.states: dict = {}
            self.facts: dict = {}
            self.next_id = 0

        def state_of_group(self, group):
            state = self.states.get(group)
            if state is None:
                chain, g = [], group
                while g is not None and g not in self.states:
                    chain.append(self.groups[g])
                    g = self.groups[g].parent
                state = dict(self.states[g]) if g is not None else {}
                for ng in reversed(chain):
                    state.update(ng.rows)
                self.remember_state(group, state)
            return state

        def chain_length(self, group):
            return self.groups[group].chain_length

        def new_group(self, gid=None, *, room_id, event_id, parent, parent_chain_length, delta, full_state, hint=64):
            self.next_id += 1  # (a checkout whose planner takes its IDs from the snapshot passes gid)
            g = plan_group(self.next_id if gid is None else gid, room_id=room_id, event_id=event_id, parent=parent,
                           parent_chain_length=parent_chain_length, delta=delta, full_state=full_state)
            self.groups[g.id] = g
            if g.parent is None:
                self.states[g.id] = g.rows
            return g

        def remember_state(self, group, state) -> None:
            self.states[group] = state
            if len(self.states) > 256:  # keep memory bounded, as the persister's LRU does
                for old in list(self.states)[:64]:
                    if self.groups[old].parent is not None:
                        del self.states[old]

        def load_facts(self, event_ids) -> None:
            return None

        def put_facts(self, event_id, membership, visibility) -> None:
            self.facts[event_id] = (membership, visibility)

        def membership(self, event_id):
            return None if event_id is None else self.facts.get(event_id, (None, None))[0]

        def visibility(self, event_id):
            return "shared" if event_id is None else self.facts.get(event_id, (None, None))[1] or "shared"

        def delta(self, unused_group_ids):
            return None  # the dicts are the caches

    version = KNOWN_ROOM_VERSIONS["10"]
    creator = "@creator:bench.example"
    out = {}
    for size in sizes:
        infos = Infos()
        reader = Reader(infos)
        known: dict = {}
        ctx_box: dict = {}
        stream = [1]

        def plan(items, backfill=False, infos=infos, reader=reader, known=known, ctx_box=ctx_box, stream=stream):
            events = parse_events(items, infos)
            ids = list(range(stream[0], stream[0] + len(events)))
            stream[0] += len(events)
            room_id = events[0].room_id
            ctx = ctx_box.get(room_id)
            if ctx is None:
                ctx = ctx_box[room_id] = RoomContext(room_id, info=infos.get(room_id))
                ctx.ranges[SHARED_ERAS] = RangeSet()
            ctx.info = infos.get(room_id)
            wanted = {p for ev in events for p in ev.prev_events}
            snapshot = Snapshot(rooms={room_id: ctx}, known={e: known[e] for e in wanted if e in known})
            if hasattr(snapshot, "group_ids"):  # the IDs this batch's groups take
                snapshot.group_ids = list(range(reader.next_id + 1, reader.next_id + 1 + 2 * len(events)))
            plan = planner.plan_batch(events, ids, snapshot, reader, backfill=backfill, now_ms=1)
            infos.commit()
            # a checkout whose planner changes neither the events nor the snapshot: its decisions
            # are the plan's copies and forks
            for after in getattr(plan, "rooms_after", ()):
                ctx_box[after.room_id] = after
            for ev in getattr(plan, "decided", None) or events:
                known[ev.event_id] = KnownEvent(ev.event_id, ev.room_id, ev.topological_ordering,
                                                ev.stream_ordering, ev.outlier, bool(ev.rejected_reason),
                                                ev.state_group_after)

        b = PduRoom(version, "!bench:bench.example")
        plan([b.create(creator)[1]])
        plan([b.member(creator, "join")[1], b.power_levels(creator, {creator: 100})[1],
              b.join_rules(creator, "public")[1], b.visibility(creator, "shared")[1]])
        members = [f"@user{i}:s{i % 50}.example" for i in range(size)]
        batch = []
        t0 = time.perf_counter()
        for user in members:
            batch.append(b.member(user, "join")[1])
            if len(batch) == 1000:
                plan(batch)
                batch = []
        if batch:
            plan(batch)
        built = time.perf_counter() - t0
        gc.collect()
        gc.freeze()  # as the persister does in bulk (persist.FREEZE_EVERY): the room just built is long-lived
        times = []
        for n in range(forks):
            tip, before = b.last, dict(b.state)
            hv_id, hv = b.event("m.room.history_visibility", creator,
                                {"history_visibility": VISIBILITIES[n % len(VISIBILITIES)]}, state_key="",
                                prev=[tip], state=before, advance=False)
            chat = b.message(members[n % size], "on the other branch")
            b.state[HV] = hv_id
            merge = b.message(creator, "merged", prev=[chat[0], hv_id])
            c0 = time.process_time()
            plan([hv, chat[1], merge[1]])
            times.append(time.process_time() - c0)
            plan([b.message(members[(n * 7) % size], f"after {n} {i}")[1] for i in range(3)])
        out[str(size)] = {"fork_ms": statistics.median(times) * 1e3, "build_s": built,
                          "state_keys": len(ctx_box[b.room_id].current)}
    return out


def run_tree(tree: Path, sizes: list[int], forks: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), STATE_DIR=os.environ.get("STATE_DIR", "/tmp/bench_forks_state"))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", "--tree", str(tree),
                           "--sizes", ",".join(map(str, sizes)), "--forks", str(forks)],
                          env=env, cwd=str(tree), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the run in {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,20000,100000")
    parser.add_argument("--forks", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each tree")
    parser.add_argument("--baseline", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--quick", action="store_true", help="sizes 1000,20000; 10 forks; 1 round")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.quick:
        sizes, args.forks, args.rounds = [s for s in sizes if s <= 20_000] or sizes[:1], 10, 1
    if args.worker:
        sys.path.insert(0, str(args.tree))
        print(json.dumps(worker(sizes, args.forks)))
        return 0
    sys.path.insert(0, str(ROOT))
    from benchmarks._machine import cpu_description, load_average

    trees = {"this": ROOT}
    if args.baseline is not None:
        trees = {"baseline": args.baseline.resolve(), "this": ROOT}
    print(f"machine: {cpu_description()}; load {load_average()}; sizes {sizes}, {args.forks} forks, "
          f"{args.rounds} alternating round(s)")
    results: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            results[name].append(run_tree(tree, sizes, args.forks))
    print(f"load after: {load_average()}")
    print(f"{'state keys':>10} " + " ".join(f"{name + ' ms/fork':>18}" for name in trees)
          + ("   baseline/this" if len(trees) > 1 else ""))
    for size in sizes:
        ms = {name: statistics.median(r[str(size)]["fork_ms"] for r in runs) for name, runs in results.items()}
        keys = results["this"][0][str(size)]["state_keys"]
        line = f"{keys:>10} " + " ".join(f"{ms[name]:>18.2f}" for name in trees)
        if len(trees) > 1:
            line += f"   {ms['baseline'] / ms['this']:8.1f}x"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
