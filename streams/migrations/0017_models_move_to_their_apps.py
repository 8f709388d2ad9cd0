"""The room, replication and job tables move to their own apps (rooms, replication, jobs):
``streams`` lets them go in its state only, and the admin's content types follow them, so
permissions and the admin's history keep pointing at the same rows. No table changes."""
from django.db import migrations

#: model (lower case) -> the app it moves to
MOVED = {'backwardextremity': 'rooms', 'currentstatedelta': 'rooms', 'currentstateevent': 'rooms', 'event': 'rooms', 'eventauth': 'rooms', 'eventauthchain': 'rooms', 'eventauthchainlink': 'rooms', 'eventauthchaintocalculate': 'rooms', 'eventedge': 'rooms', 'eventtostategroup': 'rooms', 'exoutlier': 'rooms', 'forwardextremity': 'rooms', 'jobrun': 'jobs', 'packedstategroup': 'rooms', 'redaction': 'rooms', 'rejection': 'rooms', 'room': 'rooms', 'roommembership': 'rooms', 'stategroup': 'rooms', 'stategroupedge': 'rooms', 'stategroupstate': 'rooms', 'userip': 'replication', 'visibilityrange': 'rooms'}


def move_content_types(apps, schema_editor, forward=True):
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model, app in MOVED.items():
        old, new = ("streams", app) if forward else (app, "streams")
        ContentType.objects.using(schema_editor.connection.alias).filter(
            app_label=old, model=model).update(app_label=new)


def move_content_types_back(apps, schema_editor):
    move_content_types(apps, schema_editor, forward=False)


class Migration(migrations.Migration):

    dependencies = [
        ('streams', '0016_jobrun_queued'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('rooms', '0001_models_from_streams'),
        ('replication', '0001_models_from_streams'),
        ('jobs', '0001_models_from_streams'),
    ]

    operations = [
        migrations.RunPython(move_content_types, move_content_types_back),
        migrations.SeparateDatabaseAndState(state_operations=[
        migrations.DeleteModel(
            name='BackwardExtremity',
        ),
        migrations.DeleteModel(
            name='CurrentStateDelta',
        ),
        migrations.DeleteModel(
            name='CurrentStateEvent',
        ),
        migrations.DeleteModel(
            name='Event',
        ),
        migrations.DeleteModel(
            name='EventAuth',
        ),
        migrations.DeleteModel(
            name='EventAuthChain',
        ),
        migrations.DeleteModel(
            name='EventAuthChainLink',
        ),
        migrations.DeleteModel(
            name='EventAuthChainToCalculate',
        ),
        migrations.DeleteModel(
            name='EventEdge',
        ),
        migrations.DeleteModel(
            name='EventToStateGroup',
        ),
        migrations.DeleteModel(
            name='ExOutlier',
        ),
        migrations.DeleteModel(
            name='ForwardExtremity',
        ),
        migrations.DeleteModel(
            name='JobRun',
        ),
        migrations.DeleteModel(
            name='PackedStateGroup',
        ),
        migrations.DeleteModel(
            name='Redaction',
        ),
        migrations.DeleteModel(
            name='Rejection',
        ),
        migrations.DeleteModel(
            name='Room',
        ),
        migrations.DeleteModel(
            name='RoomMembership',
        ),
        migrations.DeleteModel(
            name='StateGroup',
        ),
        migrations.DeleteModel(
            name='StateGroupEdge',
        ),
        migrations.DeleteModel(
            name='StateGroupState',
        ),
        migrations.DeleteModel(
            name='UserIp',
        ),
        migrations.DeleteModel(
            name='VisibilityRange',
        ),
    ], database_operations=[]),
    ]
