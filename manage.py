#!/usr/bin/env python
"""Django's command-line utility for synapse_repl."""
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except Exception as e:
        # A process that cannot start (bad DATABASE_URL, database down or not migrated, Redis
        # down, no java, port taken...) says why in one line: synapse_repl/startup.py.
        from synapse_repl.startup import explain

        line = explain(e)
        if line is None or "--traceback" in sys.argv:
            raise
        sys.stderr.write(f"error: {line}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
