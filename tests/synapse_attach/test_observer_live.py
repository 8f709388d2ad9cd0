"""The observer on a real Synapse 1.163.2 cluster: a main process and one event-persister worker
(``stream_writers: events: [master, persister1]``, testing/synapse_homeserver.py) on a
password-protected Redis of the module's own. The observer listens as a Redis ACL user that may
SUBSCRIBE and PING only, and reads the database as a role with SELECT only (docs/attach.md).
Synapse's ``stream_positions`` (read as superuser) and its processes are the oracle."""
from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psycopg
import pytest

from replication.protocol.redis_session import SubscriptionPolicy
from replication.protocol.resp import RespConnection, RespError
from synapse_attach.catalogue import STREAMS
from synapse_attach.observer import SynapseObserver
from synapse_attach.redis_observer import RedisObserver
from testing.services import RedisServer
from testing.synapse_homeserver import ClientApi, MatrixError, SynapseHomeserver, running

#: Every test of the module in pytest-django's transactional group (one test needs it: a
#: service process reads what the test wrote), so they run together and the cluster, a module
#: fixture, starts once, not once per group.
pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
SERVER_NAME = "attach-live.test"
ROLE = f"attach_live_{secrets.token_hex(3)}"
ROLE_PASSWORD = "role-pw-" + secrets.token_hex(4)
ACL_USER = "synapse_observer"
ACL_PASSWORD = "acl-pw-" + secrets.token_hex(4)
#: The test's threshold (the default is 10 s): the stuck case is named sooner, the idle case
#: needs less traffic to prove anything.
STUCK_AFTER = 5.0
#: The test's SYNAPSE_UNREPORTED_AFTER_SECONDS (the default is 60 s).
UNREPORTED_AFTER = 3.0
DEADLINE = 60.0
BROWSER_PASSWORD = "browser-" + secrets.token_hex(6)


def acl_line(server_name: str) -> list[str]:
    """The Redis ACL of docs/attach.md: the observer's user subscribes to Synapse's channels and
    pings, nothing else (no PUBLISH, no keys)."""
    return ["ACL", "SETUSER", ACL_USER, "reset", "on", f">{ACL_PASSWORD}", "resetchannels",
            f"&{server_name}", f"&{server_name}/USER_IP", "-@all", "+subscribe", "+ping"]


def redis_command(redis: RedisServer, *args: str) -> Any:
    async def run() -> Any:
        conn = await RespConnection.open(redis.url)
        try:
            return await conn.command(*args, timeout=10)
        finally:
            await conn.close()
    return asyncio.run(run())


@pytest.fixture(scope="module")
def synapse_redis():
    redis = RedisServer(password=secrets.token_urlsafe(12)).start()
    redis_command(redis, *acl_line(SERVER_NAME))
    yield redis
    redis.stop()


def observer_redis_url(redis: RedisServer) -> str:
    return f"redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{redis.port}/0"


@pytest.fixture(scope="module")
def cluster(postgres_server, synapse_redis):
    with running(SynapseHomeserver(SERVER_NAME, postgres_server.port, synapse_redis.port,
                                   redis_password=synapse_redis.password, database="synapse_attach_live",
                                   event_persisters=("persister1",))) as homeserver:
        yield homeserver


@pytest.fixture(scope="module")
def role_url(cluster):
    """A role with SELECT on Synapse's tables and sequences, nothing else (docs/attach.md)."""
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{ROLE_PASSWORD}'")
        for grant in (f"GRANT CONNECT ON DATABASE {cluster.database} TO {ROLE}",
                      f"GRANT USAGE ON SCHEMA public TO {ROLE}",
                      f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {ROLE}",
                      f"GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO {ROLE}"):
            conn.execute(grant)
    yield f"postgresql://{ROLE}:{ROLE_PASSWORD}@127.0.0.1:{cluster.pg_port}/{cluster.database}"
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {ROLE}")
        conn.execute(f"DROP ROLE {ROLE}")


class LiveObserver:
    """The adapter and its core, running on an asyncio loop in a thread of their own; every
    read of the core happens on that loop (no read races the lines arriving)."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.core = SynapseObserver(stuck_after=STUCK_AFTER, started=time.monotonic())
        self.redis = RedisObserver(url, SERVER_NAME, self.core,
                                   policy=SubscriptionPolicy(first_delay=0.1, max_delay=1.0))
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self.redis.run(),), daemon=True)
        self.thread.start()

    def read(self, fn: Callable[[SynapseObserver], Any]) -> Any:
        async def call() -> Any:
            return fn(self.core)
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def view(self) -> dict:
        return self.read(lambda core: core.as_dict(time.monotonic()))

    def stuck(self) -> list[tuple[str, str]]:
        return self.read(lambda core: [(s.stream, s.instance) for s in core.stuck(time.monotonic())])

    def subscriptions(self) -> int:
        return self.read(lambda core: self.redis.subscriptions if self.redis.subscribed else 0)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.redis.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture(scope="module")
def live(cluster, synapse_redis):
    observer = LiveObserver(observer_redis_url(synapse_redis))
    poll(lambda: observer.subscriptions() >= 1, "the observer subscribed")
    yield observer
    observer.close()


def poll(condition: Callable[[], Any], what: str, deadline: float = DEADLINE, every: float = 0.2,
         between: Callable[[], None] | None = None) -> Any:
    """Until ``condition()`` is true (its value is returned); fails after ``deadline`` s."""
    end = time.monotonic() + deadline
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"not within {deadline:g} s: {what}")
        if between is not None:
            between()
        time.sleep(every)


@pytest.fixture(scope="module")
def users(cluster):
    alice, bob = cluster.register("alice"), cluster.register("bob")
    return alice, bob


def writer_of(cluster: SynapseHomeserver, room_id: str) -> str:
    return cluster.query("SELECT instance_name FROM events WHERE room_id = %s ORDER BY stream_ordering DESC "
                         "LIMIT 1", room_id)[0][0]


@pytest.fixture(scope="module")
def rooms(cluster, users) -> dict[str, list[str]]:
    """Rooms by the writer Synapse gave them (it shards rooms between the event writers by
    room ID): created until each writer has two."""
    alice, bob = users
    by_writer: dict[str, list[str]] = {"master": [], "persister1": []}
    while min(len(r) for r in by_writer.values()) < 2:
        assert sum(len(r) for r in by_writer.values()) < 40, by_writer
        room = alice.create_room(preset="private_chat")
        alice.invite(room, bob.user_id)
        bob.join(room)
        by_writer[writer_of(cluster, room)].append(room)
    return by_writer


def stream_positions(cluster: SynapseHomeserver) -> dict[tuple[str, str], int]:
    return {(name, instance): pos for name, instance, pos in
            cluster.query("SELECT stream_name, instance_name, stream_id FROM stream_positions")}


def every_kind_of_traffic(cluster: SynapseHomeserver, users: tuple[ClientApi, ClientApi],
                          rooms: dict[str, list[str]], n: int) -> None:
    """Messages in rooms of both writers, state, typing, receipts, account data, to-device, a
    new device (device lists)."""
    alice, bob = users
    cluster.register(f"carol{secrets.token_hex(3)}")
    for room in rooms["master"] + rooms["persister1"]:
        last = ""
        for i in range(n):
            last = alice.send_message(room, f"message {i}")
        alice.set_topic(room, f"topic {secrets.token_hex(2)}")
        alice.typing(room)
        bob.read_receipt(room, last)
    alice.account_data("org.example.live", {"n": n})
    alice.send_to_device(bob.user_id, bob.device_id, "org.example.ping", {"n": n})


def agrees_with_stream_positions(view: dict, positions: dict[tuple[str, str], int]) -> list[str]:
    """What the observer's view says against Synapse's stream_positions (empty: agreement).

    Per writer: Synapse records, after a write, the position the writer has reached (its last
    write, or more when it has moved up to the others' since), so the observer's last write
    <= the recorded position <= the position announced; per stream: the highest announced is
    the largest recorded (the last write's)."""
    problems = []
    for spec in STREAMS:
        if not spec.records_positions or spec.positions_name is None:
            continue
        recorded = {inst: pos * spec.sign for (name, inst), pos in positions.items() if name == spec.positions_name}
        entry = view["streams"].get(spec.name)
        if not recorded:
            continue
        if entry is None:
            problems.append(f"{spec.name}: recorded {recorded}, nothing heard")
            continue
        heard = {w["instance"]: w for w in entry["writers"]}
        for inst, pos in recorded.items():
            w = heard.get(inst)
            if w is None or w["written"] is None or not w["written"] <= pos <= w["position"]:
                problems.append(f"{spec.name}/{inst}: recorded {pos}, heard {w}")
        if entry["highest"] != max(recorded.values()):
            problems.append(f"{spec.name}: highest heard {entry['highest']}, largest recorded {max(recorded.values())}")
    return problems


def test_the_observer_user_may_not_publish(synapse_redis, live):
    async def attempt() -> str:
        conn = await RespConnection.open(observer_redis_url(synapse_redis))
        try:
            await conn.command("PUBLISH", SERVER_NAME, "POSITION events master 1 999999", timeout=10)
        except RespError as e:
            return str(e)
        finally:
            await conn.close()
        return "published"
    assert "NOPERM" in asyncio.run(attempt())
    assert live.subscriptions() == 1


def test_positions_heard_agree_with_synapses_stream_positions(cluster, live, users, rooms, role_url, tmp_path):
    every_kind_of_traffic(cluster, users, rooms, 2)
    deadline = time.monotonic() + DEADLINE
    while True:
        problems = agrees_with_stream_positions(live.view(), stream_positions(cluster))
        if not problems:
            break
        if time.monotonic() > deadline:
            view = live.view()
            pytest.fail(f"{problems}\nheard: {json.dumps(view['streams'])[:3000]}\n"
                        f"lines {view['lines']}, subscriptions {live.subscriptions()}", pytrace=False)
        time.sleep(0.3)
    view = live.view()
    events = {w["instance"]: w for w in view["streams"]["events"]["writers"]}
    assert events["master"]["facts"] > 0 and events["persister1"]["facts"] > 0
    for stream in ("receipts", "account_data", "to_device", "typing", "caches"):
        assert stream in view["streams"], (stream, sorted(view["streams"]))
    instances = {i["instance"]: i["commands"] for i in view["instances"]}
    assert {"RDATA", "POSITION", "LOCK_RELEASED"} <= set(instances["master"])
    assert {"RDATA", "POSITION", "LOCK_RELEASED"} <= set(instances["persister1"])
    assert view["bad_lines"] == 0 and view["stuck"] == []


def test_synapse_status_listens_as_the_acl_user_and_the_select_role(cluster, synapse_redis, users, rooms,
                                                                       role_url, tmp_path):
    env = {**os.environ, "STATE_DIR": str(tmp_path / "state"), "SYNAPSE_DATABASE_URL": role_url,
           "SYNAPSE_REDIS_URL": observer_redis_url(synapse_redis), "SYNAPSE_SERVER_NAME": SERVER_NAME}
    env.pop("DATABASE_URL", None)
    command = subprocess.Popen([sys.executable, "manage.py", "synapse_status", "--json", "--listen", "3"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # traffic while it listens (its start takes a second or two: keep sending until it ends)
        while command.poll() is None:
            users[0].send_message(rooms["master"][0], "while listening")
            users[0].send_message(rooms["persister1"][0], "while listening")
            time.sleep(0.3)
        out, err = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    assert command.returncode == 0, err
    document = json.loads(out)
    live = document["live"]
    assert live["redis"]["subscriptions"] == 1 and ACL_PASSWORD not in out
    assert {w["instance"] for w in live["streams"]["events"]["writers"]} == {"master", "persister1"}
    assert live["stuck"] == []
    assert {s["stream"] for s in document["streams"]} >= {"events", "receipts"}


def test_an_idle_persister_is_never_called_stuck(live, users, rooms):
    """Traffic to the main process's rooms only, for twice the threshold: the persister writes
    nothing and echoes the main process's positions."""
    alice = users[0]
    before = live.view()["streams"]["events"]
    end = time.monotonic() + 2 * STUCK_AFTER
    while time.monotonic() < end:
        alice.send_message(rooms["master"][0], "main only")
        assert live.stuck() == []
        time.sleep(0.2)
    after = {w["instance"]: w for w in live.view()["streams"]["events"]["writers"]}
    persister_before = next(w for w in before["writers"] if w["instance"] == "persister1")
    assert after["persister1"]["facts"] == persister_before["facts"]  # it wrote nothing
    assert after["persister1"]["position"] > persister_before["position"]  # yet moved along
    assert live.stuck() == []


def test_a_stopped_persister_is_named_stuck_and_cleared_after_sigcont(cluster, live, users, rooms):
    alice = users[0]
    persister = cluster.workers["persister1"]
    blocked: list[threading.Thread] = []
    failures: list[BaseException] = []

    def to_persisters_room(i: int) -> None:
        try:
            ClientApi(cluster.client_url, alice.token, alice.user_id, alice.device_id).send_message(
                rooms["persister1"][0], f"while stopped {i}")
        except (MatrixError, OSError) as e:  # a request given up while the persister slept
            failures.append(e)

    def traffic() -> None:
        alice.send_message(rooms["master"][0], "main goes on")

    def persister_written() -> int:
        return next(w["written"] for w in live.view()["streams"]["events"]["writers"]
                    if w["instance"] == "persister1")

    written_before = persister_written()
    persister.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        for i in range(2):
            thread = threading.Thread(target=to_persisters_room, args=(i,), daemon=True)
            thread.start()
            blocked.append(thread)
        named = poll(lambda: live.stuck(), "the stopped persister named stuck", deadline=30, between=traffic)
        named_after = time.monotonic() - stopped_at
        assert named == [("events", "persister1")]
        stuck = live.view()["stuck"][0]
        assert stuck["behind_seconds"] >= STUCK_AFTER
        print(f"stuck persister named after {named_after:.1f} s")
    finally:
        persister.send_signal(signal.SIGCONT)
    poll(lambda: live.stuck() == [], "the persister no longer stuck after SIGCONT", between=traffic)
    for thread in blocked:
        thread.join(60)
    assert not any(t.is_alive() for t in blocked)
    # what the persister wrote once continued is heard as its own
    poll(lambda: persister_written() > written_before, "the persister heard writing its room's messages")


def test_the_observer_resubscribes_after_redis_restarts(cluster, live, synapse_redis, users, rooms):
    synapse_redis.kill()
    synapse_redis.start(synapse_redis.port)
    redis_command(synapse_redis, *acl_line(SERVER_NAME))  # no persistence: the ACL user again
    poll(lambda: live.subscriptions() >= 2, "the observer subscribed again")
    before = live.view()["lines"]

    def traffic() -> None:
        try:
            users[0].send_message(rooms["master"][1], "after the restart")
        except MatrixError:
            pass
    poll(lambda: live.view()["lines"] > before, "lines heard after the restart", between=traffic)


def test_runservice_runs_the_observer_and_the_dashboard_shows_it(cluster, synapse_redis, users, rooms, pg_url,
                                                                 role_url, client, tmp_path):
    """With SYNAPSE_REDIS_URL set, ``runservice`` runs ``synapse_observer`` (as the ACL user,
    reading the database as the SELECT-only role) as a child of its own; what it hears is on
    /status.json and /metrics of a web process (this test's client, on the same database) and,
    in a real browser, on the streams page of the service itself; the service stops cleanly,
    its child with it."""
    from django.contrib.auth import get_user_model
    from prometheus_client.parser import text_string_to_metric_families

    from tests.synapse_repl.test_web_hardening import Service

    client.force_login(get_user_model().objects.create_user("operator", password="x" * 12, is_staff=True))
    service = Service({"DATABASE_URL": pg_url, "DEMO": "0", "REPLICATION_SECRET": secrets.token_urlsafe(32),
                       "SYNAPSE_REDIS_URL": observer_redis_url(synapse_redis), "SYNAPSE_SERVER_NAME": SERVER_NAME,
                       "SYNAPSE_DATABASE_URL": role_url, "ADMIN_PASSWORD": BROWSER_PASSWORD},
                      tmp_path / "var")
    service.start()
    try:
        def both_writers_shown() -> dict | None:
            assert service.proc.poll() is None, service.output()[-3000:]
            users[0].send_message(rooms["master"][0], "for the dashboard")
            users[0].send_message(rooms["persister1"][0], "for the dashboard")
            shown = client.get("/status.json").json()["synapse"]
            events = [s for o in shown for s in o["streams"] if s["name"] == "events"]
            return shown[0] if events and set(events[0]["positions"]) == {"master", "persister1"} else None

        shown = poll(both_writers_shown, "both event writers heard, on /status.json", every=0.5)
        assert shown["subscribed"] and shown["source"] == "synapse" and not shown["stale"]
        assert shown["pid"] != service.proc.pid  # a child of its own
        assert shown["observer"].startswith(f"{SERVER_NAME}@")
        metrics = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(client.get("/metrics").content.decode())
                   for s in f.samples}
        assert metrics[("synapse_repl_synapse_observer_up", (("observer", shown["observer"]),))] == 1
        assert metrics[("synapse_repl_synapse_writer_position", (("stream", "events"), ("writer", "persister1")))] > 0
        assert metrics[("synapse_repl_synapse_stuck_writer_seconds", (("stream", "events"), ("writer", "master")))] == 0
        assert "Synapse: observing redis://synapse_observer:***@" in service.output()
        assert ACL_PASSWORD not in service.output() and ROLE_PASSWORD not in service.output()
        # (Playwright's sync API runs an event loop in this thread: no Django ORM after this.)
        the_page_shows_both_event_writers(service.base, users, rooms)
    finally:
        service.stop()
    assert service.proc.returncode == 0, service.output()[-3000:]
    assert "Traceback" not in service.output(), service.output()[-3000:]


def the_page_shows_both_event_writers(base: str, users: tuple[ClientApi, ClientApi],
                                      rooms: dict[str, list[str]]) -> None:
    """The streams page in Debian's headless Chromium (as tests/dashboard/test_browser.py drives
    it): the section "Synapse <server_name>" with both event writers' recorded and live
    positions, persisted-upto from the database, the processes, and the chart's Synapse series.
    Its screenshot is the README's (docs/attach-page.png is a copy)."""
    from playwright.sync_api import expect, sync_playwright

    from tests.dashboard.test_browser import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS

    if not os.path.exists(CHROMIUM):  # fail, never skip
        pytest.fail(f"{CHROMIUM} not found: apt-get install chromium (.ci/run installs it)", pytrace=False)
    wait = 30_000
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(base + "/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", BROWSER_PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(base + "/")
            section = page.locator("section.synapse-source")
            expect(section.locator("h2")).to_have_text(f"Synapse {SERVER_NAME}", timeout=wait)
            events = section.locator('tr[data-stream="events"]')
            for writer in ("master", "persister1"):
                # traffic to each writer's rooms while the page is open: its live position shows
                users[0].send_message(rooms[writer][0], "for the page")
                expect(events.locator(f'.recorded[data-writer="{writer}"]')).to_have_text(
                    re.compile(r"^\d+$"), timeout=wait)
                expect(events.locator(f'.live-position[data-writer="{writer}"]')).to_have_text(
                    re.compile(r"^\d+$"), timeout=wait)
            expect(events.locator(".persisted-upto")).to_have_text(re.compile(r"^\d+$"), timeout=wait)
            expect(events.locator(".allocated")).to_have_text(re.compile(r"^\d+"), timeout=wait)
            expect(section.locator('tr[data-instance="persister1"]')).to_be_visible(timeout=wait)
            expect(section.locator('tr[data-instance="master"]')).to_be_visible(timeout=wait)
            expect(section.locator(".stuck-warning")).to_have_count(0)
            # a healthy Synapse: the ID its schema handed out on a stream never written (92/08's
            # nextval on thread_subscriptions_sequence) is not unreported; in-memory streams
            # have no persisted-upto
            expect(section.locator('tr[data-stream="thread_subscriptions"] .allocated')).to_have_text(
                re.compile(r"^\d+$"), timeout=wait)
            expect(section.locator('tr[data-stream="typing"] .persisted-upto')).to_have_text("")
            expect(page.locator('[data-live="legend"]')).to_contain_text("Synapse events", timeout=wait)
            # persisted-upto (read from the database) is never beyond what the writers announce
            # live; the two are of different instants (the read takes its time while Synapse
            # writes on), so the announcement may come a moment later: the page updates itself
            deadline = time.monotonic() + DEADLINE
            while True:
                upto = int(events.locator(".persisted-upto").inner_text())
                live = max(int(events.locator(f'.live-position[data-writer="{w}"]').inner_text())
                           for w in ("master", "persister1"))
                if upto <= live:
                    break
                assert time.monotonic() < deadline, (upto, live)
                page.wait_for_timeout(500)
            page.wait_for_timeout(3000)  # a few chart samples
            page.screenshot(path=str(SCREENSHOTS / "synapse-attach-1280.png"), full_page=True)
            assert (SCREENSHOTS / "synapse-attach-1280.png").stat().st_size > 10_000
        finally:
            browser.close()


def synapse_recorded_positions(cluster: SynapseHomeserver) -> dict[str, dict[str, int]]:
    """Per stream that records positions, its writers' ``stream_positions`` rows, in tokens."""
    rows = stream_positions(cluster)
    out = {}
    for spec in STREAMS:
        if spec.records_positions and spec.positions_name is not None:
            out[spec.name] = {inst: pos * spec.sign for (name, inst), pos in rows.items() if name == spec.positions_name}
    return out


def events_in_flight(cluster: SynapseHomeserver) -> tuple[int, int]:
    """(the largest event ID ``events_stream_seq`` handed out, the highest ID reported: the
    largest stored in the events stream's tables or recorded in stream_positions), read as
    superuser."""
    ((last_value, is_called),) = cluster.query("SELECT last_value, is_called FROM events_stream_seq")
    ((cover,),) = cluster.query(
        "SELECT GREATEST((SELECT MAX(stream_ordering) FROM events), "
        "(SELECT MAX(stream_id) FROM current_state_delta_stream), "
        "(SELECT MAX(event_stream_ordering) FROM ex_outlier_stream), "
        "(SELECT MAX(stream_id) FROM stream_positions WHERE stream_name = 'events'), 0)")
    return (last_value if is_called else last_value - 1), cover


def test_runservice_with_only_the_database_shows_synapses_streams_and_its_unreported_ids(
        cluster, users, rooms, pg_url, role_url, tmp_path):
    """With SYNAPSE_DATABASE_URL alone (the SELECT-only role; no Redis, no server name),
    ``runservice`` runs ``synapse_observer`` reading the database only: /status.json, /metrics
    and the streams page of the service show Synapse's streams with the positions of
    ``stream_positions``, what only Redis tells as unknown, and no unreported ID on a healthy
    idle Synapse. Then the persister hands out event IDs it does not store: its events
    transaction is held by a table lock until it has taken its IDs (``nextval`` is its own
    transaction), then the persister is stopped with SIGSTOP and the lock released, so its
    transaction stays open in a stopped process. The IDs are named overdue once they have been
    unreported SYNAPSE_UNREPORTED_AFTER_SECONDS (3 s here), and cleared after SIGCONT."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.synapse_repl.test_web_hardening import Service

    every_kind_of_traffic(cluster, users, rooms, 1)
    service = Service({"DATABASE_URL": pg_url, "DEMO": "0", "REPLICATION_SECRET": secrets.token_urlsafe(32),
                       "SYNAPSE_DATABASE_URL": role_url, "ADMIN_PASSWORD": BROWSER_PASSWORD,
                       "SYNAPSE_UNREPORTED_AFTER_SECONDS": str(UNREPORTED_AFTER),
                       "SYNAPSE_DATABASE_INTERVAL_SECONDS": "1"}, tmp_path / "var")
    service.start()
    persister = cluster.workers["persister1"]
    blocked: list[threading.Thread] = []
    try:
        opener = service.signed_in("admin", BROWSER_PASSWORD)

        def get(path: str) -> str:
            assert service.proc.poll() is None, service.output()[-3000:]
            return opener.open(service.base + path, timeout=30).read().decode()

        def observer() -> dict | None:
            shown = json.loads(get("/status.json"))["synapse"]
            return shown[0] if shown and (shown[0]["database"] or {}).get("read") else None

        def agrees() -> dict | None:
            o = observer()
            if o is None:
                return None
            shown = {s["name"]: s["positions"] for s in o["streams"]}
            expected = synapse_recorded_positions(cluster)
            return o if all(shown.get(name, {}) == positions for name, positions in expected.items()) else None

        o = poll(agrees, "Synapse's streams on /status.json with the positions of stream_positions", every=0.5)
        assert o["sources"] == ["database"] and o["source"] == "synapse" and not o["stale"]
        assert o["subscribed"] is None and o["instances"] is None and o["stuck"] is None and o["redis"] is None
        assert o["pid"] != service.proc.pid  # a child of its own
        events = next(s for s in o["streams"] if s["name"] == "events")
        assert set(events["positions"]) == {"master", "persister1"}
        assert events["positions_from"] == "database" and events["recorded"] == events["positions"]
        assert events["highest"] is None and events["writer_status"] is None and events["laggard"] is None
        assert events["persisted_upto"] >= min(events["positions"].values())
        assert "typing" not in {s["name"] for s in o["streams"]}  # in memory: nothing in the database
        assert o["observer"].startswith(f"{cluster.database} on 127.0.0.1:{cluster.pg_port}@")
        out = service.output()
        assert "no SYNAPSE_REDIS_URL: database figures only" in out and ROLE_PASSWORD not in out

        # a healthy idle Synapse: nothing overdue over reads spanning more than the threshold
        first = o["database"]["read"]

        def idle_for_longer_than_the_threshold() -> dict | None:
            current = observer()
            assert current is not None
            assert [u for u in current["database"]["unreported"] if u["overdue"]] == [], current["database"]
            return current if current["database"]["read"] - first > UNREPORTED_AFTER + 2 else None

        poll(idle_for_longer_than_the_threshold, "reads of an idle Synapse over the threshold", every=0.5)

        page = get("/")
        assert f"Synapse {cluster.database} on 127.0.0.1:{cluster.pg_port}" in page
        assert "no Redis attached (SYNAPSE_REDIS_URL unset)" in page
        recorded = synapse_recorded_positions(cluster)["events"]
        for writer in ("master", "persister1"):
            assert f'<span class="live-position" data-writer="{writer}">unknown</span>' in page
            assert re.search(rf'<span class="recorded" data-writer="{writer}">{recorded[writer]}</span>', page)
        assert "Synapse's processes are heard on its Redis" in page and "UNREPORTED" not in page

        def metrics() -> dict:
            return {(s.name, tuple(sorted(s.labels.items()))): s.value
                    for f in text_string_to_metric_families(get("/metrics")) for s in f.samples}

        got = metrics()
        assert got[("synapse_repl_synapse_observer_up", (("observer", o["observer"]),))] == 1
        assert got[("synapse_repl_synapse_writer_recorded_position",
                    (("stream", "events"), ("writer", "persister1")))] == recorded["persister1"]
        assert not any(name == "synapse_repl_synapse_writer_position" for name, _ in got)  # unknown: absent

        # the persister hands out event IDs, then holds them, stopped
        alice = users[0]

        def to_persisters_room(i: int) -> None:
            try:
                ClientApi(cluster.client_url, alice.token, alice.user_id, alice.device_id).send_message(
                    rooms["persister1"][0], f"held {i}")
            except (MatrixError, OSError):  # a request given up while the persister slept
                pass

        def events_unreported() -> dict:
            current = observer()
            assert current is not None
            return next(u for u in current["database"]["unreported"] if u["stream"] == "events")

        try:
            with psycopg.connect(cluster.dsn) as lock:
                lock.execute("LOCK TABLE events IN SHARE MODE")
                for i in range(2):
                    thread = threading.Thread(target=to_persisters_room, args=(i,), daemon=True)
                    thread.start()
                    blocked.append(thread)
                allocated, cover = poll(lambda: (lambda a, c: (a, c) if a > c else None)(*events_in_flight(cluster)),
                                        "the persister handed out event IDs it has not stored")
                persister.send_signal(signal.SIGSTOP)
                stopped_at = time.monotonic()
                lock.rollback()
            named = poll(lambda: (lambda u: u if u["overdue"] else None)(events_unreported()),
                         "the persister's event IDs named unreported", every=0.5)
            named_after = time.monotonic() - stopped_at
            assert named["allocated"] >= allocated and named["covered"] == cover and named["count"] >= 1
            assert named["age_seconds"] >= UNREPORTED_AFTER
            assert events_in_flight(cluster) == (named["allocated"], cover)  # still held: nothing stored
            assert metrics()[("synapse_repl_synapse_unreported_ids_overdue", (("stream", "events"),))] == 1
            assert "<strong>UNREPORTED</strong> events" in get("/")
            print(f"unreported event IDs named after {named_after:.1f} s (threshold {UNREPORTED_AFTER:g} s)")
        finally:
            persister.send_signal(signal.SIGCONT)
        poll(lambda: (lambda u: u["count"] == 0 and not u["overdue"])(events_unreported()),
             "the persister's event IDs reported after SIGCONT", every=0.5)
        assert metrics()[("synapse_repl_synapse_unreported_ids_overdue", (("stream", "events"),))] == 0
        for thread in blocked:
            thread.join(60)
    finally:
        service.stop()
    assert service.proc.returncode == 0, service.output()[-3000:]
    assert "Traceback" not in service.output(), service.output()[-3000:]
    assert not any(t.is_alive() for t in blocked)


def test_a_synapse_restart_is_followed(cluster, live, users, rooms):
    """Main process and persister stopped and started again: the observer, still subscribed,
    hears them announce their positions again and agrees with stream_positions after traffic."""
    subscriptions = live.subscriptions()
    restarted_at = time.monotonic()
    cluster.restart()
    every_kind_of_traffic(cluster, users, rooms, 1)

    def heard_again() -> bool:
        view = live.view()
        ages = {i["instance"]: i["last_seen_seconds_ago"] for i in view["instances"]}
        since = time.monotonic() - restarted_at
        fresh = all(ages.get(name, 1e9) < since for name in ("master", "persister1"))
        return fresh and not agrees_with_stream_positions(view, stream_positions(cluster))

    poll(heard_again, "both processes heard again, in agreement with stream_positions")
    assert live.subscriptions() == subscriptions  # Redis did not move: one subscription throughout
    assert live.stuck() == []
