"""Throwaway PostgreSQL and Redis servers on free loopback ports.

Used by the test fixtures and the benchmarks: each server lives in its own temporary
directory and is stopped and removed by :meth:`stop`. A missing binary raises
:class:`MissingBinary` naming the Debian package to install.
"""
from __future__ import annotations

import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field


class MissingBinary(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 30.0,
                   log: str | None = None) -> None:
    """Until ``proc`` listens on ``port``; if it exits first, the error ends with the last
    lines of its ``log`` (where a server says why it would not start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} during start-up{_log_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f} s")


def _log_tail(log: str | None, lines: int = 5) -> str:
    if log is None:
        return ""
    try:
        with open(log, errors="replace") as f:
            tail = [line.rstrip() for line in f.readlines()[-lines:] if line.strip()]
    except OSError:
        return ""
    return (": " + " | ".join(tail)) if tail else ""


def _find_pg_bin(name: str) -> str:
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    if candidates:
        return candidates[-1]
    found = shutil.which(name)
    if found:
        return found
    raise MissingBinary(f"{name} not found: install the Debian package 'postgresql' (apt-get install postgresql)")


@dataclass
class PostgresServer:
    """A PostgreSQL cluster made with ``initdb`` and run by ``postgres`` on a free port."""

    port: int = 0
    directory: str = ""
    fast: bool = True  # fsync off: for tests; benchmarks compare ratios within one server
    proc: subprocess.Popen | None = field(default=None, repr=False)
    user: str = "postgres"
    #: reuse ``directory`` if it holds a cluster, and keep it on stop (a benchmark's dataset)
    keep: bool = False
    #: more server settings (``-c name=value``), after and over the defaults above: a
    #: benchmark's tuned server (docs/storage.md, "PostgreSQL settings for a big store"); one
    #: the server refuses stops :meth:`start` with the server's own reason
    settings: dict[str, str] = field(default_factory=dict)

    def start(self) -> "PostgresServer":
        initdb, postgres = _find_pg_bin("initdb"), _find_pg_bin("postgres")
        if self.directory:
            os.makedirs(self.directory, exist_ok=True)
        else:
            self.directory = tempfile.mkdtemp(prefix="synapse_repl_pg_")
        self.port = free_port()
        run_as = self._run_as()
        data = os.path.join(self.directory, "data")
        if not os.path.exists(os.path.join(data, "PG_VERSION")):
            subprocess.run(
                [initdb, "-D", data, "-U", self.user, "-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=run_as,
            )
        options = ["-c", "listen_addresses=127.0.0.1", "-c", f"port={self.port}",
                   "-c", f"unix_socket_directories={self.directory}", "-c", "max_connections=300",
                   "-c", "shared_buffers=128MB"]
        if self.fast:
            options += ["-c", "fsync=off", "-c", "full_page_writes=off"]
        for name, value in self.settings.items():
            options += ["-c", f"{name}={value}"]
        log = os.path.join(self.directory, "postgres.log")
        def start_child() -> None:  # as the postgres user, then: a killed run leaves no server
            if run_as is not None:
                run_as()
            if from_main_thread:
                die_with_parent(signal.SIGQUIT)  # an immediate shutdown: no wait for clients

        from_main_thread = threading.current_thread() is threading.main_thread()

        self.proc = subprocess.Popen(
            [postgres, "-D", data, *options], stdout=subprocess.DEVNULL,
            stderr=open(log, "wb"), preexec_fn=start_child,
        )
        _wait_for_port(self.port, self.proc, "postgres", log=log)
        self._wait_ready()
        return self

    def _run_as(self):
        if os.geteuid() != 0:
            return None
        # PostgreSQL refuses to run as root: run it as the 'postgres' system user.
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise MissingBinary("no 'postgres' user: install the Debian package 'postgresql'") from None
        for root, _dirs, _files in os.walk(self.directory):
            os.chown(root, pw.pw_uid, pw.pw_gid)
        os.chmod(self.directory, 0o700)

        def demote() -> None:
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)

        return demote

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def url(self, dbname: str) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.directory and not self.keep:
            shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class RedisServer:
    """A ``redis-server`` with no persistence on a free port.

    ``password``: required of clients (``requirepass``). ``tls_cert``/``tls_key``: the port
    speaks TLS only (``rediss://``; clients verify against ``tls_cert``, self-signed).
    """

    port: int = 0
    directory: str = ""
    password: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self, port: int | None = None) -> "RedisServer":
        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
        )
        if binary is None:
            raise MissingBinary("redis-server not found: install the Debian package 'redis-server'")
        if not self.directory:
            self.directory = tempfile.mkdtemp(prefix="synapse_repl_redis_")
        self.port = port or self.port or free_port()
        options = ["--port", str(self.port)]
        if self.password:
            options += ["--requirepass", self.password]
        if self.tls_cert:
            options = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", self.tls_cert,
                       "--tls-key-file", self.tls_key, "--tls-ca-cert-file", self.tls_cert,
                       "--tls-auth-clients", "no", *options[2:]]
        self.proc = subprocess.Popen(
            [binary, *options, "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.directory],
            stdout=open(os.path.join(self.directory, "redis.log"), "ab"), stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent if threading.current_thread() is threading.main_thread() else None,
        )
        _wait_for_port(self.port, self.proc, "redis-server")
        return self

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls_cert:
            return f"rediss://{auth}localhost:{self.port}/0?ssl_ca_certs={self.tls_cert}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        """Stop the server abruptly (it can be started again on the same port)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        self.kill()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


# --- A standalone Spark cluster (master + one worker) -------------------------------------------


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In the child before exec: ``sig`` when the process that started it dies, so a killed
    test run leaves no server or JVM behind (Linux's PR_SET_PDEATHSIG; kept across exec,
    cleared by a change of user: set it after one). The kernel sends it when the *thread* that
    started the child ends: servers started from another thread (a fault injector restarting
    Redis) go without it. The C library is loaded beforehand, in the parent: a child that has
    become another user may not read Python's modules any more."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


#: JVM options of the master and the worker (before any ``SPARK_DAEMON_JAVA_OPTS`` of the
#: environment): they only route RPCs and launch executors, so C1's code serves them and the
#: serial collector's one thread their small heaps. Their start-up cost 22 CPU-s with C2 and
#: G1, 11 with these; idle, 0.4 CPU-s a minute, 0.2 with these.
DAEMON_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@dataclass
class SparkStandaloneCluster:
    """A standalone Spark master and one worker on loopback, run from pyspark's own
    distribution (``bin/spark-class``; pyspark ships no ``sbin/start-master.sh``).

    The jobs' tests and ``benchmarks/bench_jobs.py --cluster`` run against it as they would
    against ``spark://spark-master:7077``: executors are separate JVMs the worker launches,
    with their own Python workers, so nothing of the driver's process is shared with them.

    Like a production cluster (docs/jobs.md), it authenticates every connection
    (``spark.authenticate``) with :attr:`secret`, which the master and the worker read from a
    properties file of mode 0600 (never their command lines); a driver joins with
    ``SPARK_AUTH_SECRET`` set to it.
    """

    cores: int = 1
    memory: str = "1g"
    directory: str = ""
    port: int = 0
    webui_port: int = 0
    secret: str = ""
    master: subprocess.Popen | None = field(default=None, repr=False)
    worker: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @staticmethod
    def spark_home() -> str:
        try:
            import pyspark
        except ImportError as e:  # pragma: no cover - pinned in requirements.txt
            raise MissingBinary(f"pyspark is not installed ({e}): pip install -r requirements.txt") from e
        return os.path.dirname(pyspark.__file__)

    def start(self, timeout: float = 90.0) -> "SparkStandaloneCluster":
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise MissingBinary("java not found: install the Debian package openjdk-17-jre-headless")
        home = self.spark_home()
        if not self.directory:
            self.directory = tempfile.mkdtemp(prefix="synapse_repl_spark_")
        self.port, self.webui_port = free_port(), free_port()
        properties = self._auth_properties()
        env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_LOG_DIR": self.directory, "SPARK_WORKER_DIR": os.path.join(self.directory, "work"),
               "SPARK_DAEMON_JAVA_OPTS": f"{DAEMON_JAVA_OPTIONS} {os.environ.get('SPARK_DAEMON_JAVA_OPTS', '')}".strip()}
        env.pop("SPARK_CONF_DIR", None)
        spark_class = os.path.join(home, "bin", "spark-class")
        self.master = subprocess.Popen(
            ["bash", spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", str(self.webui_port), "--properties-file", properties],
            env=env, cwd=self.directory, stdout=open(os.path.join(self.directory, "master.log"), "ab"),
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
        )
        try:
            _wait_for_port(self.port, self.master, "spark master", timeout)
            self.worker = subprocess.Popen(
                ["bash", spark_class, "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                 "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port()),
                 "--work-dir", env["SPARK_WORKER_DIR"], "--properties-file", properties],
                env=env, cwd=self.directory, stdout=open(os.path.join(self.directory, "worker.log"), "ab"),
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
            )
            self._wait_worker_alive(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _auth_properties(self) -> str:
        """The master's and the worker's properties file: authentication on, the shared secret,
        and the master's REST submission port off (it would take drivers without any secret)."""
        import secrets

        self.secret = self.secret or secrets.token_urlsafe(32)
        path = os.path.join(self.directory, "spark-auth.properties")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"spark.authenticate true\nspark.authenticate.secret {self.secret}\n"
                    "spark.master.rest.enabled false\n")
        return path

    def master_state(self) -> dict:
        """What the master reports on its web UI's JSON: workers, applications, cores."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=2) as answer:
            return json.load(answer)

    def alive_workers(self) -> int:
        return sum(1 for w in self.master_state().get("workers", []) if w.get("state") == "ALIVE")

    def applications(self) -> list[str]:
        """Names of the applications (drivers) that ran or run on the cluster."""
        state = self.master_state()
        return [app["name"] for app in (*state.get("activeapps", []), *state.get("completedapps", []))]

    def _wait_worker_alive(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in (("master", self.master), ("worker", self.worker)):
                if proc.poll() is not None:
                    raise RuntimeError(f"spark {name} exited with status {proc.returncode} during start-up:\n"
                                       + self.log_tail(name))
            try:
                if self.alive_workers() >= 1:
                    return
            except (OSError, ValueError):  # not listening yet, or its web UI not serving JSON yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no spark worker registered within {timeout:.0f} s:\n" + self.log_tail("worker"))
            time.sleep(0.2)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        try:
            with open(os.path.join(self.directory, f"{name}.log"), errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        for proc in (self.worker, self.master):  # the worker first: it kills its executors
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


#: What the class archive's JVM runs before it exits: the classes a job's driver loads (a
#: session, Arrow batches both ways, a shuffle, ``applyInPandas`` and ``mapInPandas``).
_ARCHIVE_WORKLOAD = """
import pandas as pd
from jobs.session import spark_session, stop_spark
spark = spark_session("local[1]")
df = spark.createDataFrame(pd.DataFrame({"room_id": ["!a", "!b", "!a"], "n": [1, 2, 3]}))
grouped = df.groupBy("room_id").applyInPandas(lambda g: g.assign(n=g.n.sum()), schema=df.schema)
mapped = grouped.mapInPandas(lambda batches: batches, schema=df.schema)
mapped.join(df.withColumnRenamed("n", "m"), "room_id").orderBy("room_id").toPandas()
stop_spark()
"""

#: JVM options that use a class archive and stay silent when it does not fit a JVM (a
#: cluster executor's class path differs from the driver's: that JVM loads its classes as usual)
_USE_ARCHIVE = "-XX:SharedArchiveFile={} -Xlog:cds=off -Xlog:cds+dynamic=off"


def spark_class_archive(directory: str | None = None, timeout: float = 600.0) -> str | None:
    """The JVM options (for ``SPARK_JAVA_OPTIONS``) that start a job's driver from a class-data
    sharing archive of the classes Spark loads, made here once per JDK, pyspark and JDBC
    driver (``None`` where it cannot be made: the JVMs then start as usual). It is kept in
    ``directory``, by default ``$XDG_CACHE_HOME/synapse_repl`` (``~/.cache/synapse_repl``),
    of mode 0700: a JVM runs the class bytes of its archive, so it is never one in a shared
    directory such as /tmp, nor one another user owns.

    A driver's JVM loads and verifies some twenty thousand classes of Spark's jars before its
    first job ends; mapped from the archive instead, a cold ``run_job`` costs about a third less
    CPU (14 -> 7 s for the session, 26 -> 18 s more for its first check, in the suite's tests)."""
    import hashlib
    import sys

    from jobs.session import DEFAULT_JAVA_OPTIONS, PROJECT_ROOT, jdbc_jar

    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60).stderr
        pyspark_home = os.path.realpath(SparkStandaloneCluster.spark_home())
        jar = os.path.realpath(jdbc_jar())
    except Exception:  # no java, no pyspark, no JDBC driver: the spark fixture says which
        return None
    jars = sorted(os.listdir(os.path.join(pyspark_home, "jars")))
    key = hashlib.sha256("\n".join([java, pyspark_home, jar, *jars]).encode()).hexdigest()[:16]
    if directory is None:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(cache, "synapse_repl")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.stat(directory)
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        return None  # writable by others: what it holds could be anyone's
    archive = os.path.join(directory, f"synapse_repl-spark-classes-{key}.jsa")
    if os.path.exists(archive) and os.stat(archive).st_uid != os.getuid():
        return None
    if not os.path.exists(archive):
        partial = f"{archive}.{os.getpid()}.part"
        with tempfile.TemporaryDirectory(prefix="synapse_repl_cds_") as state:
            env = {**os.environ, "STATE_DIR": state, "DJANGO_SETTINGS_MODULE": "synapse_repl.settings",
                   "SPARK_UI_PORT": "0", "SPARK_JAVA_OPTIONS": f"{DEFAULT_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={partial}",
                   "PYTHONPATH": str(PROJECT_ROOT)}
            code = "import django; django.setup()\n" + _ARCHIVE_WORKLOAD
            try:
                done = subprocess.run([sys.executable, "-c", code], cwd=state, env=env, capture_output=True,
                                      timeout=timeout, start_new_session=True)
            except subprocess.TimeoutExpired:
                done = None
        if done is None or done.returncode != 0 or not os.path.exists(partial):
            if os.path.exists(partial):
                os.remove(partial)
            return None
        for old in glob.glob(os.path.join(directory, "synapse_repl-spark-classes-*.jsa")):
            if old != archive:  # another JDK's or pyspark's
                os.remove(old)
        os.replace(partial, archive)
    return f"{DEFAULT_JAVA_OPTIONS} {_USE_ARCHIVE.format(archive)}"
