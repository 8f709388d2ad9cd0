"""The process's SparkSession: master from ``SPARK_MASTER``, the PostgreSQL JDBC driver from
Debian's ``libpostgresql-jdbc-java`` on the class path, nothing fetched at run time.

On a cluster (any master but ``local[...]``) the executors run Python workers of their own,
which import the per-room functions by module name (``jobs.topology``): the session
ships this checkout's ``streams`` and ``synapse_repl`` packages to them as a zip
(:func:`code_archive`, added with ``addPyFile``), names the Python they run
(``PYSPARK_PYTHON``) and puts the JDBC driver on their class path. See docs/jobs.md.

What the driver listens on (:func:`network_conf`): its RPC and block manager on
``SPARK_LOCAL_IP`` (default loopback), its UI on ``SPARK_UI_HOST`` (default loopback) with
kill, thread dumps and heap histograms off; on a cluster, every connection authenticated with
the cluster's shared secret (:func:`auth_secret`), which never appears on a command line.
docs/jobs.md, "What a job listens on".
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import signal
import sys
import threading
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping
from urllib.parse import urlsplit

from django.conf import settings

from common.secret import load_or_create_secret_key

#: Debian's libpostgresql-jdbc-java installs the driver here (a symlink to the versioned jar).
JDBC_JAR_CANDIDATES = ("/usr/share/java/postgresql.jar",)

#: the project's packages the executors import (the jobs' functions live in ``jobs``)
SHIPPED_PACKAGES = ("common", "streams", "rooms", "jobs", "synapse_repl")
PROJECT_ROOT = Path(__file__).resolve().parents[1]

# py4j logs "closing" from finalizers at interpreter exit, after logging's streams are gone.
logging.getLogger("py4j").setLevel(logging.WARNING)

#: JVM options of the driver and the executors (``SPARK_JAVA_OPTIONS`` replaces them). The
#: JVM only glues the jobs' reads, joins and Arrow batches together, and every query brings
#: fresh generated classes: C2's compiler threads burnt more CPU compiling them than the
#: faster code gave back (docs/benchmarks.md), so the JIT stops at C1.
DEFAULT_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"

#: where the driver listens unless the operator names another address: this host only
LOOPBACK = "127.0.0.1"
#: the file in ``STATE_DIR`` holding the cluster's shared secret when ``SPARK_AUTH_SECRET`` is unset
AUTH_SECRET_FILE = "spark_auth_secret"
#: the setting Spark reads the shared secret from; set over py4j only (:func:`spark_session`)
AUTH_SECRET_SETTING = "spark.authenticate.secret"

_lock = threading.Lock()
_session = None


class SparkUnavailable(RuntimeError):
    """A part Spark needs is missing; the message names the Debian package."""


def jdbc_jar() -> str:
    override = os.environ.get("POSTGRESQL_JDBC_JAR")
    for path in ((override,) if override else JDBC_JAR_CANDIDATES):
        if path and Path(path).is_file():
            return path
    raise SparkUnavailable(
        "PostgreSQL JDBC driver not found at "
        f"{override or JDBC_JAR_CANDIDATES[0]}: install the Debian package libpostgresql-jdbc-java "
        "(or set POSTGRESQL_JDBC_JAR)"
    )


def is_local(master: str) -> bool:
    """``local``, ``local[4]``, ``local[*, 2]``...: executors inside the driver's JVM, whose
    Python workers start in the driver's directory and so import the checkout as it is."""
    return master == "local" or master.startswith("local[")


def network_conf(master: str, env: Mapping[str, str]) -> dict[str, str]:
    """The driver's listening settings, from the operator's environment ``env``.

    RPC and block manager bind to and advertise ``SPARK_LOCAL_IP`` (default loopback: a
    cluster's executors connect back to the driver, so there the operator names an address
    they reach). The UI (``SPARK_UI_PORT``, default 4040, ``0`` off) serves no kill buttons,
    thread dumps or heap histograms; where it binds is the JVM's environment's business
    (:func:`jvm_environment`). On a cluster every connection is authenticated
    (``spark.authenticate``; the secret is set apart, :func:`auth_secret`)."""
    host = env.get("SPARK_LOCAL_IP") or LOOPBACK
    ui_port = env.get("SPARK_UI_PORT") or "4040"
    conf = {
        "spark.driver.host": host,
        "spark.driver.bindAddress": host,
        "spark.ui.enabled": "false" if ui_port == "0" else "true",
        "spark.ui.port": ui_port,
        "spark.ui.killEnabled": "false",
        "spark.ui.threadDumpsEnabled": "false",
        "spark.ui.heapHistogramEnabled": "false",
        # said either way: a JVM keeps the settings it was started with as defaults for a
        # later session, and a local one with it on would keep its own secret for good
        "spark.authenticate": "false" if is_local(master) else "true",
    }
    return conf


def jvm_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What the driver's JVM is started with over this process's environment. Spark binds its
    UI to the JVM's ``SPARK_LOCAL_IP`` (0.0.0.0 if unset) and to nothing else it offers; with
    the driver's host and bind address set (:func:`network_conf`), nothing else reads it."""
    return {"SPARK_LOCAL_IP": env.get("SPARK_UI_HOST") or LOOPBACK}


def ui_url(web_url: str | None, env: Mapping[str, str]) -> str:
    """The UI's address as an operator opens it: Spark names it after the driver's host, but it
    listens on ``SPARK_UI_HOST`` (kept as Spark's if that is a wildcard)."""
    if not web_url:
        return ""
    host = env.get("SPARK_UI_HOST") or LOOPBACK
    if host in ("0.0.0.0", "::"):
        return web_url
    parts = urlsplit(web_url)
    shown = f"[{host}]" if ":" in host else host
    return parts._replace(netloc=f"{shown}:{parts.port}").geturl()


def auth_secret(master: str, env: Mapping[str, str], state_dir: Path) -> str | None:
    """The secret a cluster's master, workers and drivers share: ``SPARK_AUTH_SECRET``, else
    ``STATE_DIR/spark_auth_secret`` (made once, mode 0600). None on ``local[...]``, where no
    other process takes part."""
    if is_local(master):
        return None
    return env.get("SPARK_AUTH_SECRET") or load_or_create_secret_key(state_dir / AUTH_SECRET_FILE)


@contextmanager
def _environment(overrides: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``overrides`` while a JVM is started (pyspark passes the JVM this
    process's environment, and takes no other)."""
    saved = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def launch_jvm(conf):
    """pyspark's gateway JVM, in a session of its own: a terminal's Ctrl-C (SIGINT to the
    foreground process group) would otherwise reach the Python workers it starts, which die of
    it mid-task. It still ends with this process: it exits when its stdin, a pipe from this
    process, closes."""
    from pyspark.java_gateway import launch_gateway

    return launch_gateway(conf, popen_kwargs={"start_new_session": True})


@contextmanager
def _keeping_sigint() -> Iterator[None]:
    """Spark's start without its Ctrl-C behaviour: pyspark's SIGINT handler cancels every job of
    the context and raises inside a py4j call (a broken connection, pages of Py4J and Java
    errors); the process's own handler (``run_job``'s) stays. Its JVM starts in a session of
    its own (:func:`launch_jvm`), so a terminal's Ctrl-C reaches neither it nor its Python
    workers: the process decides what an interrupt does."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def code_archive(directory: Path) -> Path:
    """A zip of :data:`SHIPPED_PACKAGES` (their ``.py`` files) in ``directory``, named by its
    content's hash: the same code gives the same file (written once, atomically, whichever
    process of a shared state directory gets there first); changed code, a new name."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in SHIPPED_PACKAGES:
            for path in sorted((PROJECT_ROOT / package).rglob("*.py")):
                if "__pycache__" in path.parts:
                    continue
                info = zipfile.ZipInfo(str(path.relative_to(PROJECT_ROOT)), date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, path.read_bytes())
    data = buffer.getvalue()
    target = directory / f"synapse_repl-code-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not target.exists():
        directory.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.part")
        partial.write_bytes(data)
        os.replace(partial, target)
    return target


def spark_session(master: str | None = None):
    """The shared SparkSession (created on first use, reused by every job of this process)."""
    global _session
    with _lock:
        if _session is not None and _session.sparkContext._jsc is not None:
            return _session
        try:
            from pyspark import SparkConf, SparkContext
            from pyspark.sql import SparkSession
        except ImportError as e:  # pragma: no cover - pyspark is pinned in requirements.txt
            raise SparkUnavailable(f"pyspark is not installed: {e}") from e
        master = master or settings.SYNAPSE_REPL["SPARK_MASTER"]
        # Spark's Python workers must be this interpreter (the venv with pandas and pyarrow);
        # on a cluster, PYSPARK_PYTHON names the same venv on every executor host.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        python = os.environ["PYSPARK_PYTHON"]
        jar = jdbc_jar()
        local_dir = Path(settings.STATE_DIR) / "spark"
        local_dir.mkdir(parents=True, exist_ok=True)
        conf = {
            "spark.master": master,
            "spark.app.name": f"synapse_repl jobs ({settings.SYNAPSE_REPL['INSTANCE_NAME']})",
            # shipped to the executors by the driver; on their class path too (JDBC's
            # DriverManager looks there), at the path Debian installs it on every host
            "spark.jars": jar,
            "spark.driver.extraClassPath": jar,
            "spark.executor.extraClassPath": jar,
            "spark.pyspark.python": python,
            "spark.executorEnv.PYSPARK_PYTHON": python,
            **network_conf(master, os.environ),
            "spark.ui.showConsoleProgress": "false",
            "spark.local.dir": str(local_dir),
            "spark.sql.shuffle.partitions": os.environ.get("SPARK_SHUFFLE_PARTITIONS", "8"),
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.memory": os.environ.get("SPARK_DRIVER_MEMORY", "2g"),
        }
        java_options = os.environ.get("SPARK_JAVA_OPTIONS", DEFAULT_JAVA_OPTIONS).strip()
        if java_options:  # the driver's JVM (local executors live in it) and a cluster's executors
            conf["spark.driver.extraJavaOptions"] = conf["spark.executor.extraJavaOptions"] = java_options
        if os.environ.get("SPARK_EXECUTOR_MEMORY"):
            conf["spark.executor.memory"] = os.environ["SPARK_EXECUTOR_MEMORY"]
        # The JVM starts with what goes on spark-submit's command line, which every user of the
        # host can read (/proc/PID/cmdline): everything but the secret, which reaches the
        # JVM's configuration over py4j's authenticated loopback connection below.
        with _environment(jvm_environment(os.environ)), _keeping_sigint():
            jvm_conf = SparkConf(loadDefaults=False).setAll(list(conf.items()))
            SparkContext._ensure_initialized(conf=jvm_conf, gateway=None if SparkContext._gateway else launch_jvm(jvm_conf))
        secret = auth_secret(master, os.environ, Path(settings.STATE_DIR))
        if secret is not None:
            conf[AUTH_SECRET_SETTING] = secret
        builder = SparkSession.builder
        for key, value in conf.items():
            builder = builder.config(key, value)
        with _keeping_sigint():
            session = builder.getOrCreate()
        session.sparkContext.setLogLevel("WARN")
        if not is_local(master):
            session.sparkContext.addPyFile(str(code_archive(local_dir)))
        _session = session
        return _session


def stop_spark() -> None:
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
