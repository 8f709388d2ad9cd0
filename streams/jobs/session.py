"""The process's SparkSession: master from ``SPARK_MASTER``, the PostgreSQL JDBC driver from
Debian's ``libpostgresql-jdbc-java`` on the class path, nothing fetched at run time.

On a cluster (any master but ``local[...]``) the executors run Python workers of their own,
which import the per-room functions by module name (``streams.jobs.topology``): the session
ships this checkout's ``streams`` and ``synapse_repl`` packages to them as a zip
(:func:`code_archive`, added with ``addPyFile``), names the Python they run
(``PYSPARK_PYTHON``) and puts the JDBC driver on their class path. See docs/jobs.md.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import sys
import threading
import zipfile
from pathlib import Path

from django.conf import settings

#: Debian's libpostgresql-jdbc-java installs the driver here (a symlink to the versioned jar).
JDBC_JAR_CANDIDATES = ("/usr/share/java/postgresql.jar",)

#: the project's packages the executors import (the jobs' functions live in ``streams.jobs``)
SHIPPED_PACKAGES = ("streams", "synapse_repl")
PROJECT_ROOT = Path(__file__).resolve().parents[2]

# py4j logs "closing" from finalizers at interpreter exit, after logging's streams are gone.
logging.getLogger("py4j").setLevel(logging.WARNING)

#: JVM options of the driver and the executors (``SPARK_JAVA_OPTIONS`` replaces them). The
#: JVM only glues the jobs' reads, joins and Arrow batches together, and every query brings
#: fresh generated classes: C2's compiler threads burnt more CPU compiling them than the
#: faster code gave back (docs/benchmarks.md, session 10), so the JIT stops at C1.
DEFAULT_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"

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
        builder = (
            SparkSession.builder.master(master)
            .appName(f"synapse_repl jobs ({settings.SYNAPSE_REPL['INSTANCE_NAME']})")
            # shipped to the executors by the driver; on their class path too (JDBC's
            # DriverManager looks there), at the path Debian installs it on every host
            .config("spark.jars", jar)
            .config("spark.driver.extraClassPath", jar)
            .config("spark.executor.extraClassPath", jar)
            .config("spark.pyspark.python", python)
            .config("spark.executorEnv.PYSPARK_PYTHON", python)
            # the dashboard links a running job to it; SPARK_UI_PORT=0 turns it off
            .config("spark.ui.enabled", "false" if os.environ.get("SPARK_UI_PORT") == "0" else "true")
            .config("spark.ui.port", os.environ.get("SPARK_UI_PORT") or "4040")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.local.dir", str(local_dir))
            .config("spark.sql.shuffle.partitions", os.environ.get("SPARK_SHUFFLE_PARTITIONS", "8"))
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.memory", os.environ.get("SPARK_DRIVER_MEMORY", "2g"))
        )
        java_options = os.environ.get("SPARK_JAVA_OPTIONS", DEFAULT_JAVA_OPTIONS).strip()
        if java_options:  # the driver's JVM (local executors live in it) and a cluster's executors
            builder = (builder.config("spark.driver.extraJavaOptions", java_options)
                       .config("spark.executor.extraJavaOptions", java_options))
        if os.environ.get("SPARK_EXECUTOR_MEMORY"):
            builder = builder.config("spark.executor.memory", os.environ["SPARK_EXECUTOR_MEMORY"])
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
