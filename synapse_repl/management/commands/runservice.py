"""``manage.py runservice``: what ``make run`` starts.

The web UI, the admin and the catch-up endpoint (daphne, ASGI) on ``WEB_LISTEN``, and in the
same process, on daphne's event loop, the TCP replication endpoint on ``REPLICATION_LISTEN``.
Before serving it ensures the superuser operators sign in with (``ensure_admin``), and starts
its children under supervision (synapse_repl/supervisor.py: restarted when they die, the
service stopped with the reason when one cannot start): on the embedded default the demo
trickle (``manage.py demo``; ``DEMO=0`` turns it off, full mode never has it), with Redis the
Celery worker, with ``SYNAPSE_REDIS_URL`` or ``SYNAPSE_DATABASE_URL`` the observer of that
Synapse (``manage.py synapse_observer``, docs/attach.md). A port that cannot be bound stops the service with one
line, and so does a demo or a Celery beat of the same ``STATE_DIR`` already running (each
holds a lock there: common/state_lock.py). The children die with the service, ``kill -9``
of it included (common/lifeline.py).

Shutdown (SIGTERM, SIGINT, a child that cannot start) takes at most :data:`SHUTDOWN_SECONDS`,
whatever is in flight (:func:`bound_shutdown`): the children get their SIGTERM at once and
:data:`CHILDREN_GRACE_SECONDS` before SIGKILL, daphne cancels the requests and waits
:data:`REQUESTS_GRACE_SECONDS` for them, and past the deadline (a request stuck in a thread the
interpreter would wait for at exit) the children's process groups are killed and the process
exits at once, saying so. Once stopped in order it exits without the interpreter's teardown
(:meth:`Command.run_from_argv`), which would join the threads of requests still in flight.
"""
from __future__ import annotations

import os
import sys
import threading

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from common.state_lock import StateLockHeld, check_free
from common.url_redaction import redact_url
from dashboard.management.commands.demo import DEMO_LOCK_WHAT, demo_lock_path, embedded_default
from jobs.liveness import sweep_every
from jobs.schedules import BEAT_LOCK_WHAT, beat_lock_path
from replication.endpoint.server import start_endpoint
from streams.conf import instance_name, repl_setting
from streams.runtime import runtime
from synapse_attach.reader import AttachError, AttachSettings
from synapse_attach.redis_observer import check_redis_url
from synapse_repl.security import HOW_TO_SET_A_SECRET, require_strong_secrets
from synapse_repl.startup import check_startable
from synapse_repl.supervisor import Supervisor

#: Seconds from the start of shutdown until this process has exited, whatever is in flight.
SHUTDOWN_SECONDS = 4.0
#: Seconds daphne waits, at shutdown, for the requests it cancelled to end.
REQUESTS_GRACE_SECONDS = 1.0
#: Seconds the children get, at shutdown, between SIGTERM and SIGKILL.
CHILDREN_GRACE_SECONDS = 2.0


def split_listen(value: str, name: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"{name}={value!r}: expected host:port, e.g. 127.0.0.1:8000")
    return host.strip("[]"), int(port)


class Command(BaseCommand):
    help = ("Serve the web UI (WEB_LISTEN) and the TCP replication endpoint (REPLICATION_LISTEN), with the "
            "demo trickle and a Celery worker beside it. Reads: WEB_LISTEN, REPLICATION_LISTEN, DATABASE_URL, "
            "REDIS_URL, STATE_DIR, REPLICATION_SECRET, SECRET_KEY, ADMIN_USER, ADMIN_PASSWORD, DEMO, JOBS_WORKER, "
            "PROXY_HEADERS, INSTANCE_NAME, SERVER_NAME, STREAM_WRITERS, API_TOKEN (README and "
            "synapse_repl/settings.py list the rest).")

    def run_from_argv(self, argv: list[str]) -> None:
        """Django's, then an immediate exit with its status: by then the children are stopped
        and the endpoint's last writes made; the interpreter's teardown would only join the
        threads of requests still in flight (a sync view cannot be cancelled) and take
        seconds on a busy machine."""
        try:
            super().run_from_argv(argv)
            status = 0
        except SystemExit as e:  # a CommandError, already printed by Django
            status = e.code if isinstance(e.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    def handle(self, *args, **options) -> None:
        from django.core.exceptions import ImproperlyConfigured

        if not settings.REPLICATION_SECRET:
            raise CommandError(HOW_TO_SET_A_SECRET)
        try:
            require_strong_secrets()
            dict(settings.CELERY_BEAT_SCHEDULE)  # the schedule strings, refused here if one is bad
        except ImproperlyConfigured as e:
            raise CommandError(str(e)) from None
        observer = synapse_observer_args()
        host, port = split_listen(repl_setting("WEB_LISTEN"), "WEB_LISTEN")
        rhost, rport = split_listen(repl_setting("REPLICATION_LISTEN"), "REPLICATION_LISTEN")
        check_startable(database=True, redis=True,
                        listen=((host, port, "WEB_LISTEN"), (rhost, rport, "REPLICATION_LISTEN")))

        check_port_free(host, port, "WEB_LISTEN")  # before anything starts: one line, nothing left running
        demo = embedded_default() and settings.DASHBOARD["DEMO"]
        check_no_other_instance(demo=demo, beat=job_worker_wanted())
        # The TCP endpoint runs in this process, on daphne's event loop: one in-memory channel
        # layer for what the service writes; other local processes' facts it reads from the
        # database (replication/endpoint/local_scan.py).
        endpoint = start_endpoint_in_process(rhost, rport)
        fatal: list[str] = []
        supervisor = Supervisor(on_fatal=lambda reason: (fatal.append(reason), stop_reactor()))
        try:
            jobs = start_job_worker(supervisor)
            mode = "embedded (SQLite)" if embedded_default() else "full"
            self.stdout.write(
                f"synapse_repl {instance_name()} on {repl_setting('SERVER_NAME')}, {mode} mode\n"
                f"  web UI:  http://{host}:{port}/   (connections: /connections/, metrics: /metrics)\n"
                f"  replication (TCP): {rhost}:{rport}\n"
                f"  batch jobs: {jobs}\n"
                f"  admin:   http://{host}:{port}/admin/"
            )
            if observer is not None:
                supervisor.add("synapse observer", observer, cwd=str(settings.BASE_DIR))
                self.stdout.write(f"  Synapse: {observed_synapse(settings.SYNAPSE_ATTACH)} "
                                  "(read-only; docs/attach.md)")
            call_command("ensure_admin", stdout=self.stdout)
            start_run_sweeper()
            if demo:
                supervisor.add("demo", [sys.executable, "manage.py", "demo"], cwd=str(settings.BASE_DIR))
                self.stdout.write("  demo:    a small dataset and a trickle of demo facts (DEMO=0 turns it off)")
            self.stdout.flush()
            supervisor.start()
            # Trust X-Forwarded-For only behind a reverse proxy: it decides who /metrics admits.
            proxy = ["--proxy-headers"] if os.environ.get("PROXY_HEADERS", "") in ("1", "true", "yes") else []
            cli = _DaphneCLI()
            bound_shutdown(SHUTDOWN_SECONDS, supervisor, fatal)
            try:
                cli.run(["-b", host, "-p", str(port), *proxy, "synapse_repl.asgi:application"])
            except SystemExit:  # daphne exits 1 when it could not start: say why below
                if not getattr(cli.server, "listen_failure", None):
                    raise
            failure = getattr(cli.server, "listen_failure", None)
            if failure:
                fatal.append(f"cannot listen on WEB_LISTEN={host}:{port}: {failure}; "
                             "stop what holds the port or set WEB_LISTEN")
        finally:
            supervisor.stop(timeout=CHILDREN_GRACE_SECONDS)
            stop_endpoint_in_process(endpoint)
        if fatal:
            raise CommandError(f"stopped: {fatal[0]}")


def start_run_sweeper() -> threading.Event:
    """Runs left ``running`` by a process that is gone (this service killed with its job child,
    a worker killed) are marked failed now and, while the service runs, within
    ``JOBS_SWEEP_SECONDS`` of their process ending (jobs/liveness.py). Setting the
    returned event stops the sweeper."""

    stop = threading.Event()
    threading.Thread(target=sweep_every, args=(float(repl_setting("JOBS_SWEEP_SECONDS")), stop),
                     name="job-run-sweeper", daemon=True).start()
    return stop


def check_port_free(host: str, port: int, name: str) -> None:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise CommandError(f"cannot listen on {name}={host}:{port}: {e.strerror or e}; "
                               f"stop what holds the port or set {name}") from None


def check_no_other_instance(*, demo: bool, beat: bool) -> None:
    """The demo and Celery beat run once per ``STATE_DIR``: if another process (another
    runservice, or one started by hand) holds one's lock, stop in one line naming
    its pid, before anything starts."""

    try:
        if demo:
            check_free(demo_lock_path(), DEMO_LOCK_WHAT)
        if beat:
            check_free(beat_lock_path(str(beat_schedule_path())), BEAT_LOCK_WHAT)
    except StateLockHeld as e:
        raise CommandError(str(e)) from None


def start_endpoint_in_process(host: str, port: int):
    """Bind the replication endpoint on daphne's event loop before daphne runs it; a port
    that cannot be bound stops the service here, in one line."""
    import daphne.server  # installs the asyncio reactor on daphne's loop

    loop = daphne.server.twisted_loop
    try:
        endpoint, _server = loop.run_until_complete(start_endpoint(host, port, streams=runtime()))
    except OSError as e:
        raise CommandError(
            f"cannot listen for replication on REPLICATION_LISTEN={host}:{port}: "
            f"{e.strerror or e}; stop what holds the port or set REPLICATION_LISTEN"
        ) from None
    return endpoint


def stop_endpoint_in_process(endpoint) -> None:
    """After daphne: the endpoint's USER_IP sightings not yet written go to the table, and its
    broadcast subscription ends (``Endpoint.stop``, as ``runreplication`` does at SIGTERM)."""
    import daphne.server

    loop = daphne.server.twisted_loop
    try:
        loop.run_until_complete(endpoint.stop())
    except Exception as e:  # shutting down: say it, do not hide the reason we stopped
        print(f"replication endpoint: stopping at shutdown: {e}", file=sys.stderr)


def bound_shutdown(seconds: float, supervisor, fatal: list[str]) -> None:
    """When the reactor starts shutting down: SIGTERM to the children (their grace runs
    beside daphne's), and a daemon timer: if this process is still here ``seconds`` later (a
    request or a check stuck in a thread the interpreter would join at exit), it kills the
    children's process groups, says so and exits at once (status 1 if the service was
    stopping for a fatal reason, else 0)."""
    from twisted.internet import reactor

    def expire() -> None:
        supervisor.kill()
        print(f"runservice: still stopping {seconds:g} s after shutdown began (requests in flight "
              f"abandoned); exiting{': ' + fatal[0] if fatal else ''}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1 if fatal else 0)

    def arm() -> None:
        supervisor.terminate()
        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()

    reactor.addSystemEventTrigger("before", "shutdown", arm)


def stop_reactor() -> None:
    from twisted.internet import reactor

    reactor.callFromThread(reactor.stop)


def _daphne_server_class():
    from daphne.server import Server

    class OneLineServer(Server):
        """daphne's server, keeping a failure to listen for one line at exit (no log storm),
        its shutdown bounded."""

        listen_failure = ""

        def listen_error(self, failure) -> None:
            self.listen_failure = failure.getErrorMessage()
            self.stop()

        def kill_all_applications(self):
            """daphne's, bounded: the requests it cancels get :data:`REQUESTS_GRACE_SECONDS`
            to end (a sync view's thread cannot be cancelled; daphne would wait for it)."""
            from twisted.internet import reactor

            waited = super().kill_all_applications()
            waited.addTimeout(REQUESTS_GRACE_SECONDS, reactor)
            waited.addErrback(lambda _failure: None)
            return waited

    return OneLineServer


def _DaphneCLI():
    from daphne.cli import CommandLineInterface

    cli = CommandLineInterface()
    cli.server_class = _daphne_server_class()
    return cli


def start_job_worker(supervisor) -> str:
    """With Redis, a Celery worker with beat (nightly/hourly jobs) beside the service, unless
    ``JOBS_WORKER=0``; without Redis, Celery runs jobs eagerly in the calling process."""
    if not settings.REDIS_URL:
        return "in process (Celery eager; manage.py run_job JOB)"
    if not job_worker_wanted():
        return "JOBS_WORKER=0: run `celery -A synapse_repl worker -B` elsewhere"
    supervisor.add("celery worker", [sys.executable, *job_worker_args(beat_schedule_path())],
                   cwd=str(settings.BASE_DIR))
    return f"Celery worker + beat on {redact_url(settings.REDIS_URL)}"


def synapse_observer_args() -> list[str] | None:
    """The observer of an attached Synapse, when ``SYNAPSE_REDIS_URL`` or ``SYNAPSE_DATABASE_URL``
    is set (None otherwise); a setting it cannot work with stops the service in one line,
    before it starts."""

    attach = settings.SYNAPSE_ATTACH
    if attach.get("DATABASE_URL"):
        try:
            AttachSettings.from_settings(attach)
        except AttachError as e:
            raise CommandError(str(e)) from None
    if not attach.get("REDIS_URL"):
        return [sys.executable, "manage.py", "synapse_observer"] if attach.get("DATABASE_URL") else None
    if not attach.get("SERVER_NAME"):
        raise CommandError("SYNAPSE_REDIS_URL is set but SYNAPSE_SERVER_NAME is not: set it to the Synapse's "
                           "server_name, the channel its processes publish on (docs/attach.md)")
    try:
        check_redis_url(attach["REDIS_URL"])
    except ValueError as e:
        raise CommandError(str(e)) from None
    return [sys.executable, "manage.py", "synapse_observer"]


def observed_synapse(attach: dict) -> str:
    """What the observer watches, for the start-up lines (URLs with their passwords masked)."""
    parts = []
    if attach.get("REDIS_URL"):
        parts.append(f"observing {redact_url(attach['REDIS_URL'])}, channel {attach['SERVER_NAME']}")
    if attach.get("DATABASE_URL"):
        parts.append(f"reading {redact_url(attach['DATABASE_URL'])}")
    if not attach.get("REDIS_URL"):
        parts.append("no SYNAPSE_REDIS_URL: database figures only, nothing live")
    return "; ".join(parts)


def job_worker_args(schedule) -> list[str]:
    """The Celery worker with its embedded beat, after the Python executable: one job at a
    time, beat's schedule in the file ``schedule`` (tests run exactly this)."""
    # Without gossip and mingle: one worker needs neither, and a Redis outage then costs
    # Celery no traceback for restarting them.
    return ["-m", "celery", "-A", "synapse_repl", "worker", "-B", "--concurrency", "1",
            "--without-gossip", "--without-mingle", "--loglevel", "INFO", "--schedule", str(schedule)]


def job_worker_wanted() -> bool:
    """Whether runservice starts the Celery worker and its beat (Redis, and not JOBS_WORKER=0)."""
    return bool(settings.REDIS_URL) and os.environ.get("JOBS_WORKER", "1") != "0"


def beat_schedule_path():
    return settings.STATE_DIR / "celerybeat-schedule"
