"""``rooms.late_stream``, the highest stream ordering of an event stored behind an
earlier one (lower in (topological, stream) than an event before it in the stream), so that
an incremental sync from a later token skips the ``*shared`` walks and bounds each range's
walk by stream ordering (docs/storage.md, "Reads").

The rooms already stored get it from their events: an event is behind an earlier one when
its topological ordering is below the highest of the events before it in the stream (equal
orderings are ordered by the stream). Outliers and rejected events are never read, so they
are left out, as the persist path leaves them out.
"""
from __future__ import annotations

from django.db import migrations, models

#: per room, the highest stream ordering of an event below one before it in the stream
LATE_EVENTS = """
SELECT room_id, max(stream_ordering) AS late FROM (
    SELECT room_id, stream_ordering, topological_ordering,
           max(topological_ordering) OVER (PARTITION BY room_id ORDER BY stream_ordering
                                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
    FROM events WHERE NOT outlier AND NOT rejected) x
WHERE topological_ordering < before
GROUP BY room_id
"""
MARK_EXISTING = f"UPDATE rooms SET late_stream = l.late FROM ({LATE_EVENTS}) l WHERE rooms.room_id = l.room_id"


def mark_existing(apps, schema_editor) -> None:
    schema_editor.execute(MARK_EXISTING)


class Migration(migrations.Migration):

    dependencies = [
        ('streams', '0012_packed_state_groups'),
    ]

    operations = [
        migrations.AddField(
            model_name='room',
            name='late_stream',
            field=models.BigIntegerField(null=True, verbose_name='last out-of-order stream ordering'),
        ),
        migrations.RunPython(mark_existing, migrations.RunPython.noop),
    ]
