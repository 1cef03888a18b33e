"""Base settings of the ESync state server; every secret and deployment choice from the environment.

Environment variables:
    ESYNC_STATE_TOKEN            token required by every state-changing call (init, apply, plan,
                                 reset). Unset: a random one is generated for this process and
                                 printed at start (manage.py runserver / wsgi.py).
    ESYNC_STATE_ALLOW_ANONYMOUS  "1" also accepts calls without a token (the original ESync client
                                 sends none). UNSAFE: anyone who reaches the port can reset a job.
    DJANGO_SECRET_KEY            Django's secret key; an ephemeral one is generated when unset (the
                                 API uses no sessions or signed cookies, so nothing depends on it).
    ESYNC_STATE_DB               SQLite file of jobs and round history (default state_server/db.sqlite3).
    ESYNC_STATE_DEBUG            "1" turns Django's DEBUG on (never in production).
    ESYNC_STATE_ALLOWED_HOSTS    comma-separated Host names accepted (default "*": workers of a LAN
                                 cluster address the server by IP; the token protects the state).
                                 Restrict it, e.g. "127.0.0.1,localhost,10.1.1.34", when exposed.
"""
import os
import secrets
from pathlib import Path

SERVER_DIR = Path(__file__).resolve().parents[2]       # state_server/

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(50)
DEBUG = os.environ.get("ESYNC_STATE_DEBUG") == "1"
ALLOWED_HOSTS = [host.strip() for host in os.environ.get("ESYNC_STATE_ALLOWED_HOSTS", "*").split(",")
                 if host.strip()]

INSTALLED_APPS = ["coordination", "dashboard"]
MIDDLEWARE = ["django.middleware.security.SecurityMiddleware", "coordination.http.HeadWithoutBody"]
ROOT_URLCONF = "esync_state.urls"
WSGI_APPLICATION = "esync_state.wsgi.application"
# The dashboard's page is the only template (in dashboard/templates/); the API answers JSON.
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("ESYNC_STATE_DB") or str(SERVER_DIR / "db.sqlite3"),
        "CONN_MAX_AGE": 600,
        "OPTIONS": {
            # Threads write history concurrently: wait for the lock, take it up front, use WAL.
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
        },
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
USE_I18N = False

# Requests are a handful of numbers; anything larger is refused with 413 before it is parsed.
# A round report carries two numbers per worker (up to 4096 workers), a batch up to 64 rounds.
ESYNC_STATE_MAX_BODY = 4096
ESYNC_STATE_MAX_ROUNDS_BODY = 2 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = ESYNC_STATE_MAX_ROUNDS_BODY
DATA_UPLOAD_MAX_NUMBER_FIELDS = 32

ESYNC_STATE_TOKEN = os.environ.get("ESYNC_STATE_TOKEN", "")
ESYNC_STATE_TOKEN_GENERATED = not ESYNC_STATE_TOKEN
if ESYNC_STATE_TOKEN_GENERATED:
    ESYNC_STATE_TOKEN = secrets.token_urlsafe(24)
    os.environ["ESYNC_STATE_TOKEN"] = ESYNC_STATE_TOKEN   # one token for runserver's child too
ESYNC_STATE_ALLOW_ANONYMOUS = os.environ.get("ESYNC_STATE_ALLOW_ANONYMOUS") == "1"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "INFO"},
    # 4xx answers are the client's business (and a misbehaving client must not flood the log).
    "loggers": {"django.request": {"level": "ERROR"}, "django.server": {"level": "WARNING"}},
}
