"""WSGI entry point of the ESync state server; applies pending migrations before it serves.

Production (one process: the live job state is in memory; threads for concurrency):
    gunicorn --chdir state_server esync_state.wsgi:application \\
        --workers 1 --worker-class esync_state.gunicorn_worker.JsonErrorThreadWorker \\
        --threads 8 --bind 0.0.0.0:10010
"""
import os
import sys
from pathlib import Path

SERVER_DIR = Path(__file__).resolve().parents[1]
if str(SERVER_DIR) not in sys.path:
    sys.path.insert(0, str(SERVER_DIR))
if str(SERVER_DIR.parent) not in sys.path:
    sys.path.append(str(SERVER_DIR.parent))          # the esync package, when it is not installed

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "esync_state.settings")

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402

django_application = get_wsgi_application()         # sets Django up

from coordination.fastpath import fast_apply  # noqa: E402
from coordination.http import json_error_guard  # noqa: E402

application = json_error_guard(fast_apply(django_application))
call_command("migrate", interactive=False, verbosity=0)   # a fresh database just works

if settings.ESYNC_STATE_TOKEN_GENERATED:
    print(f"ESYNC_STATE_TOKEN is not set: generated the token for this run: "
          f"{settings.ESYNC_STATE_TOKEN}\nWorkers must send it (Authorization: Bearer <token>).",
          file=sys.stderr, flush=True)
if settings.ESYNC_STATE_ALLOW_ANONYMOUS:
    print("ESYNC_STATE_ALLOW_ANONYMOUS=1: calls without a token are accepted (unsafe).",
          file=sys.stderr, flush=True)
