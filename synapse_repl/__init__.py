"""synapse_repl: the stream and replication backbone of a Matrix homeserver cluster."""
from common.lifeline import hold_from_environment

# Every process of the service imports this package first (manage.py's settings, ``celery -A
# synapse_repl``, which finds the app in synapse_repl/celery.py): one started on a lifeline
# dies with its parent (common/lifeline.py).
hold_from_environment()
