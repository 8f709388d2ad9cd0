from django.db import migrations, models

"""The jobs app takes over its tables from ``streams`` (streams 0017 lets them go): state only,
the tables stay as they are, with every row."""


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('streams', '0016_jobrun_queued'),
    ]

    operations = [migrations.SeparateDatabaseAndState(state_operations=[
        migrations.CreateModel(
            name='JobRun',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job', models.CharField(db_index=True, max_length=64, verbose_name='job')),
                ('parameters', models.JSONField(default=dict, verbose_name='parameters')),
                ('status', models.CharField(choices=[('queued', 'queued'), ('running', 'running'), ('succeeded', 'succeeded'), ('failed', 'failed'), ('refused', 'refused (already running)'), ('cancelled', 'cancelled')], default='running', max_length=16, verbose_name='status')),
                ('trigger', models.CharField(default='manual', max_length=64, verbose_name='started by')),
                ('started_at', models.DateTimeField(verbose_name='started at')),
                ('ended_at', models.DateTimeField(blank=True, null=True, verbose_name='ended at')),
                ('rows_in', models.BigIntegerField(blank=True, null=True, verbose_name='rows read')),
                ('rows_out', models.BigIntegerField(blank=True, null=True, verbose_name='rows written')),
                ('differences', models.BigIntegerField(blank=True, null=True, verbose_name='differences found')),
                ('difference_sample', models.JSONField(blank=True, default=list, verbose_name='first differences')),
                ('error', models.TextField(blank=True, default='', verbose_name='error')),
                ('progress', models.JSONField(blank=True, default=dict, verbose_name='progress')),
                ('cancel_requested', models.BooleanField(default=False, verbose_name='cancel requested')),
                ('spark_ui_url', models.CharField(blank=True, default='', max_length=255, verbose_name='Spark UI')),
                ('host', models.CharField(blank=True, default='', max_length=255, verbose_name='host')),
                ('pid', models.IntegerField(blank=True, null=True, verbose_name='process id')),
                ('heartbeat_at', models.DateTimeField(blank=True, null=True, verbose_name='last heartbeat')),
            ],
            options={
                'verbose_name': 'job run',
                'verbose_name_plural': 'job runs',
                'db_table': 'job_runs',
                'ordering': ['-started_at', '-id'],
            },
        ),
    ], database_operations=[])]
