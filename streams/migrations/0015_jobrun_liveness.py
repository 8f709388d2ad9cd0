from django.db import migrations, models


class Migration(migrations.Migration):
    """Where a run's process is, and when it last said it was alive: the liveness sweep's inputs."""

    dependencies = [("streams", "0014_stream_position_exited_at")]

    operations = [
        migrations.AddField("jobrun", "host", models.CharField(blank=True, default="", max_length=255,
                                                              verbose_name="host")),
        migrations.AddField("jobrun", "pid", models.IntegerField(blank=True, null=True, verbose_name="process id")),
        migrations.AddField("jobrun", "heartbeat_at", models.DateTimeField(blank=True, null=True,
                                                                          verbose_name="last heartbeat")),
    ]
