"""``/metrics``: Prometheus text format (prometheus-client).

Cluster-wide figures are read from the database at scrape time, so any web process shows
them all: every writer's position per stream, the linear position, facts written (a
stream's highest completed ID: its IDs come from one sequence, rolled-back IDs included),
pending and stuck IDs, and for every replication endpoint (from its published snapshot,
see :mod:`dashboard.endpoint_status`) its connections, their outbound queues, RDATA and
POSITION lines sent and disconnects by reason. Catch-up requests are counted by the process
that serves them (each web process reports its own).

Readable by staff, or without signing in from ``METRICS_ALLOWED_NETWORKS``.
"""
from __future__ import annotations

import functools
from typing import Callable, Iterator

from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dashboard.access import metrics_allowed
from dashboard.attached_sources import SOURCES
from dashboard.endpoint_status import endpoint_statuses
from dashboard.process_stats import process_stats
from dashboard.stream_table import streams_as_served
from dashboard.worker_status import worker_statuses
from jobs.models import JobRun
from streams.conf import instance_name
from streams.registry import STREAMS

PREFIX = "synapse_repl"


class ClusterCollector(Collector):
    """Streams and endpoints as the database records them, at every scrape."""

    def collect(self) -> Iterator[Metric]:
        position = GaugeMetricFamily(f"{PREFIX}_stream_position", "A writer's position on a stream",
                                     labels=["stream", "writer"])
        linear = GaugeMetricFamily(f"{PREFIX}_stream_linear_position",
                                   "Position below which every stream ID is complete", labels=["stream"])
        ahead = GaugeMetricFamily(f"{PREFIX}_stream_writer_ahead",
                                  "How far a writer's position is ahead of the linear position",
                                  labels=["stream", "writer"])
        holding = GaugeMetricFamily(f"{PREFIX}_stream_writer_holding_linear",
                                    "1 for the writer whose pending (in flight or stuck) stream ID holds the "
                                    "linear position below another writer's position", labels=["stream", "writer"])
        facts = CounterMetricFamily(f"{PREFIX}_stream_facts",
                                    "Facts written to a stream (its highest completed stream ID)", labels=["stream"])
        pending = GaugeMetricFamily(f"{PREFIX}_stream_pending_ids", "Reserved stream IDs not yet complete",
                                    labels=["stream", "writer"])
        stuck = GaugeMetricFamily(f"{PREFIX}_stream_stuck_ids",
                                  "Stream IDs pending longer than STUCK_AFTER_SECONDS", labels=["stream", "writer"])
        oldest = GaugeMetricFamily(f"{PREFIX}_stream_oldest_pending_seconds",
                                   "Age of the oldest pending stream ID", labels=["stream"])
        last_write = GaugeMetricFamily(f"{PREFIX}_stream_writer_last_write_timestamp_seconds",
                                       "When a writer's position last advanced", labels=["stream", "writer"])
        process_up = GaugeMetricFamily(f"{PREFIX}_stream_writer_process_up",
                                       "1 while the process that last wrote as this writer runs (0: exited; "
                                       "absent when it ran on another host)", labels=["stream", "writer"])
        for s in streams_as_served():
            if not s.db_backed:  # typing: its position as the web process holding its writer knows it
                for writer, pos in s.positions.items():
                    position.add_metric([s.name, writer], pos)
                if s.linear is not None:
                    linear.add_metric([s.name], s.linear)
                continue
            for w in s.writer_rows:
                if w.last_write is not None:
                    last_write.add_metric([s.name, w.name], w.last_write.timestamp())
                if w.alive is not None:
                    process_up.add_metric([s.name, w.name], 1 if w.alive else 0)
            for writer, pos in s.positions.items():
                position.add_metric([s.name, writer], pos)
            for w in s.writer_rows:
                if w.ahead is not None and w.name in s.positions:
                    ahead.add_metric([s.name, w.name], w.ahead)
            if s.linear is not None:
                linear.add_metric([s.name], s.linear)
            if s.laggard is not None:
                holding.add_metric([s.name, s.laggard], 1)
            facts.add_metric([s.name], max((abs(p) for p in s.positions.values()), default=0))
            per_writer: dict[str, list[int]] = {}
            for p in s.pending:
                counts = per_writer.setdefault(p.instance_name, [0, 0])
                counts[0] += len(p.stream_ids)
                counts[1] += len(p.stream_ids) if p.stuck else 0
            for writer, (n_pending, n_stuck) in per_writer.items():
                pending.add_metric([s.name, writer], n_pending)
                stuck.add_metric([s.name, writer], n_stuck)
            oldest.add_metric([s.name], max((p.age_seconds for p in s.pending), default=0.0))
        yield from (position, linear, ahead, holding, facts, pending, stuck, oldest, last_write, process_up)

        up = GaugeMetricFamily(f"{PREFIX}_endpoint_up", "1 while the endpoint reports (0: silent > 15 s)",
                               labels=["endpoint"])
        connections = GaugeMetricFamily(f"{PREFIX}_endpoint_connections", "Connected workers",
                                        labels=["endpoint"])
        accepted = CounterMetricFamily(f"{PREFIX}_endpoint_connections_accepted",
                                       "Connections accepted since the endpoint started", labels=["endpoint"])
        queue = GaugeMetricFamily(f"{PREFIX}_connection_outbound_queue",
                                  "Commands waiting to be written to a worker", labels=["endpoint", "name", "peer"])
        sent = CounterMetricFamily(f"{PREFIX}_replication_lines_sent",
                                   "Lines sent to workers, by command", labels=["endpoint", "command"])
        disconnects = CounterMetricFamily(f"{PREFIX}_endpoint_disconnects",
                                          "Connections closed, by reason", labels=["endpoint", "reason"])
        for e in endpoint_statuses():
            key = e["endpoint"]
            up.add_metric([key], 0 if e["stale"] else 1)
            if e["stale"]:
                continue
            connections.add_metric([key], len(e["connections"]))
            for c in e["connections"]:
                queue.add_metric([key, c["name"], c["peer"]], c["outbound_queue"])
            counters = e["counters"]
            accepted.add_metric([key], counters["connections"])
            sent.add_metric([key, "RDATA"], counters["rdata_sent"])
            sent.add_metric([key, "POSITION"], counters["position_sent"])
            sent.add_metric([key, "other"], counters["other_sent"])
            for reason, n in sorted(counters["disconnects"].items()):
                disconnects.add_metric([key, reason], n)
        yield from (up, connections, accepted, queue, sent, disconnects)
        yield from _job_metrics()
        yield from _synapse_extremity_metrics()
        for source in SOURCES.values():
            yield from source.metrics()
        yield from _worker_metrics()
        yield from _process_metrics()


def _worker_metrics() -> Iterator[Metric]:
    """Every worker that reported (TCP or Redis): its lag per stream and whether it reports."""

    lag = GaugeMetricFamily(f"{PREFIX}_worker_lag", "Stream IDs written that the worker has not applied yet",
                            labels=["worker", "transport", "stream"])
    up = GaugeMetricFamily(f"{PREFIX}_worker_up", "1 while the worker reports and is connected",
                           labels=["worker", "transport"])
    for w in worker_statuses():
        up.add_metric([w["name"], w["transport"]], 0 if w["stale"] or not w["connected"] else 1)
        if w["stale"]:
            continue
        for stream, n in w["lag"].items():
            lag.add_metric([w["name"], w["transport"], stream], n)
    yield from (lag, up)


def _process_metrics() -> Iterator[Metric]:
    """One set of process figures per process of the cluster: this web process's read now,
    each live endpoint's and worker's as it last published them (stale ones left out)."""
    import socket

    labels = ["role", "name"]
    cpu = CounterMetricFamily(f"{PREFIX}_process_cpu_seconds", "CPU time of the process (user and system)",
                              labels=labels)
    resident = GaugeMetricFamily(f"{PREFIX}_process_resident_memory_bytes", "Resident memory of the process",
                                 labels=labels)
    fds = GaugeMetricFamily(f"{PREFIX}_process_open_fds", "Open file descriptors of the process", labels=labels)
    started = GaugeMetricFamily(f"{PREFIX}_process_start_time_seconds", "When the process started (Unix time)",
                                labels=labels)
    collections = CounterMetricFamily(f"{PREFIX}_process_gc_collections",
                                      "Garbage collections of the process's interpreter, per generation",
                                      labels=[*labels, "generation"])
    processes = [("web", f"{instance_name()} {socket.gethostname()}", process_stats())]
    processes += [("endpoint", e["endpoint"], e["process"]) for e in endpoint_statuses()
                  if not e["stale"] and e.get("process")]
    processes += [("worker", w["name"], w["process"]) for w in worker_statuses() if not w["stale"] and w["process"]]
    for role, name, stats in processes:
        cpu.add_metric([role, name], stats["cpu_seconds"])
        resident.add_metric([role, name], stats["resident_bytes"])
        fds.add_metric([role, name], stats["open_fds"])
        started.add_metric([role, name], stats["start_time"])
        for generation, n in enumerate(stats["gc_collections"]):
            collections.add_metric([role, name, str(generation)], n)
    yield from (cpu, resident, fds, started, collections)


def _job_metrics() -> Iterator[Metric]:
    """The latest finished run of each job: whether it failed and, for checks, how many
    differences it found (the alert rules page on either)."""
    from django.db.models import F

    failed = GaugeMetricFamily(f"{PREFIX}_job_last_run_failed",
                               "1 if the job's latest finished run failed", labels=["job"])
    differences = GaugeMetricFamily(f"{PREFIX}_job_last_run_differences",
                                    "Differences the check's latest finished run found", labels=["job"])
    ended = GaugeMetricFamily(f"{PREFIX}_job_last_run_end_timestamp_seconds",
                              "When the job's latest finished run ended (Unix time)", labels=["job"])
    duration = GaugeMetricFamily(f"{PREFIX}_job_last_run_duration_seconds",
                                 "How long the job's latest finished run took", labels=["job"])
    finished = (JobRun.objects.filter(status__in=[JobRun.Status.SUCCEEDED, JobRun.Status.FAILED])
                .order_by("job", F("ended_at").desc(nulls_last=True), "-id"))
    seen: set[str] = set()
    for run in finished.only("job", "status", "differences", "started_at", "ended_at").iterator():
        if run.job in seen:
            continue
        seen.add(run.job)
        failed.add_metric([run.job], 1 if run.status == JobRun.Status.FAILED else 0)
        if run.differences is not None:
            differences.add_metric([run.job], run.differences)
        if run.ended_at is not None:
            ended.add_metric([run.job], run.ended_at.timestamp())
            duration.add_metric([run.job], (run.ended_at - run.started_at).total_seconds())
    yield from (failed, differences, ended, duration)


#: the audit whose findings become per-room gauges, and the finding it lists rooms by
EXTREMITIES_JOB = "synapse_forward_extremities"
TOO_MANY_EXTREMITIES = "too_many_forward_extremities"


def _synapse_extremity_metrics() -> Iterator[Metric]:
    """The rooms of an attached Synapse over ``SYNAPSE_EXTREMITY_THRESHOLD`` forward
    extremities, as the latest successful ``synapse_forward_extremities`` run listed them
    (most first, at most 1,000): nothing before its first run."""
    per_room = GaugeMetricFamily(f"{PREFIX}_synapse_room_forward_extremities",
                                 "Forward extremities of a Synapse room over SYNAPSE_EXTREMITY_THRESHOLD "
                                 "(latest synapse_forward_extremities run)", labels=["room_id"])
    over = GaugeMetricFamily(f"{PREFIX}_synapse_rooms_over_extremity_threshold",
                             "Synapse rooms over SYNAPSE_EXTREMITY_THRESHOLD forward extremities in the latest "
                             "synapse_forward_extremities run (at most 1,000 listed)")
    run = (JobRun.objects.filter(job=EXTREMITIES_JOB, status=JobRun.Status.SUCCEEDED)
           .order_by("-ended_at", "-id").only("difference_sample").first())
    if run is None:
        return
    rooms = 0
    for finding in run.difference_sample or []:
        if isinstance(finding, dict) and finding.get("finding") == TOO_MANY_EXTREMITIES:
            per_room.add_metric([str(finding.get("room_id"))], float(finding.get("found") or 0))
            rooms += 1
    over.add_metric([], rooms)
    yield from (per_room, over)


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(ClusterCollector())
CATCHUP_REQUESTS = Counter(f"{PREFIX}_catchup_requests", "Catch-up requests served by this process",
                           ["stream", "status"], registry=REGISTRY)


def counting_catchups(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap the catch-up view so this process counts its requests (by stream and answer)."""
    @functools.wraps(view)
    def wrapper(request: HttpRequest, stream_name: str, *args, **kwargs) -> HttpResponse:
        response = view(request, stream_name, *args, **kwargs)

        CATCHUP_REQUESTS.labels(stream_name if stream_name in STREAMS else "unknown",
                                str(response.status_code)).inc()
        return response
    return wrapper


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(request):
        return HttpResponse("forbidden: sign in as staff, or scrape from METRICS_ALLOWED_NETWORKS\n",
                            status=403, content_type="text/plain")
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
