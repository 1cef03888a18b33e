"""`manage.py runserver` on a fresh checkout (no database yet) answers GET / with 200."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from esync.coordination.service import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_runserver_on_a_fresh_database_answers_200(tmp_path):
    port = free_port()
    db = tmp_path / "fresh.sqlite3"
    env = dict(os.environ, ESYNC_STATE_DB=str(db), ESYNC_STATE_TOKEN="t", PYTHONUNBUFFERED="1")
    env.pop("DJANGO_SETTINGS_MODULE", None)
    with open(tmp_path / "runserver.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(ROOT / "state_server" / "manage.py"),
                                 "runserver", "--noreload", f"127.0.0.1:{port}"],
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    status = None
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = requests.get(f"http://127.0.0.1:{port}/", timeout=5).status_code
                break
            except requests.ConnectionError:
                time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # 404 "unknown job default" would mean the tables exist; GET / of a fresh server lists no
    # job: the job "default" does not exist yet.
    assert status == 200, (tmp_path / "runserver.log").read_text()[-2000:]
