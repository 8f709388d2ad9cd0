"""Migration 0017: the room, replication and job tables move from ``streams`` to their own
apps. A database at the layout before the move (``streams`` 0016, the new apps not yet
there), holding rows in every moved table -- events, state groups, job runs, user IPs among
them -- an admin log entry and a permission, migrates to the new layout with every row kept,
the content types following their models; and back. On PostgreSQL and SQLite."""
from __future__ import annotations

import datetime
import decimal

import pytest
from django.db import connections, models
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

#: the layout today's main had: streams up to 0016, the new apps absent
BEFORE = [("streams", "0016_jobrun_queued"), ("rooms", None), ("replication", None), ("jobs", None)]
MOVED_TO = {"rooms": ["event", "currentstatedelta", "room", "eventedge", "stategroup", "stategroupedge",
                      "stategroupstate", "packedstategroup", "eventtostategroup", "currentstateevent",
                      "roommembership", "redaction", "eventauth", "exoutlier", "rejection", "visibilityrange",
                      "forwardextremity", "backwardextremity", "eventauthchain", "eventauthchainlink",
                      "eventauthchaintocalculate"],
            "replication": ["userip"], "jobs": ["jobrun"]}
ROWS_PER_TABLE = 3


def _value(field: models.Field, n: int):
    """A value for ``field`` in row ``n``, distinct per row (unique keys hold)."""
    kind = field.get_internal_type()
    if kind in ("CharField", "TextField", "SlugField"):
        return f"{field.name}-{n}"[: field.max_length or None]
    if kind in ("IntegerField", "BigIntegerField", "SmallIntegerField", "PositiveIntegerField",
                "PositiveBigIntegerField", "AutoField", "BigAutoField"):
        return n + 1
    if kind == "BooleanField":
        return n % 2 == 1
    if kind == "JSONField":
        return {"n": n}
    if kind == "BinaryField":
        return f'{{"n": {n}}}'.encode()
    if kind == "DateTimeField":
        return datetime.datetime(2026, 1, 1, n, tzinfo=datetime.timezone.utc)
    if kind == "FloatField":
        return float(n)
    if kind == "DecimalField":
        return decimal.Decimal(n)
    raise AssertionError(f"no test value for {field.model.__name__}.{field.name} ({kind})")


def _fill(apps) -> dict[str, int]:
    """ROWS_PER_TABLE rows in every moved table, through the models as they were at BEFORE."""
    counts = {}
    for model_name in (m for names in MOVED_TO.values() for m in names):
        model = apps.get_model("streams", model_name)
        for n in range(ROWS_PER_TABLE):
            fields = {f.attname: _value(f, n) for f in model._meta.concrete_fields
                      if not (isinstance(f, models.AutoField))}
            model.objects.create(**fields)
        counts[model._meta.db_table] = ROWS_PER_TABLE
    return counts


def _counts(connection, tables) -> dict[str, int]:
    with connection.cursor() as cursor:
        out = {}
        for table in tables:
            cursor.execute(f"SELECT count(*) FROM {table}")
            out[table] = cursor.fetchone()[0]
        return out


def _migrate(connection, targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state([t for t in targets if t[1] is not None]).apps


def test_every_row_moves_with_its_model_and_back(default_database):
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.models import Permission, User
    from django.contrib.contenttypes.models import ContentType

    connection = connections["default"]
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    try:
        old_apps = _migrate(connection, BEFORE)
        ContentType.objects.clear_cache()
        event_type = ContentType.objects.get(app_label="streams", model="event")
        job_type = ContentType.objects.get(app_label="streams", model="jobrun")
        counts = _fill(old_apps)
        operator = User.objects.create(username="operator")
        operator.user_permissions.add(Permission.objects.get(content_type=job_type, codename="view_jobrun"))
        event_pk = old_apps.get_model("streams", "event").objects.order_by("pk").values_list("pk", flat=True)[0]
        LogEntry.objects.create(user=operator, content_type=event_type, object_id=str(event_pk), object_repr="$e",
                                action_flag=2, change_message="looked")

        _migrate(connection, latest)
        ContentType.objects.clear_cache()
        assert _counts(connection, counts) == counts  # every row kept
        from jobs.models import JobRun
        from replication.models import UserIp
        from rooms.models import Event, StateGroupState
        assert (Event.objects.count(), StateGroupState.objects.count(), JobRun.objects.count(),
                UserIp.objects.count()) == (ROWS_PER_TABLE,) * 4
        # the content types followed their models: same rows, the new app's label, no duplicates
        assert ContentType.objects.get_for_model(Event).pk == event_type.pk
        assert ContentType.objects.get_for_model(JobRun).pk == job_type.pk
        for app, names in MOVED_TO.items():
            for name in names:
                assert ContentType.objects.filter(model=name).values_list("app_label", flat=True).get() == app
        assert LogEntry.objects.get().get_edited_object() == Event.objects.get(pk=event_pk)
        assert User.objects.get(username="operator").has_perm("jobs.view_jobrun")

        _migrate(connection, BEFORE)  # and back: the rows stay, the content types return
        ContentType.objects.clear_cache()
        assert _counts(connection, counts) == counts
        assert ContentType.objects.get(pk=event_type.pk).app_label == "streams"
    finally:
        _migrate(connection, latest)
        ContentType.objects.clear_cache()
