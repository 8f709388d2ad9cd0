"""``state_groups_packed``, a packed copy of each big state group's rows
(``PackedStateGroup``), so a cold read of a big room's state is one row.

On PostgreSQL the strings are compressed with lz4 (its decompression is several times
pglz's, and a packed state is read whole), and the groups already stored with at least
10,000 rows (``state_groups.PACKED_MIN_ROWS`` when this was written) are packed from their
rows, unless a key or ID holds the separator. SQLite keeps the table empty: its reads are
in-process and take the rows.
"""
from __future__ import annotations

from django.db import migrations, models

PACK_EXISTING = """
INSERT INTO state_groups_packed (state_group, members_count, members, others_count, others)
SELECT state_group,
       count(*) FILTER (WHERE type = 'm.room.member'),
       string_agg(state_key || E'\\x1f' || event_id, E'\\x1f') FILTER (WHERE type = 'm.room.member'),
       count(*) FILTER (WHERE type <> 'm.room.member'),
       string_agg(type || E'\\x1f' || state_key || E'\\x1f' || event_id, E'\\x1f') FILTER (WHERE type <> 'm.room.member')
FROM state_groups_state
WHERE state_group IN (SELECT state_group FROM state_groups_state GROUP BY state_group HAVING count(*) >= 10000)
GROUP BY state_group
HAVING bool_and(strpos(type || state_key || event_id, E'\\x1f') = 0)
"""


def pack_existing(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("ALTER TABLE state_groups_packed ALTER COLUMN members SET COMPRESSION lz4, "
                          "ALTER COLUMN others SET COMPRESSION lz4")
    schema_editor.execute(PACK_EXISTING)


class Migration(migrations.Migration):

    dependencies = [
        ('streams', '0011_natural_keys'),
    ]

    operations = [
        migrations.CreateModel(
            name='PackedStateGroup',
            fields=[
                ('state_group', models.BigIntegerField(primary_key=True, serialize=False)),
                ('members_count', models.IntegerField()),
                ('members', models.TextField(null=True)),
                ('others_count', models.IntegerField()),
                ('others', models.TextField(null=True)),
            ],
            options={
                'db_table': 'state_groups_packed',
            },
        ),
        migrations.RunPython(pack_existing, migrations.RunPython.noop),
    ]
