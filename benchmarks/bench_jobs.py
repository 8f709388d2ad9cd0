"""Batch jobs end to end on PostgreSQL, against a single-process Python run of the same work.

    .venv/bin/python benchmarks/bench_jobs.py [--events N] [--rooms R] [--quick] [--jobs topology,visibility,chain_cover]
    .venv/bin/python benchmarks/bench_jobs.py --data-dir D [--jobs ...] [--count-pairs]
    .venv/bin/python benchmarks/bench_jobs.py --chain-cover ...     # the same as --jobs chain_cover
    .venv/bin/python benchmarks/bench_jobs.py ... --cluster [--repeat N] | --profile JOB

Starts a throwaway PostgreSQL (fsync on), generates ``--events`` events in ``--rooms`` rooms
through the real persist path (``generate_rooms``: big churny rooms, many small ones, every
history visibility, backfilled history, real auth events), or reuses a kept dataset
(``--data-dir``), then measures, on that one database, each job and its check (ordering,
visibility, chain cover: ``--jobs``), one after the other:

* **spark**: wall time of the job through the runner, as ``run_job`` runs it with
  ``SPARK_MASTER=local[2]``: JDBC reads split in partitions, the pure per-room functions in
  Spark, results written with COPY from Spark's Python workers to a staging table and swapped
  in (one transaction). Spark's own start-up (JVM, session, the first Python workers) is
  reported apart.
* **python**: its single-process twin, right after: the same SQL read with psycopg, the same
  per-room functions (``topology.orderings_in_python``, ``visibility.ranges_of_room`` /
  ``differences_of_room``, ``chain_cover.chain_cover_in_python``) in a loop, the result copied
  into a staging table and swapped in with the same statements (a check compares instead).
  The visibility twins stream: each query through a server-side cursor ordered by room (byte
  order), the streams merged, one room's rows at a time in memory, ranges copied as they come
  (read whole into pandas, 10 M events and 26 M group rows took more than the machine's 24 GB).
* for both, the CPU seconds of the database (the postmaster's process tree: every statement
  the step ran) and of this side (this process's tree: the driver's JVM and Spark's Python
  workers, or the twin), so a step bound by PostgreSQL work both sides share shows as such;
  "ceiling" is 2 x the twin's CPU over Spark's: the ratio this Spark would reach keeping both
  cores busy all the time against a twin that never waits (below 2 whenever Spark spends more
  CPU than the twin on the same result).
* ``--count-pairs``: the visibility table's size (rows) against one row per visible (event,
  user) pair (slow: it expands every user's events).

**Datasets.** ``--data-dir D`` keeps the PostgreSQL cluster in ``D`` and reuses it next time
(the same ``--events/--rooms/--users``). It also takes a directory made by
``bench_storage.py --data-dir D``: its ``dataset.json`` says what it holds (events, rooms,
users), the database is ``bench_storage``, nothing is generated. The jobs rewrite what
differs (an ordering, ranges, the chain cover index with new chain numbers) in one
transaction each, and the tables are vacuumed and analysed at the end, so bench_storage's
reads run on the dataset afterwards (same results: what the jobs write is what the persist
path maintains; the 50 ``!baseline`` rooms of bare rows that bench_storage writes, outside
its reads, get orderings 1 instead of 0 the first time).

At 10 M events, on the dataset bench_storage builds once:

    # D10: the directory bench_storage.py --data-dir kept (copy it first only if the disk holds two)
    .venv/bin/python benchmarks/bench_jobs.py --data-dir D10
    .venv/bin/python benchmarks/bench_jobs.py --data-dir D10 --cluster --repeat 1

* ``--cluster``: the six jobs (the three recomputations, the three checks) on ``local[2]`` and on a
  standalone Spark cluster started here (a master and one worker of 2 cores, from pyspark's
  distribution; executors in JVMs of their own, the project's code shipped to them), on the
  same data in the same run, ``--repeat`` rounds alternating which goes first (medians);
  the single-process twins are skipped.

* ``--profile JOB`` (visibility, topological_ordering): that job's steps one at a time, each
  materialised, Spark's stages by executor run time (the UI's REST API) and py-spy on the
  Python workers during the per-room step (``PYSPY``: py-spy's path, default
  /tmp/pyspy/bin/py-spy; skipped without it).

Goals: each job and check <= 15 min end to end with local[2], and >= 2x
faster than its twin; at 10 M <= 10x the 1 M time.
Exit status 0 whether or not the goals are met.
"""
from __future__ import annotations

import argparse
import contextlib
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

from benchmarks._setup import add_pg_settings_arguments, migrated_database, pg_settings_of  # noqa: E402


def _fetch(cursor, sql: str):  # -> pandas.DataFrame
    import pandas as pd

    cursor.execute(sql)
    return pd.DataFrame(cursor.fetchall(), columns=[d.name for d in cursor.description])


def _read(query) -> "object":  # -> pandas.DataFrame
    """``query`` (an ``io.Query``) read whole with psycopg, as the jobs' JDBC read does in partitions."""
    from django.db import connection

    from jobs import io

    with connection.cursor() as cursor:
        return _fetch(cursor, query.sql(None, io.quote))


# The single-process twins: each returns (rows read, rows written or differences found); the
# caller times them. Same SQL as the jobs, the same pure per-room functions, the same swap.

def _orderings_in_python():
    """As the job: the strayed events, and the rooms to walk whole with their edges."""
    from jobs import definitions
    from jobs.job_dialect import for_database
    from jobs.topology import orderings_in_python, rooms_to_walk

    events = _read(definitions._strayed_query(for_database()))
    walk = sorted(rooms_to_walk(events))
    if walk:
        from django.db import connection

        from jobs import io

        in_sql = walk if len(walk) <= definitions.WALK_ROOMS_IN_SQL else None
        with connection.cursor() as cursor:
            whole = _fetch(cursor, definitions._events_query(for_database()).sql(in_sql, io.quote))
            edges = _fetch(cursor, definitions.EDGES.sql(in_sql, io.quote))
        import pandas as pd

        events = pd.concat([events[~events["room_id"].isin(walk)], whole[whole["room_id"].isin(walk)]],
                           ignore_index=True)
        edges = edges[edges["room_id"].isin(walk)]
    else:
        edges = events.iloc[0:0].reindex(columns=["room_id", "event_id", "prev_event_id"])
    result = orderings_in_python(events[["room_id", "event_id", "stream_ordering", "depth"]].itertuples(index=False),
                                 edges[["room_id", "event_id", "prev_event_id"]].itertuples(index=False))
    return events, result


def python_topological_ordering() -> tuple[int, int]:
    """Twin of ``topological_ordering``: (rows read, events changed)."""
    from jobs import definitions, io

    rows_in = definitions.count_events(None)
    _, result = _orderings_in_python()
    stage = io.Staging.create("bench_topo", definitions.ORDERING_COLUMNS)
    try:
        _copy(stage, list(result.items()))
        changed = definitions.apply_orderings(stage)
    finally:
        stage.drop()
    return rows_in, changed


def python_check_topological_ordering() -> tuple[int, int]:
    """Twin of ``check_topological_ordering``: (rows read, differences)."""
    from jobs import definitions

    rows_in = definitions.count_events(None)
    events, result = _orderings_in_python()
    stored = dict(zip(events["event_id"], events["topological_ordering"]))
    differences = sum(1 for e, t in result.items() if stored.get(e) != t) + len(stored.keys() - result.keys())
    return rows_in, differences


#: rows per fetch of the streaming twins' server-side cursors
_FETCH = 20_000


def _by_room(queries):
    """Room by room, in byte order of room ID: ``(room, [that room's rows of each query])``
    (an empty list where a query has none), streaming each query through a server-side
    cursor ordered by room: a single process holding one room at a time, where reading the
    10 M events' rows and 26 M group rows into pandas at once took more than the machine's
    memory (the twin of visibility was killed at 17.4 GB)."""
    import heapq
    import itertools

    from django.db import connection, transaction

    from jobs import io

    def rows_of(k, query):
        sql = f"SELECT * FROM ({query.sql(None, io.quote)}) AS q ORDER BY room_id COLLATE \"C\""
        with connection.connection.cursor(name=f"bench_twin_{k}") as cursor:
            cursor.itersize = _FETCH
            cursor.execute(sql)
            for room, rows in itertools.groupby(cursor, key=lambda r: r[0]):
                yield room, k, list(rows)

    with transaction.atomic():  # (a named cursor lives in a transaction)
        connection.ensure_connection()
        merged = heapq.merge(*(rows_of(k, q) for k, q in enumerate(queries)), key=lambda t: t[0])
        for room, parts in itertools.groupby(merged, key=lambda t: t[0]):
            found = [[] for _ in queries]
            for _, k, rows in parts:
                found[k] = rows
            yield room, found


def _vis_queries():
    """The visibility job's two queries (events, state groups), as the job reads them."""
    from jobs import definitions
    from jobs.job_dialect import for_database

    dialect = for_database()
    return definitions._vis_events_query(dialect), definitions._groups_query(dialect)


def _room_frame(rows: list, query) -> "object":  # -> pandas.DataFrame of one room's rows of query
    import pandas as pd

    return pd.DataFrame(rows, columns=list(query.columns))


def python_visibility() -> tuple[int, int]:
    """Twin of ``visibility``: (rows read, range rows inserted). Streams the rooms
    (:func:`_by_room`), their ranges COPYed into the staging table as they come."""
    from jobs import definitions, io
    from jobs.visibility_job import ranges_of_room

    events_q, groups_q = _vis_queries()
    low, high = definitions._stream_bounds(None)
    stage = io.Staging.create("bench_vis", definitions.RANGE_COLUMNS)
    read = 0
    try:
        pending: list[tuple] = []
        for _room, (events, groups) in _by_room([events_q, groups_q]):
            if not events:
                continue
            read += len(events)
            ranges = ranges_of_room(_room_frame(events, events_q), _room_frame(groups, groups_q))
            pending.extend(ranges.itertuples(index=False, name=None))
            if len(pending) >= _FETCH:
                _copy(stage, pending)
                pending = []
        _copy(stage, pending)
        _, inserted = definitions.apply_ranges(stage, None, low, high)
    finally:
        stage.drop()
    return read, inserted


def python_check_visibility() -> tuple[int, int]:
    """Twin of ``check_visibility``: (rows read, differences), streaming the rooms as
    :func:`python_visibility` does, with their stored ranges."""
    import pandas as pd

    from jobs import definitions
    from jobs.visibility_job import differences_of_room, ranges_of_room

    events_q, groups_q = _vis_queries()
    found_q = definitions.RANGES
    read = differences = 0
    for _room, (events, groups, found) in _by_room([events_q, groups_q, found_q]):
        ev = _room_frame(events, events_q)
        read += len(events)
        found_frame = _room_frame(found, found_q).drop(columns="id").assign(side="found")
        if events:
            expected = ranges_of_room(ev, _room_frame(groups, groups_q)).assign(side="expected")
            both = pd.concat([expected, found_frame], ignore_index=True)
        elif found:  # ranges of a room without events
            both = found_frame
        else:
            continue
        if len(both):
            differences += len(differences_of_room(ev, both))
    return read, differences


def range_pairs() -> tuple[int, int]:
    """(range rows, visible (event, user) pairs: every real user's covered events, world-readable
    ones included) of a recomputation, for the encoding's size (``--count-pairs``)."""
    from jobs.visibility_job import ANYONE, SHARED_ERAS, room_visibility, seen_runs

    events_q, groups_q = _vis_queries()
    rows = pairs = 0
    for _room, (events, groups) in _by_room([events_q, groups_q]):
        if not events:
            continue
        keys, runs, _, joins = room_visibility(_room_frame(events, events_q), _room_frame(groups, groups_q))
        rows += sum(len(user_runs) for user_runs in runs.values())  # a range row per run (ranges_of_room)
        anyone = {i for s, e in runs.get(ANYONE, []) for i in range(s, e + 1)}
        shared = runs.get(SHARED_ERAS, [])
        for user in set(runs) | set(joins):
            if user in (ANYONE, SHARED_ERAS):
                continue
            seen = seen_runs(runs.get(user, []), shared, joins.get(user))
            covered = {i for s, e in seen for i in range(s, e + 1)}
            pairs += len(covered | anyone)
    return rows, pairs


def _copy(stage, rows: list[tuple]) -> None:
    import pandas as pd
    from django.db import connection

    connection.ensure_connection()
    names = ", ".join(n for n, _ in stage.columns)
    with connection.connection.cursor() as cursor:
        with cursor.copy(f"COPY {stage.name} ({names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([None if pd.isna(v) else v for v in row])


def _chain_cover_in_python():
    from jobs import definitions
    from jobs.chain_cover_job import chain_cover_in_python
    from jobs.job_dialect import for_database

    events = _read(definitions._chain_events_query(for_database()))
    positions, links = chain_cover_in_python(events.itertuples(index=False, name=None))
    return events, positions, links


def python_rebuild_chain_cover() -> tuple[int, int]:
    """Twin of ``rebuild_chain_cover``: (rows read, positions + links inserted)."""
    from jobs import definitions, io

    low, high = definitions._stream_bounds(None)
    events, positions, links = _chain_cover_in_python()
    staged_positions = io.Staging.create("bench_chain_pos", definitions.POSITION_COLUMNS)
    staged_links = io.Staging.create("bench_chain_links", definitions.LINK_COLUMNS)
    try:
        _copy(staged_positions, positions)
        _copy(staged_links, links)
        _, n_positions, n_links = definitions.apply_chain_cover(staged_positions, staged_links, None, low, high)
    finally:
        staged_positions.drop()
        staged_links.drop()
    return len(events), n_positions + n_links


def _named_index(positions, links) -> tuple[dict, "object"]:
    """As ``chain_cover.chain_cover_differences`` names them: each position as (chain's first
    event, seq) by event, each link as a string, a chain without a first event as ``#id``."""
    from collections import Counter

    positions = list(positions)
    roots = {chain: event for _, event, chain, seq in positions if seq == 1}
    named = {event: (roots.get(chain, f"#{chain}"), seq) for _, event, chain, seq in positions}
    link_names = Counter((room, f"{roots.get(o, '?')} {os_} -> {roots.get(t, '?')} {ts}")
                         for room, o, os_, t, ts in links)
    return named, link_names


def python_check_chain_cover() -> tuple[int, int]:
    """Twin of ``check_chain_cover``: (rows read, differences)."""
    from jobs import definitions

    events, positions, links = _chain_cover_in_python()
    stored_positions = _read(definitions.CHAIN_POSITIONS).drop(columns="id")
    stored_links = _read(definitions.CHAIN_LINKS).drop(columns="id")
    expected, expected_links = _named_index(positions, links)
    found, found_links = _named_index(list(stored_positions.itertuples(index=False, name=None)),
                                      list(stored_links.itertuples(index=False, name=None)))
    differences = sum(1 for e in expected.keys() | found.keys() if expected.get(e) != found.get(e))
    differences += sum(((expected_links - found_links) + (found_links - expected_links)).values())
    return len(events), differences


#: job -> its single-process twin, in the order they run (each check after its recomputation)
JOB_GROUPS = {
    "topology": (("topological_ordering", python_topological_ordering),
                 ("check_topological_ordering", python_check_topological_ordering)),
    "visibility": (("visibility", python_visibility), ("check_visibility", python_check_visibility)),
    "chain_cover": (("rebuild_chain_cover", python_rebuild_chain_cover),
                    ("check_chain_cover", python_check_chain_cover)),
}

_TICK = os.sysconf("SC_CLK_TCK")


def _tree(roots: tuple[int, ...]) -> dict[int, dict[int, float]]:
    """root -> {pid: its own CPU seconds (user + system)} for ``root`` and its live descendants."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out = {}
    for root in roots:  # a root under another root (the postmaster is our child) counts apart
        found, todo = {}, [root]
        while todo:
            pid = todo.pop()
            if pid in stats:
                found[pid] = stats[pid][1]
            todo.extend(c for c in children.get(pid, []) if c not in roots)
        out[root] = found
    return out


class Meter:
    """Wall time and CPU of one step: the database's (the postmaster's tree: every backend)
    and this side's (this process's tree: the driver's JVM and Spark's Python workers, or the
    twin). The trees are sampled every 0.2 s and each process counted from its first to its
    last sample, so workers and backends that exit during the step keep their share (a
    parent's count of reaped children misses those whose parent ignores SIGCHLD); a process
    that lives less than 0.2 s is missed. The sampling costs this process about 1% of a core."""

    def __init__(self, postmaster: int) -> None:
        self.postmaster = postmaster
        self.rows: list[tuple[str, str, float, float, float]] = []

    def __call__(self, side: str, job: str, action):
        roots = (self.postmaster, os.getpid())
        first = _tree(roots)
        last = {root: dict(pids) for root, pids in first.items()}
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                for root, pids in _tree(roots).items():
                    last[root].update(pids)

        sampler = threading.Thread(target=sample, daemon=True)
        t0 = time.monotonic()
        sampler.start()
        try:
            out = action()
        finally:
            wall = time.monotonic() - t0
            stop.set()
            sampler.join()
        for root, pids in _tree(roots).items():
            last[root].update(pids)
        db, me = (sum(v - first[root].get(pid, 0.0) for pid, v in last[root].items()) for root in roots)
        self.rows.append((side, job, wall, db, me))
        return out, self.rows[-1]


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
    with contextlib.ExitStack() as held:  # what the orderings cache, released at the end
        _profile_steps(spark, job, held)


def _profile_steps(spark, job: str, held: contextlib.ExitStack) -> None:
    from jobs import definitions as d
    from jobs import io
    from jobs.job_dialect import for_database

    step = _Steps(spark)
    low, high = step("stream bounds (one query)", lambda: d._stream_bounds(None))
    if job == "visibility":
        from jobs.visibility_job import visibility_ranges

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

        from jobs.topology import topological_ordering

        events = io.read(spark, d._strayed_query(for_database())).cache()
        step("read the strayed events (JDBC; compared in the scan)", events.count)
        walk = step("rooms to walk (an event without a depth)", lambda: events.where(F.col("depth").isNull())
                    .select("room_id").distinct().collect())
        if walk:  # those rooms whole, with their edges
            events, result = held.enter_context(d._orderings(spark, None))
        else:
            result = held.enter_context(topological_ordering(events, None))
        result = result.cache()
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


CLUSTER_JOBS = ("topological_ordering", "visibility", "rebuild_chain_cover", "check_topological_ordering",
                "check_visibility", "check_chain_cover")


def compare_masters(run_job, spark_version: str, repeat: int) -> None:
    """The jobs on local[2] and on a standalone cluster (1 worker, 2 cores), same data, in
    ``repeat`` rounds that alternate which goes first (the driver's JVM is one for both, and
    warms up); medians."""
    import statistics

    from jobs.session import spark_session, stop_spark
    from testing.services import SparkStandaloneCluster

    t0 = time.monotonic()
    cluster = SparkStandaloneCluster(cores=2, memory="2g").start()
    print(f"standalone cluster (master + 1 worker, 2 cores, 2g) started in {time.monotonic() - t0:.1f} s "
          f"at {cluster.url}", flush=True)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["SPARK_AUTH_SECRET"] = cluster.secret  # the cluster authenticates its drivers
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


def _dataset(args, parser) -> tuple[str, int, int, int, bool, str]:
    """(database name, events, rooms, users, reuse, marker text) for this run: a directory made
    by ``bench_storage.py --data-dir`` (its ``dataset.json``; database ``bench_storage``), one
    this script made (its ``dataset`` file), or a new dataset."""
    import json

    directory = Path(args.data_dir) if args.data_dir else None
    if directory is not None and (directory / "dataset.json").exists():
        stored = json.loads((directory / "dataset.json").read_text())
        asked = {"events": args.events, "rooms": args.rooms, "users": args.users}
        wrong = {k: v for k, v in asked.items() if v is not None and v != stored.get(k)}
        if wrong or args.quick:
            parser.error(f"{directory} holds bench_storage's dataset of {stored['events']:,} events, "
                         f"{stored['rooms']:,} rooms, {stored['users']:,} users: drop --quick/--events/--rooms/--users")
        return "bench_storage", stored["events"], stored["rooms"], stored["users"], True, ""
    events = args.events or (100_000 if args.quick else 1_000_000)
    rooms = args.rooms or (1_000 if args.quick else 10_000)
    users = args.users or rooms * 2
    marker = f"{events} events, {rooms} rooms, {users} users, seed 1\n"
    marker_file = (directory or Path("/nonexistent")) / "dataset"
    reuse = marker_file.exists() and marker_file.read_text() == marker
    return "bench_jobs", events, rooms, users, reuse, marker


#: tables the jobs' swaps write: vacuumed and analysed after a run on a kept dataset, so the
#: next run's reads (bench_storage's too) are planned on what the tables hold
SWAPPED_TABLES = ("events", "room_memberships", "room_visibility_ranges", "event_auth_chains",
                  "event_auth_chain_links", "event_auth_chain_to_calculate")


def bench_jobs(run_job, groups: list[str], meter: Meter) -> None:
    """Each job through the runner on local[2], then its single-process twin, same data."""
    loads = []
    for group in groups:
        for job, twin in JOB_GROUPS[group]:
            loads.append(os.getloadavg()[0])
            run, (_, _, wall, db, me) = meter("spark", job, lambda: run_job(job, trigger="bench"))
            print(f"  spark  {job:28s} {wall:7.1f} s  db cpu {db:6.1f} s, spark cpu {me:6.1f} s  ({run.status}; "
                  f"rows in {run.rows_in:,}, rows out {run.rows_out:,}, differences {run.differences})", flush=True)
            if run.status != "succeeded":
                raise RuntimeError(run.error[-2000:])
            (rows_in, out), (_, _, wall, db, me) = meter("python", job, twin)
            what = "differences" if job.startswith("check_") else "rows out"
            print(f"  python {job:28s} {wall:7.1f} s  db cpu {db:6.1f} s, python cpu {me:5.1f} s  (rows in "
                  f"{rows_in:,}, {what} {out:,})", flush=True)
    loads.append(os.getloadavg()[0])
    print()
    print("wall s, and CPU s of the database (its statements) and of this side (the driver's JVM and Spark's Python "
          "workers / the twin)")
    print(f"{'job':28s} {'spark':>7s} {'db':>6s} {'jvm+py':>6s}  {'python':>7s} {'db':>6s} {'py':>6s}  "
          f"{'python/spark':>12s}  {'ceiling':>7s}  goals: <= 15 min, >= 2x")
    print("-" * 116)
    rows = {(side, job): (wall, db, me) for side, job, wall, db, me in meter.rows}
    for group in groups:
        for job, _ in JOB_GROUPS[group]:
            s, p = rows[("spark", job)], rows[("python", job)]
            # on 2 cores Spark cannot take less than half its CPU, and the twin (one process
            # and the database taking turns) needs its CPU at most: what this Spark could reach
            # with both cores busy all the time, against a twin that never waits
            ceiling = 2 * (p[1] + p[2]) / max(s[1] + s[2], 1e-9)
            print(f"{job:28s} {s[0]:7.1f} {s[1]:6.1f} {s[2]:6.1f}  {p[0]:7.1f} {p[1]:6.1f} {p[2]:6.1f}  "
                  f"{p[0] / s[0]:12.2f}  {ceiling:7.2f}  {'met' if s[0] <= 900 else 'NOT met'}, "
                  f"{'met' if p[0] >= 2 * s[0] else 'NOT met'}")
    print(f"load average (1 min) at each job's start and at the end: {', '.join(f'{x:.1f}' for x in loads)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=None, help="events to generate (default 1,000,000; --quick 100,000)")
    parser.add_argument("--rooms", type=int, default=None, help="rooms (default 10,000; --quick 1,000)")
    parser.add_argument("--users", type=int, default=None, help="users (default rooms x 2)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--jobs", default=",".join(JOB_GROUPS),
                        help=f"which jobs (each with its check), comma-separated: {', '.join(JOB_GROUPS)}")
    parser.add_argument("--chain-cover", action="store_true", help="the chain cover jobs only (--jobs chain_cover)")
    parser.add_argument("--count-pairs", action="store_true",
                        help="also count visible (event, user) pairs against the range rows (slow: sets of events)")
    parser.add_argument("--cluster", action="store_true",
                        help="compare local[2] with a standalone Spark cluster started here (jobs only)")
    parser.add_argument("--repeat", type=int, default=1, help="--cluster: rounds, alternating which goes first")
    parser.add_argument("--profile", metavar="JOB",
                        help="visibility or topological_ordering step by step (Spark stages, py-spy on its Python "
                             "workers: PYSPY names py-spy, default /tmp/pyspy/bin/py-spy)")
    parser.add_argument("--data-dir", help="keep the generated PostgreSQL cluster here and reuse it next time "
                                           "(the same --events/--rooms/--users): skips the generation; or a "
                                           "directory made by bench_storage.py --data-dir (its dataset.json)")
    add_pg_settings_arguments(parser)
    args = parser.parse_args(argv)
    pg_settings = pg_settings_of(args, parser)
    groups = ["chain_cover"] if args.chain_cover else [g.strip() for g in args.jobs.split(",") if g.strip()]
    unknown = [g for g in groups if g not in JOB_GROUPS]
    if unknown:
        parser.error(f"--jobs: unknown {', '.join(unknown)}; known: {', '.join(JOB_GROUPS)}")
    db_name, events, rooms, users, reuse, marker_text = _dataset(args, parser)

    from _machine import cpu_description

    t_begin = time.monotonic()
    # Django after STATE_DIR (the cluster's directory) is set.
    with migrated_database(db_name, env={"SPARK_MASTER": "local[2]"}, django_setup=False,
                           pg_directory=args.data_dir or "", keep=bool(args.data_dir), reuse=reuse,
                           pg_settings=pg_settings) as db:
        url, server = db.url, db.pg
        os.environ["STATE_DIR"] = server.directory
        env = {**db.env, "STATE_DIR": server.directory}
        print(f"machine: {cpu_description()}; {platform.platform()}; python {platform.python_version()}")
        if reuse:
            print(f"reusing {events:,} events in {rooms:,} rooms for {users:,} users from {server.directory} "
                  f"(database {db_name})")
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
                (Path(server.directory) / "dataset").write_text(marker_text)

        import django

        django.setup()
        from pyspark import __version__ as spark_version

        from jobs.runner import run_job
        from jobs.session import spark_session

        try:
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
            # the first Python task starts the workers (pandas, pyarrow imported): start-up, not the first job's
            spark_session().sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).count()
            print(f"spark {spark_version} local[2] session start-up (session + 1 Python task): "
                  f"{time.monotonic() - t0:.1f} s", flush=True)
            bench_jobs(run_job, groups, Meter(server.proc.pid))
            if args.count_pairs:
                range_rows, pairs = range_pairs()
                ratio = pairs / range_rows if range_rows else float("inf")
                print(f"\nvisibility: {range_rows:,} range rows vs {pairs:,} (event, user) rows: {ratio:.1f}x smaller "
                      f"(goal >= 10x: {'met' if ratio >= 10 else 'NOT met'})")
        finally:
            if args.data_dir:  # the swaps rewrote rows: leave the tables as a reader expects them
                subprocess.run(["psql", "-q", url, "-c", f"VACUUM ANALYZE {', '.join(SWAPPED_TABLES)}"], check=False)
        print(f"total time {time.monotonic() - t_begin:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
