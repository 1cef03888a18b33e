"""Django for the state-server tests: the project's settings on a temporary SQLite database.

Configured at import (before the test modules import the app): the settings read the
environment once, which is restored right after so nothing leaks into other tests.
"""
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_DIR = ROOT / "state_server"
TOKEN = "test-token-7f3a"

if str(SERVER_DIR) not in sys.path:
    sys.path.insert(0, str(SERVER_DIR))

_db_dir = tempfile.mkdtemp(prefix="esync-state-tests-")
atexit.register(shutil.rmtree, _db_dir, ignore_errors=True)
_env = {"DJANGO_SETTINGS_MODULE": "esync_state.settings", "ESYNC_STATE_TOKEN": TOKEN,
        "ESYNC_STATE_DB": os.path.join(_db_dir, "db.sqlite3"), "ESYNC_STATE_ALLOW_ANONYMOUS": None}
_saved = {name: os.environ.get(name) for name in _env}
for _name, _value in _env.items():
    if _value is None:
        os.environ.pop(_name, None)
    else:
        os.environ[_name] = _value

import django  # noqa: E402

django.setup()
from django.core.management import call_command  # noqa: E402

call_command("migrate", verbosity=0)
for _name, _value in _saved.items():
    if _value is None:
        os.environ.pop(_name, None)
    else:
        os.environ[_name] = _value


@pytest.fixture
def token() -> str:
    return TOKEN


@pytest.fixture
def fresh_state():
    """No job in memory or in the database."""
    from coordination.models import Job
    from coordination.services import registry

    registry.clear()
    Job.objects.all().delete()
    yield
    registry.clear()
    Job.objects.all().delete()
