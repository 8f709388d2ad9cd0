"""A throwaway Synapse worker cluster for the attach benchmarks, and the read-only role and
Redis user created exactly as README.md's "Use it with your Synapse" says.

The cluster is the suite's (``testing/synapse_homeserver.py``): a main process and one event
persister on a PostgreSQL and a password-protected Redis of its own, on free loopback ports.
The role's SQL and the ACL line are read from the README's code blocks, with only the names a
reader replaces (the database, ``example.com``, the password) replaced, so the benchmarks
follow what the README tells a reader to type.
"""
from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import shlex
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from testing.services import PostgresServer, RedisServer  # noqa: E402
from testing.synapse_homeserver import ClientApi, MatrixError, SynapseHomeserver  # noqa: E402

#: The role and Redis user the README creates.
OBSERVER = "synapse_observer"


@dataclass
class Cluster:
    postgres: PostgresServer
    redis: RedisServer
    synapse: SynapseHomeserver


@contextlib.contextmanager
def throwaway_synapse(server_name: str, *, database: str = "synapse") -> Iterator[Cluster]:
    """A PostgreSQL, a Redis with a password, and Synapse (main process plus ``persister1``),
    all stopped and removed on the way out."""
    with contextlib.ExitStack() as stack:
        postgres = PostgresServer().start()
        stack.callback(postgres.stop)
        redis = RedisServer(password=secrets.token_urlsafe(12)).start()
        stack.callback(redis.stop)
        synapse = SynapseHomeserver(server_name, postgres.port, redis.port, redis_password=redis.password,
                                    database=database, event_persisters=("persister1",))
        stack.callback(synapse.remove)
        synapse.configure().start()
        yield Cluster(postgres, redis, synapse)


def readme_section(readme: Path) -> str:
    text = readme.read_text()
    start = text.index("## Use it with your Synapse")
    return text[start:text.index("\n## ", start + 1)]


def readme_role_sql(readme: Path) -> list[str]:
    """The README's SQL statements for the read-only role (its ``sql`` block)."""
    block = re.search(r"```sql\n(.*?)```", readme_section(readme), re.S)
    assert block, "README.md: no sql block under 'Use it with your Synapse'"
    body = "\n".join(line for line in block.group(1).splitlines() if not line.strip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


def readme_acl_line(readme: Path) -> str:
    """The README's ``ACL SETUSER`` line."""
    line = next((line.strip() for line in readme_section(readme).splitlines()
                 if line.strip().startswith("ACL SETUSER")), None)
    assert line, "README.md: no ACL SETUSER line under 'Use it with your Synapse'"
    return line


def create_role_as_the_readme_says(cluster: Cluster, statements: list[str], password: str) -> str:
    """Run the README's statements as Synapse's superuser (the database named as Synapse's);
    the role's URL."""
    import psycopg

    database = cluster.synapse.database
    with psycopg.connect(cluster.synapse.dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.replace("choose-a-password", password)
                         .replace("DATABASE synapse ", f"DATABASE {database} "))
    return f"postgres://{OBSERVER}:{password}@127.0.0.1:{cluster.postgres.port}/{database}"


def create_acl_user_as_the_readme_says(cluster: Cluster, line: str, password: str) -> str:
    """Send the README's ACL line to Synapse's Redis (as its admin); the user's URL."""
    from replication.protocol.resp import RespConnection

    server_name = cluster.synapse.server_name
    args = shlex.split(line.replace("example.com", server_name).replace("choose-a-password", password))

    async def run() -> None:
        conn = await RespConnection.open(cluster.redis.url)
        try:
            await conn.command(*args, timeout=10)
        finally:
            await conn.close()

    asyncio.run(run())
    return f"redis://{OBSERVER}:{password}@127.0.0.1:{cluster.redis.port}"


def rooms_of_each_writer(synapse: SynapseHomeserver, alice: ClientApi, bob: ClientApi,
                         per_writer: int = 2) -> dict[str, list[str]]:
    """Rooms created until each event writer (Synapse shards rooms by ID) has ``per_writer``."""
    by_writer: dict[str, list[str]] = {"master": [], "persister1": []}
    while min(len(r) for r in by_writer.values()) < per_writer:
        room = alice.create_room(preset="private_chat")
        alice.invite(room, bob.user_id)
        bob.join(room)
        writer = synapse.query("SELECT instance_name FROM events WHERE room_id = %s "
                               "ORDER BY stream_ordering DESC LIMIT 1", room)[0][0]
        by_writer[writer].append(room)
    return by_writer


class Traffic:
    """Client traffic in ``threads`` closed loops (as fast as Synapse answers: the fixture's
    top rate) until :meth:`stop`: messages to rooms of both writers, and every tenth request a
    receipt, typing or account data. ``sent`` counts the requests answered."""

    def __init__(self, synapse: SynapseHomeserver, alice: ClientApi, bob: ClientApi,
                 rooms: dict[str, list[str]], threads: int = 4) -> None:
        self.synapse, self.alice, self.bob = synapse, alice, bob
        self.rooms = [r for writer in sorted(rooms) for r in rooms[writer]]
        self.sent = 0
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(threads)]

    def start(self) -> "Traffic":
        for t in self._threads:
            t.start()
        return self

    def _loop(self, n: int) -> None:
        me = ClientApi(self.synapse.client_url, self.alice.token, self.alice.user_id, self.alice.device_id)
        other = ClientApi(self.synapse.client_url, self.bob.token, self.bob.user_id, self.bob.device_id)
        i = 0
        last = ""
        while not self._stop.is_set():
            room = self.rooms[(n + i) % len(self.rooms)]
            try:
                if i % 10 == 3 and last:
                    other.read_receipt(room, last)
                elif i % 10 == 6:
                    me.typing(room)
                elif i % 10 == 9:
                    me.account_data("org.example.bench", {"i": i})
                else:
                    last = me.send_message(room, f"bench {n} {i}")
                with self._lock:
                    self.sent += 1
            except (MatrixError, OSError):
                with self._lock:
                    self.errors += 1
            i += 1

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
