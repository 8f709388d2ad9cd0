from django.db import migrations, models

"""The replication app takes over its tables from ``streams`` (streams 0017 lets them go): state only,
the tables stay as they are, with every row."""


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('streams', '0016_jobrun_queued'),
    ]

    operations = [migrations.SeparateDatabaseAndState(state_operations=[
        migrations.CreateModel(
            name='UserIp',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('user_id', models.CharField(max_length=255, verbose_name='user ID')),
                ('access_token', models.CharField(max_length=512, verbose_name='access token')),
                ('ip', models.CharField(max_length=64, verbose_name='IP address')),
                ('user_agent', models.CharField(max_length=512, verbose_name='user agent')),
                ('device_id', models.CharField(blank=True, max_length=255, null=True, verbose_name='device ID')),
                ('last_seen', models.BigIntegerField(verbose_name='last seen (ms)')),
            ],
            options={
                'verbose_name': 'user IP',
                'verbose_name_plural': 'user IPs',
                'db_table': 'user_ips',
                'indexes': [models.Index(fields=['user_id', 'last_seen'], name='user_ips_user_last_seen'), models.Index(fields=['last_seen'], name='user_ips_last_seen')],
                'constraints': [models.UniqueConstraint(fields=('user_id', 'access_token', 'ip'), name='user_ips_user_token_ip_unique')],
            },
        ),
    ], database_operations=[])]
