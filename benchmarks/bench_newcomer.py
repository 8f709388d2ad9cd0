"""A newcomer with a Synapse follows README.md's "Use it with your Synapse": how long until the
dashboard shows Synapse's streams.

    .venv/bin/python benchmarks/bench_newcomer.py [--keep]

What it does, step by step, each timed:

1. a throwaway Synapse stands in for the newcomer's own (the suite's fixture,
   ``testing/synapse_homeserver.py``: a main process and an event persister, on a PostgreSQL and
   a password-protected Redis of its own), with a little client traffic throughout (a message
   to a room of each event writer every second), as a Synapse in use has; not counted in the
   newcomer's total;
2. ``git clone`` of this repository (its committed HEAD) into a temporary directory;
3. the read-only role: the README's SQL block, run as Synapse's PostgreSQL superuser (the
   README's database name ``synapse`` is the fixture's; the password replaced);
4. the Redis user: the README's ``ACL SETUSER`` line sent to Synapse's Redis (``example.com``
   replaced with the fixture's server name);
5. the README's variables, then ``DEMO=0 make run`` in the clone: a new ``.venv``, the runtime
   set installed from ``requirements.txt`` with pip (pip's own cache on this machine,
   ``~/.cache/pip``, is used as pip always uses it: the packages' files come from it when it
   has them, the index is still asked), ``migrate``, ``runservice``; timed to the line
   ``make run`` prints the web UI's address on, and to the web UI answering;
6. sign in with what ``make run`` printed (``sign in: admin / ...``) and poll ``/status.json``
   until it shows Synapse's streams (``events`` with both writers' recorded positions), then
   the page with the section "Synapse <server_name>".

One deviation from the README, said here: ``WEB_LISTEN`` and ``REPLICATION_LISTEN`` are free
ports rather than 8000 and 9092 (the machine is shared). Printed: each step's seconds, the
newcomer's total (steps 2-6), the machine and its load before and after.
"""
from __future__ import annotations

import argparse
import http.cookiejar
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._machine import cpu_description, load_average  # noqa: E402
from benchmarks._synapse_cluster import (  # noqa: E402
    create_acl_user_as_the_readme_says,
    create_role_as_the_readme_says,
    readme_acl_line,
    readme_role_sql,
    rooms_of_each_writer,
    throwaway_synapse,
)
from testing.processes import web_answers  # noqa: E402
from testing.services import free_port  # noqa: E402
from testing.synapse_homeserver import MatrixError  # noqa: E402

SERVER_NAME = "bench-newcomer.test"
#: Give up on a step after this long (the promise is five minutes for all of them).
STEP_TIMEOUT = 900.0


class Output:
    """``make run``'s output, read in a thread, each line with the time it arrived."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._lock:
                self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, pattern: str) -> tuple[float, re.Match] | None:
        with self._lock:
            for at, line in self.lines:
                m = re.search(pattern, line)
                if m:
                    return at, m
        return None

    def tail(self, n: int = 40) -> str:
        with self._lock:
            return "\n".join(line for _, line in self.lines[-n:])


def wait_for(condition, what: str, proc: subprocess.Popen | None = None, output: Output | None = None,
             timeout: float = STEP_TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"make run exited ({proc.returncode}) before {what}:\n{output.tail() if output else ''}")
        if time.monotonic() > deadline:
            raise SystemExit(f"not within {timeout:g} s: {what}\n{output.tail() if output else ''}")
        time.sleep(0.2)


def signed_in(base: str, user: str, password: str) -> urllib.request.OpenerDirector:
    """A session through the real login form, as a browser gets one."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = opener.open(f"{base}/admin/login/", timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    body = urllib.parse.urlencode({"username": user, "password": password, "csrfmiddlewaretoken": token,
                                   "next": "/"}).encode()
    opener.open(f"{base}/admin/login/", body, timeout=30)
    if not any(c.name == "sessionid" for c in jar):
        raise SystemExit(f"could not sign in as {user}")
    return opener


def stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through every finally: the service and servers stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the clone in place (its path is printed)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    readme = ROOT / "README.md"
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    print(f"machine: {cpu_description()}; load before {load_average()}")
    cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True).stdout
    print(f"README.md of {head}; pip's cache on this machine: {cache.strip() or '?'}")
    steps: list[tuple[str, float]] = []
    workdir = Path(tempfile.mkdtemp(prefix="bench_newcomer_"))
    service: subprocess.Popen | None = None
    stop_traffic = threading.Event()
    try:
        t0 = time.monotonic()
        with throwaway_synapse(SERVER_NAME) as cluster:
            synapse = cluster.synapse
            alice, bob = synapse.register("alice"), synapse.register("bob")
            rooms = rooms_of_each_writer(synapse, alice, bob, per_writer=1)

            def trickle() -> None:
                while not stop_traffic.wait(1.0):
                    for room in (rooms["master"][0], rooms["persister1"][0]):
                        try:
                            alice.send_message(room, "a Synapse in use")
                        except (MatrixError, OSError):
                            pass

            threading.Thread(target=trickle, daemon=True).start()
            print(f"(the newcomer's Synapse, not counted: started in {time.monotonic() - t0:.1f} s)", flush=True)

            def step(name: str, since: float) -> float:
                now = time.monotonic()
                steps.append((name, now - since))
                print(f"  {name}: {now - since:.1f} s", flush=True)
                return now

            start = t = time.monotonic()
            clone = workdir / "synapse_repl"
            subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
            t = step("git clone", t)
            password = "pw-" + os.urandom(6).hex()
            database_url = create_role_as_the_readme_says(cluster, readme_role_sql(readme), password)
            t = step("1. the read-only role (README's SQL)", t)
            redis_url = create_acl_user_as_the_readme_says(cluster, readme_acl_line(readme), password)
            t = step("2. the Redis user (README's ACL line)", t)
            web, replication = free_port(), free_port()
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("SYNAPSE_", "DATABASE_URL", "REDIS_URL", "STATE_DIR", "VIRTUAL_ENV"))}
            env.update({"SYNAPSE_DATABASE_URL": database_url, "SYNAPSE_REDIS_URL": redis_url,
                        "SYNAPSE_SERVER_NAME": SERVER_NAME, "DEMO": "0",
                        "WEB_LISTEN": f"127.0.0.1:{web}", "REPLICATION_LISTEN": f"127.0.0.1:{replication}"})
            service = subprocess.Popen(["make", "run"], cwd=clone, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, start_new_session=True)
            output = Output(service)
            installed = wait_for(lambda: output.first(r"manage\.py migrate"), "the install", service, output)[0]
            steps.append(("3a. make run: .venv and the runtime set (pip)", installed - t))
            print(f"  {steps[-1][0]}: {steps[-1][1]:.1f} s", flush=True)
            migrated = wait_for(lambda: output.first(r"manage\.py runservice"), "migrate", service, output)[0]
            steps.append(("3b. make run: migrate", migrated - installed))
            print(f"  {steps[-1][0]}: {steps[-1][1]:.1f} s", flush=True)
            base = f"http://127.0.0.1:{web}"
            wait_for(lambda: web_answers(base), "the web UI answering", service, output)
            t = step("3c. make run: runservice until the web UI answers", migrated)
            login = wait_for(lambda: output.first(r"sign in:\s+(\S+) / (\S+)"), "the sign-in line", service, output)[1]
            opener = signed_in(base, login.group(1), login.group(2))

            def streams_shown() -> dict | None:
                try:
                    shown = json.loads(opener.open(f"{base}/status.json", timeout=30).read())["synapse"]
                except (OSError, ValueError):
                    return None
                for o in shown:
                    events = next((s for s in o["streams"] if s["name"] == "events"), None)
                    if events and set(events.get("recorded") or {}) >= {"master", "persister1"}:
                        return o
                return None

            shown = wait_for(streams_shown, "/status.json showing Synapse's streams", service, output)
            t = step("4. signed in, until /status.json shows Synapse's streams", t)
            page = opener.open(f"{base}/", timeout=30).read().decode()
            if f"Synapse {SERVER_NAME}" not in page:
                raise SystemExit("the page has no section 'Synapse {SERVER_NAME}'")
            total = time.monotonic() - start
            print(f"/status.json: observer {shown['observer']}, sources {shown['sources']}, "
                  f"{len(shown['streams'])} streams: {', '.join(s['name'] for s in shown['streams'])}")
            print(f"total (git clone to Synapse's streams on /status.json and the page): {total:.1f} s "
                  f"({total / 60:.1f} min); load after {load_average()}")
    finally:
        stop_traffic.set()
        if service is not None and service.poll() is None:
            os.killpg(service.pid, signal.SIGTERM)
            try:
                service.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(service.pid, signal.SIGKILL)
                service.wait()
        if args.keep:
            print(f"clone kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
