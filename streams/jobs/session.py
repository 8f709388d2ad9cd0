"""The process's SparkSession: master from ``SPARK_MASTER``, the PostgreSQL JDBC driver from
Debian's ``libpostgresql-jdbc-java`` on the class path, nothing fetched at run time."""
from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path

from django.conf import settings

#: Debian's libpostgresql-jdbc-java installs the driver here (a symlink to the versioned jar).
JDBC_JAR_CANDIDATES = ("/usr/share/java/postgresql.jar",)

# py4j logs "closing" from finalizers at interpreter exit, after logging's streams are gone.
logging.getLogger("py4j").setLevel(logging.WARNING)

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
        local_dir = Path(settings.STATE_DIR) / "spark"
        local_dir.mkdir(parents=True, exist_ok=True)
        builder = (
            SparkSession.builder.master(master)
            .appName(f"synapse_repl jobs ({settings.SYNAPSE_REPL['INSTANCE_NAME']})")
            .config("spark.jars", jdbc_jar())
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.local.dir", str(local_dir))
            .config("spark.sql.shuffle.partitions", os.environ.get("SPARK_SHUFFLE_PARTITIONS", "8"))
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.memory", os.environ.get("SPARK_DRIVER_MEMORY", "2g"))
        )
        _session = builder.getOrCreate()
        _session.sparkContext.setLogLevel("WARN")
        return _session


def stop_spark() -> None:
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
