#!/usr/bin/env python
"""Django's command-line utility for the ESync state server.

From the repository root:
    python state_server/manage.py runserver 0.0.0.0:10010          # development; migrates first
Production: see state_server/README.md (gunicorn, one process, threads).
"""
import os
import secrets
import sys
from pathlib import Path

SERVER_DIR = Path(__file__).resolve().parent


def _announce_token() -> None:
    """Before runserver's autoreloader forks, fix one token for parent and child and print it."""
    if "runserver" not in sys.argv or os.environ.get("RUN_MAIN") == "true":
        return                                  # not a server, or the reloader's child
    if os.environ.get("ESYNC_STATE_ALLOW_ANONYMOUS") == "1":
        print("ESYNC_STATE_ALLOW_ANONYMOUS=1: calls without a token are accepted (unsafe).",
              file=sys.stderr, flush=True)
    if os.environ.get("ESYNC_STATE_TOKEN"):
        return
    token = secrets.token_urlsafe(24)
    os.environ["ESYNC_STATE_TOKEN"] = token
    print(f"ESYNC_STATE_TOKEN is not set: generated the token for this run: {token}\n"
          "Workers must send it (Authorization: Bearer <token>).", file=sys.stderr, flush=True)


def _migrate_before_serving() -> None:
    """runserver on a fresh checkout: apply the migrations first (once, not in the reloader's child)."""
    if "runserver" not in sys.argv or os.environ.get("RUN_MAIN") == "true":
        return
    import django
    from django.core.management import call_command
    django.setup()
    call_command("migrate", interactive=False, verbosity=1)


def main() -> None:
    sys.path.insert(0, str(SERVER_DIR))
    sys.path.append(str(SERVER_DIR.parent))     # the esync package, when it is not installed
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "esync_state.settings")
    _announce_token()
    _migrate_before_serving()
    from django.core.management import execute_from_command_line
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
