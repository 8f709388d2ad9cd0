
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('streams', '0013_room_late_stream'),
    ]

    operations = [
        migrations.AddField(
            model_name='streamposition',
            name='exited_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='exited cleanly at'),
        ),
    ]
