"""What the session gives executors on a cluster: the project's code, their Python, the JDBC jar."""
from __future__ import annotations

import os
import zipfile

from jobs.session import (
    AUTH_SECRET_FILE,
    SHIPPED_PACKAGES,
    auth_secret,
    code_archive,
    is_local,
    jdbc_jar,
    jvm_environment,
    network_conf,
    ui_url,
)

CLUSTER = "spark://10.0.0.9:7077"


def test_code_archive_holds_the_packages_and_is_named_by_content(tmp_path):
    first = code_archive(tmp_path)
    names = zipfile.ZipFile(first).namelist()
    assert "jobs/topology.py" in names and "streams/__init__.py" in names
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
    from jobs.session import DEFAULT_JAVA_OPTIONS

    expected = os.environ.get("SPARK_JAVA_OPTIONS", DEFAULT_JAVA_OPTIONS).split()
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.executor.extraJavaOptions") == conf.get("spark.driver.extraJavaOptions")
    running = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert expected and all(option in running for option in expected), running


def test_the_driver_listens_on_loopback_unless_told_otherwise():
    conf = network_conf("local[*]", {})
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert jvm_environment({}) == {"SPARK_LOCAL_IP": "127.0.0.1"}  # where Spark binds its UI
    assert (conf["spark.ui.enabled"], conf["spark.ui.port"]) == ("true", "4040")
    assert conf["spark.ui.killEnabled"] == conf["spark.ui.threadDumpsEnabled"] == "false"
    assert conf["spark.ui.heapHistogramEnabled"] == "false"
    assert conf["spark.authenticate"] == "false"  # local: no other process takes part
    # a cluster's executors connect back to the address the operator names; the UI stays put
    told = {"SPARK_LOCAL_IP": "10.0.0.5", "SPARK_UI_PORT": "0"}
    conf = network_conf(CLUSTER, told)
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "10.0.0.5"
    assert conf["spark.ui.enabled"] == "false" and conf["spark.authenticate"] == "true"
    assert jvm_environment(told) == {"SPARK_LOCAL_IP": "127.0.0.1"}
    assert jvm_environment({"SPARK_UI_HOST": "10.0.0.5"}) == {"SPARK_LOCAL_IP": "10.0.0.5"}


def test_the_ui_link_names_the_address_the_ui_listens_on():
    assert ui_url("http://10.0.0.5:4041", {}) == "http://127.0.0.1:4041"
    assert ui_url("http://10.0.0.5:4041", {"SPARK_UI_HOST": "::1"}) == "http://[::1]:4041"
    assert ui_url("http://10.0.0.5:4041", {"SPARK_UI_HOST": "0.0.0.0"}) == "http://10.0.0.5:4041"
    assert ui_url(None, {}) == "" and ui_url("", {}) == ""


def test_the_cluster_secret_is_the_environments_or_made_once_private(tmp_path):
    assert auth_secret("local[2]", {}, tmp_path) is None
    assert auth_secret(CLUSTER, {"SPARK_AUTH_SECRET": "s3cret"}, tmp_path) == "s3cret"
    assert not (tmp_path / AUTH_SECRET_FILE).exists()
    made = auth_secret(CLUSTER, {}, tmp_path)
    assert made and len(made) >= 40 and auth_secret(CLUSTER, {}, tmp_path) == made
    assert (tmp_path / AUTH_SECRET_FILE).stat().st_mode & 0o777 == 0o600
