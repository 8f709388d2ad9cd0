"""What the session gives executors on a cluster: the project's code, their Python, the JDBC jar."""
from __future__ import annotations

import os
import zipfile

from streams.jobs.session import SHIPPED_PACKAGES, code_archive, is_local, jdbc_jar


def test_code_archive_holds_the_packages_and_is_named_by_content(tmp_path):
    first = code_archive(tmp_path)
    names = zipfile.ZipFile(first).namelist()
    assert "streams/jobs/topology.py" in names and "streams/__init__.py" in names
    assert "synapse_repl/settings.py" in names
    assert {n.split("/")[0] for n in names} == set(SHIPPED_PACKAGES)
    assert all(n.endswith(".py") and "__pycache__" not in n for n in names)
    assert code_archive(tmp_path) == first  # same code, same file
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no partial file left


def test_which_masters_are_local():
    assert is_local("local") and is_local("local[2]") and is_local("local[*]")
    assert not is_local("spark://127.0.0.1:7077") and not is_local("localhost:7077")


def test_session_puts_the_jar_and_python_where_executors_find_them(spark):
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.executor.extraClassPath") == jdbc_jar() == conf.get("spark.driver.extraClassPath")
    assert conf.get("spark.pyspark.python") == os.environ["PYSPARK_PYTHON"]
    assert conf.get("spark.executorEnv.PYSPARK_PYTHON") == os.environ["PYSPARK_PYTHON"]


def test_the_java_options_reach_the_drivers_jvm(spark):
    # the driver's JVM is started by the session's builder: its options must be on its command
    # line, not only in the conf (local executors run in it)
    from streams.jobs.session import DEFAULT_JAVA_OPTIONS

    expected = os.environ.get("SPARK_JAVA_OPTIONS", DEFAULT_JAVA_OPTIONS).split()
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.executor.extraJavaOptions") == conf.get("spark.driver.extraJavaOptions")
    running = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert expected and all(option in running for option in expected), running
