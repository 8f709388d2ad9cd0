from django.db import migrations, models

"""The rooms app takes over its tables from ``streams`` (streams 0017 lets them go): state only,
the tables stay as they are, with every row."""


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('streams', '0016_jobrun_queued'),
    ]

    operations = [migrations.SeparateDatabaseAndState(state_operations=[
        migrations.CreateModel(
            name='EventToStateGroup',
            fields=[
                ('event_id', models.CharField(max_length=255, primary_key=True, serialize=False)),
                ('state_group', models.BigIntegerField()),
            ],
            options={
                'db_table': 'event_to_state_groups',
            },
        ),
        migrations.CreateModel(
            name='ExOutlier',
            fields=[
                ('event_stream_ordering', models.BigIntegerField(primary_key=True, serialize=False, verbose_name='stream position')),
                ('event_id', models.CharField(max_length=255, verbose_name='event ID')),
                ('state_group', models.BigIntegerField(verbose_name='state group')),
                ('instance_name', models.CharField(max_length=255, verbose_name='writer')),
            ],
            options={
                'db_table': 'ex_outlier_stream',
            },
        ),
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
        migrations.CreateModel(
            name='Room',
            fields=[
                ('room_id', models.CharField(max_length=255, primary_key=True, serialize=False, verbose_name='room ID')),
                ('head_topological', models.BigIntegerField(default=0, verbose_name='head topological ordering')),
                ('head_stream', models.BigIntegerField(default=0, verbose_name='head stream ordering')),
                ('last_stream', models.BigIntegerField(db_index=True, default=0, verbose_name='last live stream ordering')),
                ('current_state_group', models.BigIntegerField(null=True, verbose_name='current state group')),
                ('min_depth', models.BigIntegerField(null=True, verbose_name='minimum depth')),
                ('room_version', models.CharField(max_length=64, null=True, verbose_name='room version')),
                ('late_stream', models.BigIntegerField(null=True, verbose_name='last out-of-order stream ordering')),
                ('authorized', models.BooleanField(default=False, verbose_name='events are authorized')),
            ],
            options={
                'verbose_name': 'room',
                'verbose_name_plural': 'rooms',
                'db_table': 'rooms',
            },
        ),
        migrations.CreateModel(
            name='BackwardExtremity',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event_id', models.CharField(max_length=255, verbose_name='event ID')),
                ('room_id', models.CharField(max_length=255, verbose_name='room ID')),
            ],
            options={
                'db_table': 'event_backward_extremities',
                'indexes': [models.Index(fields=['room_id'], name='event_bwd_ext_room')],
                'constraints': [models.UniqueConstraint(fields=('event_id', 'room_id'), name='event_bwd_ext_event_room')],
            },
        ),
        migrations.CreateModel(
            name='CurrentStateDelta',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('instance_name', models.CharField(max_length=255, verbose_name='writer')),
                ('stream_id', models.BigIntegerField(verbose_name='stream ID')),
                ('room_id', models.CharField(max_length=255, verbose_name='room ID')),
                ('type', models.CharField(max_length=255, verbose_name='type')),
                ('state_key', models.CharField(max_length=255, verbose_name='state key')),
                ('event_id', models.CharField(max_length=255, null=True, verbose_name='event ID (null: state removed)')),
                ('prev_event_id', models.CharField(max_length=255, null=True, verbose_name='previous event ID')),
            ],
            options={
                'verbose_name': 'current state delta',
                'verbose_name_plural': 'current state deltas',
                'db_table': 'current_state_delta_stream',
                'indexes': [models.Index(fields=['stream_id'], name='state_delta_stream_id'), models.Index(fields=['instance_name', 'stream_id'], name='state_delta_writer_id'), models.Index(fields=['room_id'], name='state_delta_room_id')],
            },
        ),
        migrations.CreateModel(
            name='CurrentStateEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('room_id', models.CharField(max_length=255)),
                ('type', models.CharField(max_length=255)),
                ('state_key', models.CharField(max_length=255)),
                ('event_id', models.CharField(max_length=255)),
                ('membership', models.CharField(max_length=32, null=True)),
                ('event_stream_ordering', models.BigIntegerField()),
            ],
            options={
                'db_table': 'current_state_events',
                'indexes': [models.Index(condition=models.Q(('type', 'm.room.member')), fields=['state_key', 'membership'], name='current_state_members_user')],
                'constraints': [models.UniqueConstraint(fields=('room_id', 'type', 'state_key'), name='current_state_events_room_type_key')],
            },
        ),
        migrations.CreateModel(
            name='Event',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('instance_name', models.CharField(max_length=255, verbose_name='writer')),
                ('stream_ordering', models.BigIntegerField(unique=True, verbose_name='stream ordering')),
                ('topological_ordering', models.BigIntegerField(default=0, verbose_name='topological ordering')),
                ('depth', models.BigIntegerField(default=0, verbose_name='depth')),
                ('event_id', models.CharField(max_length=255, verbose_name='event ID')),
                ('room_id', models.CharField(max_length=255, verbose_name='room ID')),
                ('type', models.CharField(max_length=255, verbose_name='type')),
                ('state_key', models.CharField(blank=True, max_length=255, null=True, verbose_name='state key')),
                ('sender', models.CharField(max_length=255, verbose_name='sender')),
                ('membership', models.CharField(blank=True, max_length=32, null=True, verbose_name='membership')),
                ('redacts', models.CharField(blank=True, max_length=255, null=True, verbose_name='redacts')),
                ('relates_to', models.CharField(blank=True, max_length=255, null=True, verbose_name='relates to')),
                ('rejected', models.BooleanField(default=False, verbose_name='rejected')),
                ('outlier', models.BooleanField(default=False, verbose_name='outlier')),
                ('received_ts', models.BigIntegerField(default=0, verbose_name='received at (ms)')),
                ('json', models.BinaryField(verbose_name='event JSON, exactly as received')),
                ('redacted', models.BooleanField(default=False, verbose_name='redacted')),
            ],
            options={
                'verbose_name': 'event',
                'verbose_name_plural': 'events',
                'db_table': 'events',
                'indexes': [models.Index(fields=['instance_name', 'stream_ordering'], name='events_writer_order'), models.Index(fields=['room_id', 'topological_ordering', 'stream_ordering'], name='events_order_room'), models.Index(fields=['room_id', 'stream_ordering'], name='events_room_stream'), models.Index(fields=['type'], name='events_type'), models.Index(fields=['sender'], name='events_sender')],
                'constraints': [models.UniqueConstraint(fields=('event_id',), name='events_event_id_unique')],
            },
        ),
        migrations.CreateModel(
            name='EventAuth',
            fields=[
                ('pk', models.CompositePrimaryKey('event_id', 'auth_id', blank=True, editable=False, primary_key=True, serialize=False)),
                ('event_id', models.CharField(max_length=255, verbose_name='event ID')),
                ('auth_id', models.CharField(max_length=255, verbose_name='auth event ID')),
                ('room_id', models.CharField(max_length=255, verbose_name='room ID')),
            ],
            options={
                'db_table': 'event_auth',
                'indexes': [models.Index(fields=['event_id'], name='event_auth_event_id')],
            },
        ),
        migrations.CreateModel(
            name='EventAuthChain',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event_id', models.CharField(max_length=255, verbose_name='event ID')),
                ('room_id', models.CharField(max_length=255, verbose_name='room ID')),
                ('chain_id', models.BigIntegerField(verbose_name='chain')),
                ('sequence_number', models.BigIntegerField(verbose_name='sequence number')),
            ],
            options={
                'db_table': 'event_auth_chains',
                'indexes': [models.Index(fields=['room_id'], name='event_auth_chains_room')],
                'constraints': [models.UniqueConstraint(fields=('event_id',), name='event_auth_chains_event'), models.UniqueConstraint(fields=('chain_id', 'sequence_number'), name='event_auth_chains_c_seq')],
            },
        ),
        migrations.CreateModel(
            name='EventAuthChainLink',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('room_id', models.CharField(max_length=255, verbose_name='room ID')),
                ('origin_chain_id', models.BigIntegerField(verbose_name='origin chain')),
                ('origin_sequence_number', models.BigIntegerField(verbose_name='origin sequence number')),
                ('target_chain_id', models.BigIntegerField(verbose_name='target chain')),
                ('target_sequence_number', models.BigIntegerField(verbose_name='target sequence number')),
            ],
            options={
                'db_table': 'event_auth_chain_links',
                'indexes': [models.Index(fields=['origin_chain_id', 'target_chain_id'], name='event_auth_chain_links_idx'), models.Index(fields=['room_id'], name='event_auth_chain_links_room')],
            },
        ),
        migrations.CreateModel(
            name='EventAuthChainToCalculate',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event_id', models.CharField(max_length=255, verbose_name='event ID')),
                ('room_id', models.CharField(max_length=255, verbose_name='room ID')),
                ('type', models.CharField(max_length=255, verbose_name='type')),
                ('state_key', models.CharField(max_length=255, verbose_name='state key')),
            ],
            options={
                'db_table': 'event_auth_chain_to_calculate',
                'indexes': [models.Index(fields=['room_id'], name='event_auth_chain_to_calc_room')],
                'constraints': [models.UniqueConstraint(fields=('event_id',), name='event_auth_chain_to_calc_event')],
            },
        ),
        migrations.CreateModel(
            name='EventEdge',
            fields=[
                ('pk', models.CompositePrimaryKey('event_id', 'prev_event_id', blank=True, editable=False, primary_key=True, serialize=False)),
                ('event_id', models.CharField(max_length=255, verbose_name='event ID')),
                ('prev_event_id', models.CharField(max_length=255, verbose_name='previous event ID')),
                ('room_id', models.CharField(max_length=255, verbose_name='room ID')),
            ],
            options={
                'db_table': 'event_edges',
                'indexes': [models.Index(fields=['prev_event_id'], name='ev_edges_prev_id')],
            },
        ),
        migrations.CreateModel(
            name='ForwardExtremity',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event_id', models.CharField(max_length=255, verbose_name='event ID')),
                ('room_id', models.CharField(max_length=255, verbose_name='room ID')),
            ],
            options={
                'db_table': 'event_forward_extremities',
                'indexes': [models.Index(fields=['room_id'], name='event_fwd_ext_room')],
                'constraints': [models.UniqueConstraint(fields=('event_id', 'room_id'), name='event_fwd_ext_event_room')],
            },
        ),
        migrations.CreateModel(
            name='Redaction',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event_id', models.CharField(max_length=255)),
                ('redacts', models.CharField(max_length=255)),
                ('received_ts', models.BigIntegerField()),
            ],
            options={
                'db_table': 'redactions',
                'indexes': [models.Index(fields=['redacts'], name='redactions_redacts')],
                'constraints': [models.UniqueConstraint(fields=('event_id',), name='redactions_event')],
            },
        ),
        migrations.CreateModel(
            name='Rejection',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event_id', models.CharField(max_length=255)),
                ('reason', models.TextField()),
                ('last_check', models.CharField(max_length=32)),
            ],
            options={
                'db_table': 'rejections',
                'constraints': [models.UniqueConstraint(fields=('event_id',), name='rejections_event')],
            },
        ),
        migrations.CreateModel(
            name='RoomMembership',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event_id', models.CharField(max_length=255)),
                ('user_id', models.CharField(max_length=255)),
                ('sender', models.CharField(max_length=255)),
                ('room_id', models.CharField(max_length=255)),
                ('membership', models.CharField(max_length=32)),
                ('event_stream_ordering', models.BigIntegerField()),
                ('topological_ordering', models.BigIntegerField()),
            ],
            options={
                'db_table': 'room_memberships',
                'indexes': [models.Index(fields=['user_id', 'event_stream_ordering'], name='room_memberships_user_stream'), models.Index(fields=['room_id', 'user_id'], name='room_memberships_room_user')],
                'constraints': [models.UniqueConstraint(fields=('event_id',), name='room_memberships_event')],
            },
        ),
        migrations.CreateModel(
            name='StateGroup',
            fields=[
                ('id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('room_id', models.CharField(max_length=255, verbose_name='room ID')),
                ('event_id', models.CharField(max_length=255, verbose_name='computed for event')),
                ('chain_length', models.IntegerField(default=1, verbose_name='groups to the snapshot')),
            ],
            options={
                'db_table': 'state_groups',
                'indexes': [models.Index(fields=['room_id'], name='state_groups_room_id_idx')],
            },
        ),
        migrations.CreateModel(
            name='StateGroupEdge',
            fields=[
                ('pk', models.CompositePrimaryKey('state_group', 'prev_state_group', blank=True, editable=False, primary_key=True, serialize=False)),
                ('state_group', models.BigIntegerField()),
                ('prev_state_group', models.BigIntegerField()),
            ],
            options={
                'db_table': 'state_group_edges',
                'indexes': [models.Index(fields=['prev_state_group'], name='state_group_edges_prev_idx')],
            },
        ),
        migrations.CreateModel(
            name='StateGroupState',
            fields=[
                ('pk', models.CompositePrimaryKey('state_group', 'type', 'state_key', blank=True, editable=False, primary_key=True, serialize=False)),
                ('state_group', models.BigIntegerField()),
                ('room_id', models.CharField(max_length=255)),
                ('type', models.CharField(max_length=255)),
                ('state_key', models.CharField(max_length=255)),
                ('event_id', models.CharField(max_length=255)),
            ],
            options={
                'db_table': 'state_groups_state',
                'indexes': [models.Index(fields=['state_group'], name='state_groups_state_group')],
            },
        ),
        migrations.CreateModel(
            name='VisibilityRange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('room_id', models.CharField(max_length=255)),
                ('user_id', models.CharField(max_length=255)),
                ('start_topological', models.BigIntegerField()),
                ('start_stream', models.BigIntegerField()),
                ('end_topological', models.BigIntegerField(null=True)),
                ('end_stream', models.BigIntegerField(null=True)),
            ],
            options={
                'db_table': 'room_visibility_ranges',
                'indexes': [models.Index(fields=['room_id', 'user_id', 'start_topological', 'start_stream'], name='visibility_room_user_start'), models.Index(fields=['user_id'], name='visibility_user')],
            },
        ),
    ], database_operations=[])]
