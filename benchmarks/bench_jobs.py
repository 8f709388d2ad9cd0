"""Batch jobs end to end on PostgreSQL, against a single-process Python run of the same work.

    .venv/bin/python benchmarks/bench_jobs.py [--events N] [--rooms R] [--quick] [--cluster [--repeat N]]
    .venv/bin/python benchmarks/bench_jobs.py --chain-cover [--events N] [--rooms R] [--quick] [--data-dir D]

Starts a throwaway PostgreSQL (fsync on), generates ``--events`` events in ``--rooms`` rooms
through the real persist path (``generate_rooms``: big churny rooms, many small ones, every
history visibility, backfilled history), then measures, on that one database:

* **spark**: wall time of each job through the runner, as ``run_job`` runs it with
  ``SPARK_MASTER=local[2]``: JDBC reads split in partitions, the pure per-room functions in
  Spark, results written with COPY from Spark's Python workers to a staging table and swapped
  in (one transaction).
  Spark's own start-up (JVM, session) is reported apart.
* **python**: the same computation in this one process without Spark: the same SQL read with
  psycopg, the same per-room functions (``topology.room_orderings``, ``visibility.ranges_of_room``)
  in a loop, the result copied into a staging table and swapped in with the same statements.
* the visibility table's size (rows) against one row per visible (event, user) pair.
* ``--cluster``: the four jobs (both recomputations, both checks) on ``local[2]`` and on a
  standalone Spark cluster started here (a master and one worker of 2 cores, from pyspark's
  distribution; executors in JVMs of their own, the project's code shipped to them), on the
  same data in the same run, ``--repeat`` rounds alternating which goes first (medians);
  the single-process twins are skipped.

* ``--profile JOB`` (visibility, topological_ordering): that job's steps one at a time, each
  materialised, Spark's stages by executor run time (the UI's REST API) and py-spy on the
  Python workers during the per-room step (``PYSPY``: py-spy's path, default
  /tmp/pyspy/bin/py-spy; skipped without it).

* ``--chain-cover``: the chain cover jobs instead, on rooms whose state events carry real
  ``auth_events`` (as a homeserver selects them: create, power levels, the sender's and the
  target's membership, join rules). They are written straight into ``events`` here with COPY
  (the generator of ``generate_rooms`` does not produce auth events yet), a quarter of them
  state events, 1% of the rooms holding half of the events. Times ``rebuild_chain_cover``
  (Spark, local[2]), its single-process twin (the same SQL read, ``room_chain_cover`` per room,
  the same staging copy and swap) and ``check_chain_cover`` after the rebuild (0 differences
  expected).

Goals: each job <= 120 s end to end with local[2] (the chain-cover job too); the range
encoding >= 10x smaller.
Exit status 0 whether or not the goals are met.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _fetch(cursor, sql: str):  # -> pandas.DataFrame
    import pandas as pd

    cursor.execute(sql)
    return pd.DataFrame(cursor.fetchall(), columns=[d.name for d in cursor.description])


def python_topological_ordering() -> tuple[float, int]:
    """Single-process twin of the ``topological_ordering`` job; (seconds, rows read)."""
    from django.db import connection

    from streams.jobs import definitions, io
    from streams.jobs.dialect import for_database
    from streams.jobs.topology import orderings_in_python, rooms_to_walk

    t0 = time.monotonic()
    with connection.cursor() as cursor:
        events = _fetch(cursor, definitions._events_query(for_database()).sql(None, io.quote))
        # as the job: only the rooms with an event without a declared depth need their edges
        walk = sorted(rooms_to_walk(events))
        edges = (_fetch(cursor, definitions.EDGES.sql(walk if len(walk) <= definitions.WALK_ROOMS_IN_SQL else None,
                                                      io.quote))
                 if walk else events.iloc[0:0].reindex(columns=["room_id", "event_id", "prev_event_id"]))
    result = orderings_in_python(events[["room_id", "event_id", "stream_ordering", "depth"]].itertuples(index=False),
                                 edges[["room_id", "event_id", "prev_event_id"]].itertuples(index=False))
    stage = io.Staging.create("bench_topo", definitions.ORDERING_COLUMNS)
    try:
        _copy(stage, list(result.items()))
        definitions.apply_orderings(stage)
    finally:
        stage.drop()
    return time.monotonic() - t0, len(events)


def python_visibility() -> tuple[float, int, int, int]:
    """Single-process twin of the ``visibility`` job; (seconds, rows read, range rows,
    visible (event, user) pairs)."""
    import pandas as pd
    from django.db import connection

    from streams.jobs import definitions, io
    from streams.jobs.dialect import for_database
    from streams.jobs.visibility import ANYONE, SHARED_ERAS, ranges_of_room, room_visibility, seen_runs

    t0 = time.monotonic()
    low, high = definitions._stream_bounds(None)
    with connection.cursor() as cursor:
        events = _fetch(cursor, definitions._vis_events_query(for_database()).sql(None, io.quote))
        groups = _fetch(cursor, definitions._groups_query(for_database()).sql(None, io.quote))
    groups_by_room = dict(tuple(groups.groupby("room_id", sort=False)))
    empty = groups.iloc[0:0]
    frames, pairs = [], 0
    for room, ev in events.groupby("room_id", sort=False):
        g = groups_by_room.get(room, empty)
        frames.append(ranges_of_room(ev, g))
    rows = pd.concat(frames, ignore_index=True)
    stage = io.Staging.create("bench_vis", definitions.RANGE_COLUMNS)
    try:
        _copy(stage, list(rows.itertuples(index=False, name=None)))
        definitions.apply_ranges(stage, None, low, high)
    finally:
        stage.drop()
    seconds = time.monotonic() - t0
    # one row per (event, user): every real user's visible events (own rows, the shared eras
    # before their latest join, world-readable ones)
    for room, ev in events.groupby("room_id", sort=False):
        keys, runs, _, joins = room_visibility(ev, groups_by_room.get(room, empty))
        anyone = {i for s, e in runs.get(ANYONE, []) for i in range(s, e + 1)}
        shared = runs.get(SHARED_ERAS, [])
        for user in set(runs) | set(joins):
            if user in (ANYONE, SHARED_ERAS):
                continue
            seen = seen_runs(runs.get(user, []), shared, joins.get(user))
            covered = {i for s, e in seen for i in range(s, e + 1)}
            pairs += len(covered | anyone)
    return seconds, len(events), len(rows), pairs


def _copy(stage, rows: list[tuple]) -> None:
    import pandas as pd
    from django.db import connection

    connection.ensure_connection()
    names = ", ".join(n for n, _ in stage.columns)
    with connection.connection.cursor() as cursor:
        with cursor.copy(f"COPY {stage.name} ({names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([None if pd.isna(v) else v for v in row])


def generate_auth_rooms(url: str, events: int, rooms: int, seed: int = 1) -> tuple[int, int]:
    """Rooms of ``events`` events whose state events cite their auth events, COPYed into
    ``events``; (events written, state events)."""
    import json
    import random

    import psycopg

    rng = random.Random(seed)
    big = max(1, rooms // 100)
    sizes = [events // 2 // big] * big
    small = rooms - big
    sizes += [max(5, (events - sum(sizes)) // max(small, 1))] * small
    sizes[0] += max(0, events - sum(sizes))  # exactly ``events``
    stream = 0
    n_state = 0
    columns = ("stream_ordering", "topological_ordering", "depth", "event_id", "room_id", "type", "state_key",
               "sender", "membership", "rejected", "outlier", "received_ts", "json", "redacted", "instance_name")
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        with cursor.copy(f"COPY events ({', '.join(columns)}) FROM STDIN") as copy:
            for r, size in enumerate(sizes):
                room_id = f"!chain{r}:bench"
                creator = f"@u0_{r}:bench"
                state: dict[tuple[str, str], str] = {}
                members: list[str] = []
                last = None

                def emit(type_, sender, content, state_key=None, auth=()):
                    nonlocal stream, last, n_state
                    stream += 1
                    event_id = f"$c{r}_{stream}"
                    body = {"type": type_, "room_id": room_id, "sender": sender, "content": content,
                            "auth_events": [a for a in auth if a], "prev_events": [last] if last else [],
                            "depth": stream, "origin_server_ts": stream, "event_id": event_id}
                    if state_key is not None:
                        body["state_key"] = state_key
                        state[(type_, state_key)] = event_id
                        n_state += 1
                    copy.write_row((stream, stream, stream, event_id, room_id, type_, state_key, sender,
                                    content.get("membership"), False, False, 0, json.dumps(body).encode(),
                                    False, "bench"))
                    last = event_id

                def auth(sender, *extra):
                    return [state.get(("m.room.create", "")), state.get(("m.room.power_levels", "")),
                            state.get(("m.room.member", sender)), *extra]

                emit("m.room.create", creator, {"creator": creator}, "", [])
                emit("m.room.member", creator, {"membership": "join"}, creator, auth(creator))
                emit("m.room.power_levels", creator, {"users": {creator: 100}}, "", auth(creator))
                emit("m.room.join_rules", creator, {"join_rule": "public"}, "", auth(creator))
                members.append(creator)
                users = 1
                for _ in range(size - 4):
                    x = rng.random()
                    if x < 0.12 or len(members) < 2:  # someone joins (again)
                        if x < 0.04 and users > len(members):
                            user = f"@u{rng.randrange(users)}_{r}:bench"
                        else:
                            user, users = f"@u{users}_{r}:bench", users + 1
                        if user in members:
                            user, users = f"@u{users}_{r}:bench", users + 1
                        emit("m.room.member", user, {"membership": "join"}, user,
                             auth(user, state.get(("m.room.join_rules", ""))))
                        members.append(user)
                    elif x < 0.18:  # someone leaves
                        user = members.pop(rng.randrange(1, len(members)))
                        emit("m.room.member", user, {"membership": "leave"}, user, auth(user))
                    elif x < 0.22:
                        sender = rng.choice(members)
                        emit("m.room.topic", sender, {"topic": f"t{stream}"}, "", auth(sender))
                    elif x < 0.25:
                        emit("m.room.power_levels", creator,
                             {"users": {creator: 100, rng.choice(members): 50}}, "", auth(creator))
                    else:
                        sender = rng.choice(members)
                        emit("m.room.message", sender, {"body": "hi"}, None, auth(sender))
    return stream, n_state


def python_chain_cover() -> tuple[float, int]:
    """Single-process twin of ``rebuild_chain_cover``; (seconds, rows read)."""
    from django.db import connection

    from streams.jobs import definitions, io
    from streams.jobs.chain_cover import chain_cover_in_python
    from streams.jobs.dialect import for_database

    t0 = time.monotonic()
    low, high = definitions._stream_bounds(None)
    with connection.cursor() as cursor:
        events = _fetch(cursor, definitions._chain_events_query(for_database()).sql(None, io.quote))
    positions, links = chain_cover_in_python(events.itertuples(index=False, name=None))
    staged_positions = io.Staging.create("bench_chain_pos", definitions.POSITION_COLUMNS)
    staged_links = io.Staging.create("bench_chain_links", definitions.LINK_COLUMNS)
    try:
        _copy(staged_positions, positions)
        _copy(staged_links, links)
        definitions.apply_chain_cover(staged_positions, staged_links, None, low, high)
    finally:
        staged_positions.drop()
        staged_links.drop()
    return time.monotonic() - t0, len(events)


def bench_chain_cover(run_job) -> None:
    import os as _os

    results = {}
    for job in ("rebuild_chain_cover", "check_chain_cover"):
        t0 = time.monotonic()
        run = run_job(job, trigger="bench")
        results[job] = time.monotonic() - t0
        print(f"  spark  {job:22s} {results[job]:7.1f} s  ({run.status}; rows in {run.rows_in:,}, rows out "
              f"{run.rows_out:,}, differences {run.differences})", flush=True)
        if run.status != "succeeded":
            raise RuntimeError(run.error[-2000:])
    py, n = python_chain_cover()
    print(f"  python {'rebuild_chain_cover':22s} {py:7.1f} s  (rows in {n:,})", flush=True)
    check = run_job("check_chain_cover", trigger="bench")
    print(f"  check_chain_cover after the python twin's swap: {check.differences} differences")
    print()
    print(f"{'job':24s} {'spark local[2] s':>17s} {'python 1 process s':>19s} {'spark/python':>13s}  goal <= 120 s")
    print("-" * 90)
    s = results["rebuild_chain_cover"]
    print(f"{'rebuild_chain_cover':24s} {s:17.1f} {py:19.1f} {s / py:13.2f}  {'met' if s <= 120 else 'NOT met'}")
    c = results["check_chain_cover"]
    print(f"{'check_chain_cover':24s} {c:17.1f} {'':>19s} {'':>13s}  {'met' if c <= 120 else 'NOT met'}")
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in _os.getloadavg())}")


PYSPY = os.environ.get("PYSPY", "/tmp/pyspy/bin/py-spy")


def _python_workers(workers: bool = False) -> list[int]:
    """PIDs of this process's Spark Python daemons (descendants of this process), or with
    ``workers`` the processes they forked."""
    children: dict[int, list[int]] = {}
    cmdlines: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdlines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            if "pyspark.daemon" in cmdlines.get(child, ""):
                found.extend(children.get(child, []) if workers else [child])
            else:
                todo.append(child)
    return found


def _frame(text: str) -> str:
    """``function (path/file.py:line)`` -> ``function (file.py)``."""
    match = re.match(r"(.*) \((.*?):\d+\)$", text)
    return f"{match[1]} ({match[2].rsplit('/', 1)[-1]})" if match else text


def _top_frames(raw: str, limit: int = 25) -> list[tuple[str, int, int]]:
    """py-spy's collapsed stacks -> (function, own samples, samples with it on the stack)."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + int(count)
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + int(count)
    return sorted(((f, own.get(f, 0), n) for f, n in inclusive.items()), key=lambda x: -x[2])[:limit]


class _Steps:
    """A job's steps timed one at a time (each materialised: cached and counted), then Spark's
    stages by executor run time, and py-spy on the Python workers during one step."""

    def __init__(self, spark) -> None:
        self.spark, self.sc = spark, spark.sparkContext
        self.times: list[tuple[str, float]] = []
        self.spy_dir: Path | None = None
        self.sc.parallelize(range(2), 2).map(lambda x: x).count()  # the Python daemon, for py-spy

    def __call__(self, name: str, action, spy: bool = False):
        self.sc.setJobDescription(name)
        procs: list[subprocess.Popen] = []
        following = spy and Path(PYSPY).exists()
        if following:
            # one py-spy per Python process under the daemon (forked workers come and go)
            self.spy_dir = Path(os.environ.get("STATE_DIR", "/tmp")) / "pyspy"
            self.spy_dir.mkdir(exist_ok=True)
            for old in self.spy_dir.glob("*.txt"):  # an earlier run's samples
                old.unlink()
            stop = threading.Event()

            def follow() -> None:
                seen: set[int] = set()
                while not stop.is_set():
                    for pid in _python_workers(workers=True):
                        if pid not in seen:
                            seen.add(pid)
                            procs.append(subprocess.Popen(
                                [PYSPY, "record", "--format", "raw", "-o", str(self.spy_dir / f"{pid}.txt"),
                                 "--rate", "50", "--nonblocking", "--pid", str(pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                    stop.wait(0.5)

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            time.sleep(2)
        t0 = time.monotonic()
        out = action()
        self.times.append((name, time.monotonic() - t0))
        if following:
            stop.set()
            follower.join()
            for proc in procs:
                proc.send_signal(2)
            for proc in procs:
                proc.wait(timeout=60)
        print(f"  {name:52s} {self.times[-1][1]:7.1f} s", flush=True)
        return out

    def report(self) -> None:
        import json
        import urllib.request

        print(f"  {'total':52s} {sum(t for _, t in self.times):7.1f} s")
        url = self.sc.uiWebUrl
        if url:
            with urllib.request.urlopen(f"{url}/api/v1/applications/{self.sc.applicationId}/stages?status=complete") as r:
                stages = json.load(r)
            print("\n  Spark stages by executor run time (task time summed over the cores; cpu: the JVM's own):")
            print(f"  {'step':52s} {'stage':>5s} {'tasks':>5s} {'run s':>7s} {'cpu s':>7s}")
            for st in sorted(stages, key=lambda st: -st["executorRunTime"])[:12]:
                print(f"  {(st.get('description') or '(start-up)')[:52]:52s} {st['stageId']:5d} {st['numTasks']:5d} "
                      f"{st['executorRunTime'] / 1000:7.1f} {st['executorCpuTime'] / 1e9:7.1f}")
        if self.spy_dir is not None:
            raw = "\n".join(p.read_text() for p in self.spy_dir.glob("*.txt"))
            total = sum(int(line.rpartition(" ")[2]) for line in raw.splitlines() if line.rpartition(" ")[2].isdigit())
            print(f"\n  py-spy on the Python workers ({total:,} samples at 50/s): % of samples with the "
                  f"function on the stack, % in the function itself")
            for f, own_n, n in _top_frames(raw):
                print(f"  {100 * n / max(total, 1):5.1f}% {100 * own_n / max(total, 1):5.1f}%  {f}")


def profile_job(spark, job: str) -> None:
    """Where a job's time goes, step by step (``--profile JOB``)."""
    from streams.jobs import definitions as d
    from streams.jobs import io
    from streams.jobs.dialect import for_database

    step = _Steps(spark)
    low, high = step("stream bounds (one query)", lambda: d._stream_bounds(None))
    if job == "visibility":
        from streams.jobs.visibility import visibility_ranges

        events = io.read(spark, d._vis_events_query(for_database())).cache()
        step("read events + state group + prev events (JDBC)", events.count)
        groups = io.read(spark, d._groups_query(for_database())).cache()
        step("read state groups' member/hv rows (JDBC)", groups.count)
        result = visibility_ranges(events, groups).cache()
        n = step("per-room pass (cogroup by bucket, applyInPandas)", result.count, spy=True)
        stage = io.Staging.create("prof_vis", d.RANGE_COLUMNS)
        apply = lambda: d.apply_ranges(stage, None, low, high)  # noqa: E731
        frames = [result, groups, events]
    elif job == "topological_ordering":
        from pyspark.sql import functions as F

        from streams.jobs.topology import topological_ordering

        events = io.read(spark, d._events_query(for_database())).cache()
        step("read events + declared depth (JDBC)", events.count)
        walk = step("rooms to walk (an event without a depth)", lambda: events.where(F.col("depth").isNull())
                    .select("room_id").distinct().collect())
        edges = io.read(spark, d.EDGES, [r.room_id for r in walk]) if walk else None
        result = topological_ordering(events, edges).cache()
        n = step("orderings (SQL; the walk for those rooms)", result.count, spy=True)
        stage = io.Staging.create("prof_topo", d.ORDERING_COLUMNS)
        apply = lambda: d.apply_orderings(stage)  # noqa: E731
        frames = [result, events]
    else:
        raise SystemExit(f"--profile: visibility or topological_ordering, not {job}")
    try:
        step(f"staging write ({n:,} rows)", lambda: stage.write(result))
        step("swap (one transaction)", apply)
    finally:
        stage.drop()
    step.report()
    for df in frames:
        df.unpersist()


CLUSTER_JOBS = ("topological_ordering", "visibility", "check_topological_ordering", "check_visibility")


def compare_masters(run_job, spark_version: str, repeat: int) -> None:
    """The jobs on local[2] and on a standalone cluster (1 worker, 2 cores), same data, in
    ``repeat`` rounds that alternate which goes first (the driver's JVM is one for both, and
    warms up); medians."""
    import statistics

    from streams.jobs.session import spark_session, stop_spark
    from testing.services import SparkStandaloneCluster

    t0 = time.monotonic()
    cluster = SparkStandaloneCluster(cores=2, memory="2g").start()
    print(f"standalone cluster (master + 1 worker, 2 cores, 2g) started in {time.monotonic() - t0:.1f} s "
          f"at {cluster.url}", flush=True)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("SPARK_EXECUTOR_MEMORY", "2g")
    masters = [("local[2]", "local[2]"), ("cluster", cluster.url)]
    times: dict[str, dict[str, list[float]]] = {}
    startup = "start-up (session + 1 Python task)"
    try:
        for round_ in range(repeat):
            for label, master in (masters if round_ % 2 == 0 else masters[::-1]):
                stop_spark()
                t0 = time.monotonic()
                session = spark_session(master)
                # on the cluster, executors and their Python workers start with the first task
                session.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).count()
                times.setdefault(startup, {}).setdefault(label, []).append(time.monotonic() - t0)
                print(f"round {round_ + 1}: spark {spark_version} {label} {startup}: "
                      f"{times[startup][label][-1]:.1f} s", flush=True)
                for job in CLUSTER_JOBS:
                    t0 = time.monotonic()
                    run = run_job(job, trigger=f"bench {label}")
                    times.setdefault(job, {}).setdefault(label, []).append(time.monotonic() - t0)
                    print(f"  {label:8s} {job:28s} {times[job][label][-1]:7.1f} s  ({run.status}; rows in "
                          f"{run.rows_in:,}, rows out {run.rows_out:,}, differences {run.differences})", flush=True)
                    if run.status != "succeeded":
                        raise RuntimeError(f"{job} on {label}: {run.error[-2000:]}")
        stop_spark()
    finally:
        cluster.stop()
    print()
    print(f"medians of {repeat} round(s)")
    print(f"{'job':36s} {'local[2] s':>11s} {'cluster s':>10s} {'cluster/local':>14s}")
    print("-" * 74)
    for job, by in times.items():
        local, remote = statistics.median(by["local[2]"]), statistics.median(by["cluster"])
        print(f"{job:36s} {local:11.1f} {remote:10.1f} {remote / local:14.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=None, help="events to generate (default 1,000,000; --quick 100,000)")
    parser.add_argument("--rooms", type=int, default=None, help="rooms (default 10,000; --quick 1,000)")
    parser.add_argument("--users", type=int, default=None, help="users (default rooms x 2)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cluster", action="store_true",
                        help="compare local[2] with a standalone Spark cluster started here (jobs only)")
    parser.add_argument("--repeat", type=int, default=1, help="--cluster: rounds, alternating which goes first")
    parser.add_argument("--chain-cover", action="store_true",
                        help="the chain cover jobs, on rooms with real auth events written here")
    parser.add_argument("--profile", metavar="JOB",
                        help="visibility or topological_ordering step by step (Spark stages, py-spy on its Python "
                             "workers: PYSPY names py-spy, default /tmp/pyspy/bin/py-spy)")
    parser.add_argument("--data-dir", help="keep the generated PostgreSQL cluster here and reuse it next time "
                                           "(the same --events/--rooms/--users): skips the generation")
    args = parser.parse_args(argv)
    events = args.events or (100_000 if args.quick else 1_000_000)
    rooms = args.rooms or (1_000 if args.quick else 10_000)
    users = args.users or rooms * 2

    from _machine import cpu_description

    from benchmarks._setup import migrated_database

    t_begin = time.monotonic()
    dataset = f"{events} events, {rooms} rooms, {users} users, seed 1{', auth rooms' if args.chain_cover else ''}\n"
    marker = Path(args.data_dir or "/nonexistent") / "dataset"
    reuse = marker.exists() and marker.read_text() == dataset
    # Django after STATE_DIR (the cluster's directory) is set.
    with migrated_database("bench_jobs", env={"SPARK_MASTER": "local[2]"}, django_setup=False,
                           pg_directory=args.data_dir or "", keep=bool(args.data_dir), reuse=reuse) as db:
        url, server = db.url, db.pg
        marker = Path(server.directory) / "dataset"
        os.environ["STATE_DIR"] = server.directory
        env = {**db.env, "STATE_DIR": server.directory}
        print(f"machine: {cpu_description()}; {platform.platform()}; python {platform.python_version()}")
        if reuse:
            print(f"reusing {events:,} events in {rooms:,} rooms for {users:,} users from {server.directory}")
        elif args.chain_cover:
            print(f"writing {events:,} events with auth events in {rooms:,} rooms ...", flush=True)
            t0 = time.monotonic()
            written, n_state = generate_auth_rooms(url, events, rooms)
            print(f"wrote {written:,} events ({n_state:,} state events) in {time.monotonic() - t0:.0f} s", flush=True)
            subprocess.run(["psql", "-q", url, "-c", "VACUUM ANALYZE"], check=False)
            if args.data_dir:
                marker.write_text(dataset)
        else:
            print(f"generating {events:,} events in {rooms:,} rooms for {users:,} users through persist_events ...",
                  flush=True)
            t0 = time.monotonic()
            subprocess.run([sys.executable, "manage.py", "generate_rooms", "--rooms", str(rooms), "--users",
                            str(users), "--events", str(events), "--seed", "1", "--batch", "1000"],
                           check=True, cwd=ROOT, env=env)
            print(f"generated in {time.monotonic() - t0:.0f} s", flush=True)
            subprocess.run(["psql", "-q", url, "-c", "VACUUM ANALYZE"], check=False)
            if args.data_dir:
                marker.write_text(dataset)

        import django

        django.setup()
        from pyspark import __version__ as spark_version

        from streams.jobs.runner import run_job
        from streams.jobs.session import spark_session

        if args.chain_cover:
            t0 = time.monotonic()
            spark_session()
            print(f"spark {spark_version} local[2] session start-up: {time.monotonic() - t0:.1f} s")
            bench_chain_cover(run_job)
            print(f"total time {time.monotonic() - t_begin:.0f} s")
            return 0
        if args.profile:
            t0 = time.monotonic()
            session = spark_session()
            print(f"spark {spark_version} local[2] session start-up: {time.monotonic() - t0:.1f} s")
            profile_job(session, args.profile)
            print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
            return 0
        if args.cluster:
            compare_masters(run_job, spark_version, args.repeat)
            print(f"total time {time.monotonic() - t_begin:.0f} s")
            return 0
        t0 = time.monotonic()
        spark_session()
        startup = time.monotonic() - t0
        print(f"spark {spark_version} local[2] session start-up: {startup:.1f} s")
        results = {}
        for job in ("topological_ordering", "visibility"):
            t0 = time.monotonic()
            run = run_job(job, trigger="bench")
            results[job] = (time.monotonic() - t0, run.rows_in, run.rows_out)
            print(f"  spark  {job:22s} {results[job][0]:7.1f} s  (rows in {run.rows_in:,}, rows out {run.rows_out:,})",
                  flush=True)
        py_topo, n_topo = python_topological_ordering()
        print(f"  python {'topological_ordering':22s} {py_topo:7.1f} s  (rows in {n_topo:,})", flush=True)
        py_vis, n_vis, range_rows, pairs = python_visibility()
        print(f"  python {'visibility':22s} {py_vis:7.1f} s  (rows in {n_vis:,}, range rows {range_rows:,})", flush=True)
        check = run_job("check_visibility", trigger="bench")
        print(f"  check_visibility after both: {check.differences} differences")

        print()
        print(f"{'job':24s} {'spark local[2] s':>17s} {'python 1 process s':>19s} {'spark/python':>13s}  goal <= 120 s")
        print("-" * 90)
        for job, py in (("topological_ordering", py_topo), ("visibility", py_vis)):
            s = results[job][0]
            print(f"{job:24s} {s:17.1f} {py:19.1f} {s / py:13.2f}  {'met' if s <= 120 else 'NOT met'}")
        ratio = pairs / range_rows if range_rows else float("inf")
        print(f"\nvisibility: {range_rows:,} range rows vs {pairs:,} (event, user) rows: {ratio:.1f}x smaller "
              f"(goal >= 10x: {'met' if ratio >= 10 else 'NOT met'})")
        print(f"total time {time.monotonic() - t_begin:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
