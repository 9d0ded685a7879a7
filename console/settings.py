"""One settings module for both ways to run, driven by environment variables.

* **Embedded default** (nothing set): SQLite in WAL mode, the in-process channel layer and a Celery
  worker + beat running inside the server process on an in-memory broker. No external service.
* **Production** (``DATABASE_URL`` and ``REDIS_URL`` set): PostgreSQL, channels-redis, a Celery broker
  on Redis (or RabbitMQ via ``CELERY_BROKER_URL``), worker and beat as separate processes.

Bad values fail at start with a message naming the variable (see ``ConfigError``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _

from console import sites

BASE_DIR = Path(__file__).resolve().parent.parent


class ConfigError(ImproperlyConfigured):
    """A configuration variable is missing or malformed; the message names it."""


env = environ.Env()


def _get(name: str, cast, default):  # noqa: ANN001 - thin wrapper around environ casts
    try:
        if cast is _strict_bool:
            return _strict_bool(name, default)
        return cast(name, default=default)
    except (ValueError, TypeError, environ.ImproperlyConfigured) as exc:
        raise ConfigError(f"Environment variable {name} has an invalid value: {exc}") from exc


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _strict_bool(name: str, default: bool) -> bool:
    """Like env.bool, but a typo ("ture", "perhaps") is an error instead of a silent False."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{raw!r} is not a boolean (use true/false)")


DATABASE_URL: str = _get("DATABASE_URL", env.str, "")
REDIS_URL: str = _get("REDIS_URL", env.str, "")
PRODUCTION: bool = bool(DATABASE_URL)
EMBEDDED: bool = not PRODUCTION

if PRODUCTION and not REDIS_URL:
    raise ConfigError(
        "REDIS_URL must be set when DATABASE_URL is set (production mode needs Redis for the "
        "channel layer and the Celery broker). Unset DATABASE_URL to run the embedded default."
    )
for _name, _url, _schemes in (
    ("DATABASE_URL", DATABASE_URL, {"postgres", "postgresql", "pgsql"}),
    ("REDIS_URL", REDIS_URL, {"redis", "rediss"}),
):
    if _url and urlsplit(_url).scheme not in _schemes:
        raise ConfigError(
            f"{_name}={_url!r} is not supported; expected a URL with scheme one of {sorted(_schemes)}"
        )

DEBUG: bool = _get("DEBUG", _strict_bool, False)

# The embedded default keeps its state here: the SQLite file, written mail, the generated secret
# key and Celery beat's schedule. Created on first start, so a fresh clone needs no set-up step.
STATE_DIR = Path(_get("STATE_DIR", env.str, str(BASE_DIR / "var")))


def _ensure_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"Cannot create the directory {path}: {exc}") from exc
    return path


if PRODUCTION:  # beat's schedule file (the Procfile's default) and collectstatic's target
    _ensure_dir(STATE_DIR)


def _install_secret_key(path: Path) -> str:
    """The embedded default's secret key: generated once per install, readable only by its owner.

    A fixed key in the source would let anyone sign sessions, password-reset links and the
    sandbox payment callbacks of every demo install. Two processes starting at once agree: the
    key is written to a temporary file and linked into place, and the loser reads the winner's.
    """
    import secrets
    import tempfile

    if not path.exists():
        _ensure_dir(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".secret_key.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(64) + "\n")
            # Another process may get there first: then its key is the install's key.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    key = path.read_text().strip()
    if len(key) < 50:
        raise ConfigError(f"{path} holds no usable secret key; delete it to generate a new one.")
    return key


_secret = os.environ.get("SECRET_KEY", "")
if PRODUCTION and len(_secret) < 50:
    raise ConfigError(
        "SECRET_KEY must be set to a random string of at least 50 characters in production mode "
        "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(64))')."
    )
SECRET_KEY: str = _secret or _install_secret_key(STATE_DIR / "secret_key")

# "localhost" is not among them: *.localhost is the embedded default's APPS_DOMAIN (below), and
# a bare http://localhost:8000/ is sent on to http://127.0.0.1:8000/ (slices.apphosts).
ALLOWED_HOSTS: list[str] = _get("ALLOWED_HOSTS", env.list, ["127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS: list[str] = _get("CSRF_TRUSTED_ORIGINS", env.list, [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "channels",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "allauth",
    "allauth.account",
    "console",
    "slices",
    "marketplace",
    "billing",
]

MIDDLEWARE = [
    # An app host (<id>-<port>.<APPS_DOMAIN>) is answered here, before any of the console's own
    # middleware, sessions or URLs (issue 29).
    "slices.apphosts.AppHostMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "console.middleware.StaticFilesMiddleware",  # WhiteNoise, async bodies under ASGI
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "console.middleware.PrivatePagesMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    # Every write needs the acting member's role to allow it (issue 30).
    "console.middleware.TeamDoorMiddleware",
    # A POST-only address opened in the browser: a page with a link to the form (issue 29).
    "console.middleware.MethodNotAllowedPageMiddleware",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"
ASGI_APPLICATION = "console.asgi.application"
AUTH_USER_MODEL = "console.User"
LOGIN_URL = "account_login"
LOGIN_REDIRECT_URL = "/"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.console",
                "console.team_views.switcher",  # the header's team switch (issue 30)
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------------------------
if PRODUCTION:
    try:
        DATABASES = {"default": env.db_url_config(DATABASE_URL)}
    except Exception as exc:  # environ raises a zoo of types for odd URLs
        raise ConfigError(f"DATABASE_URL is not a valid database URL: {exc}") from exc
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # a connection cut meanwhile is replaced
    # A pool per process (Django's psycopg pool). Under ASGI each request's sync part runs in a
    # thread of its own, so connections kept per thread (CONN_MAX_AGE) pile up with the threads:
    # one uvicorn process held 67 and PostgreSQL refused the rest (issue 22). The pool lends a
    # request a connection and takes it back when the request ends, never opening more than
    # DB_POOL_MAX_SIZE; a request that waits DB_POOL_TIMEOUT seconds for one answers 503
    # (console/api/exceptions.py). DB_POOL=false: a plain connection per thread kept DB_CONN_MAX_AGE
    # seconds, for processes whose queries run on one thread (the Procfile's worker, beat and
    # relay) or behind PgBouncer. README "Database connections" sizes max_connections.
    DB_POOL: bool = _get("DB_POOL", _strict_bool, True)
    DB_POOL_MIN_SIZE: int = _get("DB_POOL_MIN_SIZE", env.int, 2)
    DB_POOL_MAX_SIZE: int = _get("DB_POOL_MAX_SIZE", env.int, 10)
    DB_POOL_TIMEOUT: float = _get("DB_POOL_TIMEOUT", env.float, 10.0)
    DB_CONN_MAX_AGE: int = _get("DB_CONN_MAX_AGE", env.int, 0 if DB_POOL else 60)
    # The reads every API poll makes run as prepared statements (console/api/compiled.py): parsed
    # and planned once per connection. false behind a pooler in transaction mode that cannot
    # keep them (PgBouncer before 1.21, or without max_prepared_statements).
    DB_PREPARED: bool = _get("DB_PREPARED", _strict_bool, True)
    if DB_PREPARED:
        # psycopg prepares nothing on a connection whose threshold is None (Django's default);
        # Django's own cursors bind on the client and never prepare, whatever the threshold.
        DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 2**31 - 1
    if DB_POOL:
        if not 1 <= DB_POOL_MAX_SIZE <= 1000 or not 0 <= DB_POOL_MIN_SIZE <= DB_POOL_MAX_SIZE:
            raise ConfigError(
                f"DB_POOL_MIN_SIZE={DB_POOL_MIN_SIZE} and DB_POOL_MAX_SIZE={DB_POOL_MAX_SIZE} must "
                "satisfy 0 <= DB_POOL_MIN_SIZE <= DB_POOL_MAX_SIZE, 1 <= DB_POOL_MAX_SIZE <= 1000"
            )
        if not 0.1 <= DB_POOL_TIMEOUT <= 300:
            raise ConfigError(f"DB_POOL_TIMEOUT={DB_POOL_TIMEOUT} must be 0.1 to 300 seconds")
        if DB_CONN_MAX_AGE != 0:
            raise ConfigError(
                f"DB_CONN_MAX_AGE={DB_CONN_MAX_AGE} keeps connections outside the pool; set it "
                "to 0 (or unset it) with the pool, or DB_POOL=false to run without one"
            )
        if importlib.util.find_spec("psycopg_pool") is None:
            raise ConfigError("DB_POOL needs psycopg_pool: run `make` (uv sync) to install it")
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": DB_POOL_MIN_SIZE,
            "max_size": DB_POOL_MAX_SIZE,
            "timeout": DB_POOL_TIMEOUT,
            "name": "gpu-console",
        }
    elif DB_CONN_MAX_AGE < 0:
        raise ConfigError(f"DB_CONN_MAX_AGE={DB_CONN_MAX_AGE} must be 0 or more seconds")
    DATABASES["default"]["CONN_MAX_AGE"] = DB_CONN_MAX_AGE
else:
    SQLITE_PATH = Path(_get("SQLITE_PATH", env.str, str(STATE_DIR / "console.sqlite3")))
    _ensure_dir(SQLITE_PATH.parent)  # SQLite creates the file, not its directory
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": SQLITE_PATH,
            "OPTIONS": {
                # WAL lets the web server and the embedded worker read while one writes;
                # IMMEDIATE takes the write lock at BEGIN so two writers queue instead of
                # failing with "database is locked" on a lock upgrade.
                "init_command": (
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=10000;"
                ),
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
            "TEST": {"NAME": _get("SQLITE_TEST_PATH", env.str, None)},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Threads of a web process that serve API requests (console/api/handler.py); more requests queue
# for one, API_QUEUE_TIMEOUT seconds at most (then 503 with Retry-After). The views are CPU-bound
# under one GIL, so more threads do not serve more requests but share one core and delay the event
# loop (websockets, every response's bytes): 3 measured best under bench/load.py (README "Load
# benchmark").
API_THREADS: int = _get("API_THREADS", env.int, 3)
if not 1 <= API_THREADS <= 256:
    raise ConfigError(f"API_THREADS={API_THREADS} must be 1 to 256")
API_QUEUE_TIMEOUT: float = _get(
    "API_QUEUE_TIMEOUT", env.float, DB_POOL_TIMEOUT if PRODUCTION and DB_POOL else 10.0
)
if not 0.1 <= API_QUEUE_TIMEOUT <= 300:
    raise ConfigError(f"API_QUEUE_TIMEOUT={API_QUEUE_TIMEOUT} must be 0.1 to 300 seconds")

# --- Channels -----------------------------------------------------------------------------------
if PRODUCTION:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 1500, "expiry": 30},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "console.channel_layer.EmbeddedChannelLayer"}}

# Full origins (scheme://host[:port]) allowed to open websockets besides the console's own
# (console/routing.py: exact match of scheme, host and port).
WEBSOCKET_ALLOWED_ORIGINS: list[str] = _get("WEBSOCKET_ALLOWED_ORIGINS", env.list, [])

# --- Celery -------------------------------------------------------------------------------------
CELERY_BROKER_URL: str = _get(
    "CELERY_BROKER_URL", env.str, REDIS_URL if PRODUCTION else "memory://localhost/"
)
if urlsplit(CELERY_BROKER_URL).scheme not in {
    "redis",
    "rediss",
    "amqp",
    "amqps",
    "pyamqp",
    "memory",
}:
    raise ConfigError(f"CELERY_BROKER_URL={CELERY_BROKER_URL!r} has an unsupported scheme")
CELERY_RESULT_BACKEND = None  # results travel through the database and the channel layer
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Every task's hard and soft limits (slices/tasks.py gives the recipe follower shorter ones).
# A prefork worker enforces them; the embedded worker's thread pool cannot, so every loop a task
# runs is bounded by itself too (README "Bounds and time limits").
CELERY_TASK_TIME_LIMIT = _get("CELERY_TASK_TIME_LIMIT", env.int, 30 * 60)
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 30
# A task not acknowledged within this window is redelivered by Redis: the longest task (its hard
# limit) plus 5 minutes, so none is handed out twice while it runs, and far above every countdown
# and retry delay (tests/console/test_settings.py and tests/slices/test_transient_retries.py
# assert it). A worker that dies is not waited for this long: its lease lapses
# (SLICES_LEASE_SECONDS) and the take-over beat (SLICES_TAKEOVER_INTERVAL) re-drives its
# instances from the database.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_TASK_TIME_LIMIT + 5 * 60}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None  # a worker waits out a broker outage, however long
# On a broker connection loss, running tasks go on (their lease keeps them single); cancelling
# them would cut every provisioning short on a Redis blip.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_TIMEZONE = "Asia/Shanghai"
# billing: per-second usage settled in bulk; the interval is also the low-balance window.
BILLING_SETTLEMENT_INTERVAL: int = _get("BILLING_SETTLEMENT_INTERVAL", env.int, 60)
BILLING_SANDBOX_PAYMENTS: bool = _get("BILLING_SANDBOX_PAYMENTS", _strict_bool, EMBEDDED)
# What billing calls to release a resource it stopped for lack of funds (one small service call).
BILLING_STOP_HANDLER = "slices.services.stop_for_billing"
CELERY_BEAT_SCHEDULE: dict[str, dict] = {
    "billing-settle-usage": {
        "task": "billing.tasks.settle_usage_task",
        "schedule": float(BILLING_SETTLEMENT_INTERVAL),
    },
    "billing-expire-vouchers": {"task": "billing.tasks.expire_vouchers_task", "schedule": 3600.0},
    "slices-reconcile": {"task": "slices.tasks.reconcile_instances_task", "schedule": 30.0},
    "slices-follow-slurm-jobs": {
        "task": "slices.tasks.follow_slurm_jobs_all_task",
        "schedule": 30.0,
    },
}
# --- Instances: ordering, provisioning, nodes -----------------------------------------------------
# The node driver: "sim" (the simulated fleet; the embedded default) or "ssh" (real nodes).
SLICES_DRIVER: str = _get("SLICES_DRIVER", env.str, "sim")
if SLICES_DRIVER not in {"sim", "ssh"}:
    raise ConfigError(f"SLICES_DRIVER={SLICES_DRIVER!r} must be sim or ssh")
# A slice's own Slurm (issue 31): its node-local directory (config, keys, sockets; the same on
# every node) under this one, and the ports its daemons take: blocks of 200 from the base, one
# block per live slice (several slices share a machine on the test hosts).
SLICES_SLURM_RUN_DIR: str = _get("SLICES_SLURM_RUN_DIR", env.str, "/run/gpc-slurm")
SLICES_SLURM_PORT_BASE: int = _get("SLICES_SLURM_PORT_BASE", env.int, 17000)
SLICES_SLURM_PORT_BLOCKS: int = _get("SLICES_SLURM_PORT_BLOCKS", env.int, 75)
# How often the follower reads a slice's queue and its jobs' output while a job is live.
SLURM_FOLLOW_INTERVAL: float = _get("SLURM_FOLLOW_INTERVAL", env.float, 1.0)
if not SLICES_SLURM_RUN_DIR.startswith("/") or not 1024 <= SLICES_SLURM_PORT_BASE <= 60000:
    raise ConfigError("SLICES_SLURM_RUN_DIR must be absolute, SLICES_SLURM_PORT_BASE a port")
if SLICES_SLURM_PORT_BASE + 200 * SLICES_SLURM_PORT_BLOCKS > 65535 or SLICES_SLURM_PORT_BLOCKS < 1:
    raise ConfigError("SLICES_SLURM_PORT_BLOCKS leaves the port range")
# Every simulated delay is multiplied by this (1 = realistic, 0 = instant).
SIM_TIME_SCALE: float = _get("SIM_TIME_SCALE", env.float, 1.0)
if not 0 <= SIM_TIME_SCALE <= 100:
    raise ConfigError(f"SIM_TIME_SCALE={SIM_TIME_SCALE!r} must be between 0 and 100")
# An order needs balance for at least this long at its quoted price.
ORDER_MIN_RUNWAY_SECONDS: int = _get("ORDER_MIN_RUNWAY_SECONDS", env.int, 3600)
SLICES_DEFAULT_GPU_QUOTA: int = _get("SLICES_DEFAULT_GPU_QUOTA", env.int, 256)
# 排队 (issue 32): queued orders a team may hold at once, the maximum wait offered by default
# and at most (hours), and how many futures a start estimate draws.
SLICES_QUEUE_MAX_PER_TEAM: int = _get("SLICES_QUEUE_MAX_PER_TEAM", env.int, 5)
SLICES_QUEUE_DEFAULT_MAX_WAIT_HOURS: float = _get(
    "SLICES_QUEUE_DEFAULT_MAX_WAIT_HOURS", env.float, 24.0
)
SLICES_QUEUE_MAX_WAIT_HOURS: float = _get("SLICES_QUEUE_MAX_WAIT_HOURS", env.float, 168.0)
SLICES_QUEUE_ESTIMATE_SAMPLES: int = _get("SLICES_QUEUE_ESTIMATE_SAMPLES", env.int, 8)
CELERY_BEAT_SCHEDULE["slices-admit-queues"] = {
    "task": "slices.tasks.admit_queues_task",
    "schedule": 60.0,
}
# A worker holds a lease on an instance while driving it, renewed by a heartbeat five times per
# lease; a lapsed lease (the worker died) is taken over by the take-over beat, which runs every
# SLICES_TAKEOVER_INTERVAL seconds: a dead worker's instance moves on within the sum (20 s).
SLICES_LEASE_SECONDS: int = _get("SLICES_LEASE_SECONDS", env.int, 15)
SLICES_TAKEOVER_INTERVAL: float = _get("SLICES_TAKEOVER_INTERVAL", env.float, 5.0)
if not 2 <= SLICES_LEASE_SECONDS <= 3600 or not 1 <= SLICES_TAKEOVER_INTERVAL <= 300:
    raise ConfigError("SLICES_LEASE_SECONDS or SLICES_TAKEOVER_INTERVAL is out of range")
# Booked windows (预约, issue 32): notices, covering failed nodes, starting due windows.
CELERY_BEAT_SCHEDULE["slices-reservations"] = {
    "task": "slices.tasks.run_reservations_task",
    "schedule": 60.0,
}
CELERY_BEAT_SCHEDULE["slices-take-over"] = {
    "task": "slices.tasks.take_over_instances_task",
    "schedule": SLICES_TAKEOVER_INTERVAL,
}
SLICES_MAX_DRIVE_ATTEMPTS: int = _get("SLICES_MAX_DRIVE_ATTEMPTS", env.int, 3)
SLICES_LEAK_GRACE_SECONDS: int = _get("SLICES_LEAK_GRACE_SECONDS", env.int, 300)
SLICES_RETRY_BACKOFF_SECONDS: float = _get("SLICES_RETRY_BACKOFF_SECONDS", env.float, 2.0)
SLICES_PROVISION_THREADS: int = _get("SLICES_PROVISION_THREADS", env.int, 64)
SLICES_NODE_WORKDIR: str = _get("SLICES_NODE_WORKDIR", env.str, "/var/lib/gpu-console")
SLICES_NODE_RUNTIME: str = _get("SLICES_NODE_RUNTIME", env.str, "docker")
if SLICES_NODE_RUNTIME not in {"docker", "enroot", "process"}:
    raise ConfigError(f"SLICES_NODE_RUNTIME={SLICES_NODE_RUNTIME!r}: docker, enroot or process")
# What runs on a node (ssh driver): every command under this PATH, the runtimes by absolute path.
SLICES_NODE_PATH: str = _get(
    "SLICES_NODE_PATH", env.str, "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
SLICES_DOCKER_BIN: str = _get("SLICES_DOCKER_BIN", env.str, "/usr/bin/docker")
SLICES_ENROOT_BIN: str = _get("SLICES_ENROOT_BIN", env.str, "/usr/bin/enroot")
SLICES_MPIRUN_BIN: str = _get("SLICES_MPIRUN_BIN", env.str, "/usr/bin/mpirun")
if not all(p.startswith("/") for p in (SLICES_DOCKER_BIN, SLICES_ENROOT_BIN, SLICES_MPIRUN_BIN)):
    raise ConfigError("SLICES_DOCKER_BIN, SLICES_ENROOT_BIN and SLICES_MPIRUN_BIN: absolute paths")
SLICES_PFS_ROOT: str = _get("SLICES_PFS_ROOT", env.str, "/pfs")
SLICES_ASSET_ROOT: str = _get("SLICES_ASSET_ROOT", env.str, "/pfs/.catalogue")
SLICES_INSTANCE_SSH_USER: str = _get("SLICES_INSTANCE_SSH_USER", env.str, "root")
SLICES_INSTANCE_SSH_PORT: int = _get("SLICES_INSTANCE_SSH_PORT", env.int, 0)  # 0 = the node's port
# Reaching an instance over SSH (issue 19): each instance's own sshd listens on a port of this
# range on each of its nodes (allocated per instance and node), reached through the region's
# gateway, whose keys file the console rewrites after every change and every
# SLICES_GATEWAY_SYNC_INTERVAL seconds (beat).
SLICES_INSTANCE_SSH_PORTS: str = _get("SLICES_INSTANCE_SSH_PORTS", env.str, "30000-30999")
try:
    _low, _high = (int(p) for p in SLICES_INSTANCE_SSH_PORTS.split("-"))
except ValueError:
    raise ConfigError("SLICES_INSTANCE_SSH_PORTS must be a range: <low>-<high>") from None
if not 1024 <= _low <= _high <= 65535:
    raise ConfigError("SLICES_INSTANCE_SSH_PORTS must lie within 1024-65535, low first")
SLICES_GATEWAY_SYNC_INTERVAL: float = _get("SLICES_GATEWAY_SYNC_INTERVAL", env.float, 300.0)
if not 10 <= SLICES_GATEWAY_SYNC_INTERVAL <= 86400:
    raise ConfigError("SLICES_GATEWAY_SYNC_INTERVAL is out of range (10-86400 s)")
# Web ports through the console (issues 19, 29): every app is served on its own host
# <id>-<port>.<APPS_DOMAIN>, never on the console's origin nor its site (console/sites.py). The
# embedded default uses "localhost": *.localhost resolves to loopback in browsers and each
# <id>-<port>.localhost is a site apart from the console's 127.0.0.1. Production names a
# registrable domain of its own (wildcard DNS and TLS); the console refuses to start when it is
# on the console's site (ALLOWED_HOSTS).
APPS_DOMAIN: str = _get("APPS_DOMAIN", env.str, "").strip().strip(".").lower()
if not APPS_DOMAIN:
    if PRODUCTION:
        raise ConfigError(
            "APPS_DOMAIN must be set in production mode: a registrable domain apart from the "
            "console's (e.g. example-apps.com, with wildcard DNS and TLS for *.example-apps.com), "
            "where each instance's web ports are served on a host of their own."
        )
    APPS_DOMAIN = "localhost"
_apps_problem = sites.apps_domain_problem(APPS_DOMAIN, ALLOWED_HOSTS)
if _apps_problem:
    raise ConfigError(_apps_problem)
if "." + APPS_DOMAIN not in ALLOWED_HOSTS and "*" not in ALLOWED_HOSTS:
    ALLOWED_HOSTS = [*ALLOWED_HOSTS, "." + APPS_DOMAIN]
# The app hosts' scheme and port in the URLs the console gives (the request's when empty: the
# embedded default's http://<id>-<port>.localhost:8000/). Production: "https" and "" (443).
APPS_SCHEME: str = _get("APPS_SCHEME", env.str, "").strip().lower()
if APPS_SCHEME not in ("", "http", "https"):
    raise ConfigError("APPS_SCHEME must be http or https (or empty: the request's)")
APPS_PORT: int | None = _get("APPS_PORT", env.int, None)
if APPS_PORT is not None and not 1 <= APPS_PORT <= 65535:
    raise ConfigError("APPS_PORT must be a TCP port (1-65535), or unset: the request's")
# The console's cookies are host-only (an app host can never be sent or set them).
for _cookie_domain in ("SESSION_COOKIE_DOMAIN", "CSRF_COOKIE_DOMAIN", "LANGUAGE_COOKIE_DOMAIN"):
    if _get(_cookie_domain, env.str, ""):
        raise ConfigError(
            f"{_cookie_domain} must stay unset: the console's cookies are host-only, so no other "
            "host (an instance's app above all) is ever sent them or can set them"
        )
# How the console reaches the nodes (ssh driver): its own key, the user, timeouts.
SLICES_SSH_USER: str = _get("SLICES_SSH_USER", env.str, "root")
SLICES_SSH_KEY_FILE: str = _get("SLICES_SSH_KEY_FILE", env.str, "")
SLICES_SSH_CONNECT_TIMEOUT: float = _get("SLICES_SSH_CONNECT_TIMEOUT", env.float, 10.0)
SLICES_SSH_COMMAND_TIMEOUT: float = _get("SLICES_SSH_COMMAND_TIMEOUT", env.float, 600.0)
SLICES_SSH_KEEPALIVE: int = _get("SLICES_SSH_KEEPALIVE", env.int, 15)
# The web terminal: closed after this many seconds without input from the browser; at most this
# many open at once per user (counted per console process).
SLICES_TERMINAL_IDLE_SECONDS: int = _get("SLICES_TERMINAL_IDLE_SECONDS", env.int, 900)
SLICES_TERMINAL_MAX_PER_USER: int = _get("SLICES_TERMINAL_MAX_PER_USER", env.int, 10)
if SLICES_TERMINAL_IDLE_SECONDS < 1 or SLICES_TERMINAL_MAX_PER_USER < 1:
    raise ConfigError("SLICES_TERMINAL_IDLE_SECONDS and SLICES_TERMINAL_MAX_PER_USER: at least 1")
# Storage and resilience (README "Storage and resilience").
# Where the console itself sees the parallel file system (measuring usage, finding checkpoints);
# "" = SLICES_PFS_ROOT for the ssh driver, STATE_DIR/sim-pfs for the simulated fleet.
SLICES_PFS_CONSOLE_ROOT: str = _get("SLICES_PFS_CONSOLE_ROOT", env.str, "")
SLICES_PFS_QUOTA_GB: int = _get("SLICES_PFS_QUOTA_GB", env.int, 200)  # per account, no charge
# The /pfs file browser (/storage/pfs/): the largest file one upload may carry, in bytes (2 GiB;
# bigger files go through an instance). A body over it is refused from its Content-Length.
SLICES_PFS_UPLOAD_MAX_BYTES: int = _get("SLICES_PFS_UPLOAD_MAX_BYTES", env.int, 2 * 1024**3)
if SLICES_PFS_UPLOAD_MAX_BYTES < 1:
    raise ConfigError("SLICES_PFS_UPLOAD_MAX_BYTES: at least 1")
# Request bodies, capped by route before Django reads them (console/bodylimit.py, issue 29): a
# Content-Length over the route's limit is refused at once, a chunked body once its bytes pass
# it; 413 either way. The first pattern of REQUEST_BODY_LIMITS that matches the path (``re.match``)
# gives the limit, else REQUEST_BODY_MAX_BYTES (the API and the signed-in forms: Django's own
# DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MiB, plus the multipart framing). The sign-in and sign-up
# pages, open to anyone, take little; the /pfs upload its file; an app host (every path of it,
# console/bodylimit.py) and the apps' API what the customer's app accepts, up to
# PORT_PROXY_BODY_MAX_BYTES (Django spools it to a temporary file before the proxy streams it on).
REQUEST_BODY_MAX_BYTES: int = _get("REQUEST_BODY_MAX_BYTES", env.int, 2_621_440 + 64 * 1024)
REQUEST_BODY_ANONYMOUS_MAX_BYTES: int = _get("REQUEST_BODY_ANONYMOUS_MAX_BYTES", env.int, 64 * 1024)
PORT_PROXY_BODY_MAX_BYTES: int = _get("PORT_PROXY_BODY_MAX_BYTES", env.int, 100 * 1024**2)
REQUEST_BODY_LIMITS: list[tuple[str, int]] = [
    (r"/storage/pfs/upload/$", SLICES_PFS_UPLOAD_MAX_BYTES + 64 * 1024),
    (r"/apps/[^/]+/v1/", PORT_PROXY_BODY_MAX_BYTES),
    (
        r"/accounts/(login|logout|signup|password|confirm-email|email|reauthenticate|inactive)/",
        REQUEST_BODY_ANONYMOUS_MAX_BYTES,
    ),
]
if min(REQUEST_BODY_MAX_BYTES, REQUEST_BODY_ANONYMOUS_MAX_BYTES, PORT_PROXY_BODY_MAX_BYTES) < 1024:
    raise ConfigError(
        "REQUEST_BODY_MAX_BYTES, REQUEST_BODY_ANONYMOUS_MAX_BYTES, PORT_PROXY_BODY_MAX_BYTES: at "
        "least 1024"
    )
SLICES_DISK_MAX_GB: int = _get("SLICES_DISK_MAX_GB", env.int, 16384)
SLICES_DISK_MAX_PER_ACCOUNT: int = _get("SLICES_DISK_MAX_PER_ACCOUNT", env.int, 20)
SLICES_SYSTEM_DISK_GB: int = _get("SLICES_SYSTEM_DISK_GB", env.int, 50)
# A stopped instance is released after this many days, warned at each of the days before it.
SLICES_STOPPED_RELEASE_DAYS: int = _get("SLICES_STOPPED_RELEASE_DAYS", env.int, 15)
SLICES_STOPPED_WARN_DAYS: list[int] = [
    int(d) for d in _get("SLICES_STOPPED_WARN_DAYS", env.list, ["7", "3", "1"])
]
# A node with a bad health signal from its agent (Xid, NVML failure) for this long is marked failed
# and leaves the pool until an operator returns it.
SLICES_NODE_FAIL_GRACE_SECONDS: int = _get("SLICES_NODE_FAIL_GRACE_SECONDS", env.int, 60)
# Silence: a node that answered none of the console's probes (two or more in a row) for this long,
# counted from the first probe it missed (SECURITY.md "Node health": a heartbeat is the node's
# answer, never an instance's GPU samples).
SLICES_NODE_HEARTBEAT_GRACE_SECONDS: int = _get("SLICES_NODE_HEARTBEAT_GRACE_SECONDS", env.int, 180)
# Compensation voucher per migration (元; 0 = none) and its validity.
SLICES_MIGRATION_VOUCHER: str = _get("SLICES_MIGRATION_VOUCHER", env.str, "0")
SLICES_MIGRATION_VOUCHER_DAYS: int = _get("SLICES_MIGRATION_VOUCHER_DAYS", env.int, 30)
if SLICES_STOPPED_RELEASE_DAYS < 1 or SLICES_NODE_FAIL_GRACE_SECONDS < 0:
    raise ConfigError("SLICES_STOPPED_RELEASE_DAYS or SLICES_NODE_FAIL_GRACE_SECONDS out of range")
# Recipes (the one-click demo): a follower reads a running recipe's output every
# RECIPE_FOLLOW_INTERVAL seconds, as one short task run each time (what is due, at most 2,000
# lines); RECIPE_FOLLOW_SECONDS > 0 keeps a run polling (and its worker thread busy) that long;
# RECIPE_TIME_LIMIT_SECONDS (0 = the recipe's own) shortens a run's time limit (tests,
# demonstrations); RECIPE_EXTRA_ENV (JSON object) is added to a run's environment: where a bare test
# host keeps the recipe and its Python (checked against the recipe's bounds at launch).
RECIPE_FOLLOW_INTERVAL: float = _get("RECIPE_FOLLOW_INTERVAL", env.float, 1.0)
RECIPE_FOLLOW_SECONDS: float = _get("RECIPE_FOLLOW_SECONDS", env.float, 0.0)
if not 0.01 <= RECIPE_FOLLOW_INTERVAL <= 60 or not 0 <= RECIPE_FOLLOW_SECONDS <= 600:
    raise ConfigError("RECIPE_FOLLOW_INTERVAL or RECIPE_FOLLOW_SECONDS is out of range")
RECIPE_TIME_LIMIT_SECONDS: int = _get("RECIPE_TIME_LIMIT_SECONDS", env.int, 0)
RECIPE_EXTRA_ENV: dict = _get("RECIPE_EXTRA_ENV", env.json, {})
CELERY_BEAT_SCHEDULE["slices-follow-recipes"] = {
    "task": "slices.tasks.follow_recipes_task",
    "schedule": 60.0,
}
# AI applications (issue 20): a running app's health check is asked every APP_HEALTH_INTERVAL
# seconds until it answers; APP_EXTRA_ENV (JSON object) is added to an app's environment (where a
# bare test host keeps the app's directory: APP_DIR).
APP_HEALTH_INTERVAL: float = _get("APP_HEALTH_INTERVAL", env.float, 2.0)
if not 0.01 <= APP_HEALTH_INTERVAL <= 60:
    raise ConfigError("APP_HEALTH_INTERVAL is out of range (0.01-60 s)")
APP_EXTRA_ENV: dict = _get("APP_EXTRA_ENV", env.json, {})
CELERY_BEAT_SCHEDULE["slices-follow-apps"] = {
    "task": "slices.tasks.follow_apps_task",
    "schedule": 60.0,
}
# Embedded default: run the worker (and beat) inside the ASGI server process.
EMBEDDED_WORKER: bool = _get("EMBEDDED_WORKER", _strict_bool, EMBEDDED)
if PRODUCTION and EMBEDDED_WORKER:
    raise ConfigError("EMBEDDED_WORKER cannot be enabled in production mode; run `celery worker`.")
EMBEDDED_WORKER_THREADS: int = _get("EMBEDDED_WORKER_THREADS", env.int, 4)
# Live GPU telemetry: the relay samples every running instance's GPUs at this interval (seconds),
# keeps the last TELEMETRY_RING_SECONDS of samples per instance (Redis streams in production,
# memory in the embedded default) and 1-minute rollups in the database for the retention.
TELEMETRY_RELAY: bool = _get("TELEMETRY_RELAY", _strict_bool, True)  # embedded: run it in-process
TELEMETRY_INTERVAL: float = _get("TELEMETRY_INTERVAL", env.float, 1.0)
TELEMETRY_RING_SECONDS: int = _get("TELEMETRY_RING_SECONDS", env.int, 3600)
TELEMETRY_RETENTION_DAYS: int = _get("TELEMETRY_RETENTION_DAYS", env.int, 30)
if (
    not 0.05 <= TELEMETRY_INTERVAL <= 60
    or TELEMETRY_RING_SECONDS < 60
    or TELEMETRY_RETENTION_DAYS < 1
):
    raise ConfigError(
        "TELEMETRY_INTERVAL, TELEMETRY_RING_SECONDS or TELEMETRY_RETENTION_DAYS is out of range"
    )
# Idle: every GPU's peak utilisation below the threshold (%) for this many minutes.
TELEMETRY_IDLE_THRESHOLD: float = _get("TELEMETRY_IDLE_THRESHOLD", env.float, 5.0)
TELEMETRY_IDLE_MINUTES: int = _get("TELEMETRY_IDLE_MINUTES", env.int, 30)
# /metrics (Prometheus): staff login, or "Authorization: Bearer <token>" when a token is set.
TELEMETRY_METRICS_TOKEN: str = _get("TELEMETRY_METRICS_TOKEN", env.str, "")
CELERY_BEAT_SCHEDULE.update(
    {
        "slices-telemetry-idle": {
            "task": "slices.tasks.check_idle_instances_task",
            "schedule": 60.0,
        },
        "slices-telemetry-prune": {
            "task": "slices.tasks.prune_telemetry_task",
            "schedule": 3600.0,
        },
        "slices-gateway-keys": {
            "task": "slices.tasks.sync_gateways_task",
            "schedule": SLICES_GATEWAY_SYNC_INTERVAL,
        },
    }
)
# Beat publishes each job with retries (about 10 s) so a broker blip does not cost the tick, and
# a job still queued after its own interval expires (the next tick brings a fresh one): a worker
# back from an outage runs no backlog. Every job derives its work from the database, so a tick
# lost to a longer outage is caught up by the next one.
BEAT_PUBLISH_RETRY_POLICY = {
    "max_retries": 5,
    "interval_start": 0.5,
    "interval_step": 1.0,
    "interval_max": 3.0,
}
for _entry in CELERY_BEAT_SCHEDULE.values():
    _entry.setdefault("options", {}).update(
        retry=True, retry_policy=BEAT_PUBLISH_RETRY_POLICY, expires=float(_entry["schedule"])
    )

# --- Cache --------------------------------------------------------------------------------------
if PRODUCTION:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- Auth, i18n, static -------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 10},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "zh-hans"
LANGUAGES = [("zh-hans", "简体中文"), ("en", "English")]
LOCALE_PATHS = [BASE_DIR / "console" / "locale"]
TIME_ZONE = "Asia/Shanghai"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# collectstatic target in production (with the rest of the state, not in the clone when STATE_DIR
# is elsewhere); the embedded default serves from the source folders.
STATIC_ROOT = (
    Path(_get("STATIC_ROOT", env.str, str(STATE_DIR / "staticfiles"))) if PRODUCTION else None
)
# The production edge (issue 34, console/edge.py): nginx's rendered configuration, pid file, logs,
# temporary files and the OpenSSH tunnels' sockets to the instances' web ports.
EDGE_DIR = Path(_get("EDGE_DIR", env.str, str(STATE_DIR / "edge")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}
# The embedded default serves straight from the source folders: no collectstatic step.
WHITENOISE_USE_FINDERS = EMBEDDED
WHITENOISE_AUTOREFRESH = EMBEDDED and DEBUG

# --- Accounts (django-allauth) ------------------------------------------------------------------
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",  # the admin's login form
    "console.adapters.AccountAuthenticationBackend",  # email or username (allauth's)
]
ACCOUNT_ADAPTER = "console.adapters.AccountAdapter"
ACCOUNT_LOGIN_METHODS = {"email", "username"}
ACCOUNT_SIGNUP_FIELDS = ["email*", "password1*", "password2*"]  # username is generated
ACCOUNT_EMAIL_VERIFICATION = "mandatory"
ACCOUNT_UNIQUE_EMAIL = True
ACCOUNT_PREVENT_ENUMERATION = True
# Confirming the address in the browser that signed up logs the user in (allauth only does so while
# that sign-up is pending in the same session, so a leaked link alone never logs anyone in).
ACCOUNT_LOGIN_ON_EMAIL_CONFIRMATION = True
ACCOUNT_LOGOUT_ON_PASSWORD_CHANGE = False
ACCOUNT_EMAIL_SUBJECT_PREFIX = "[GPU Console] "
ACCOUNT_DEFAULT_HTTP_PROTOCOL = "https" if PRODUCTION else "http"
# Abuse limits, counted in the cache (Redis in production, so every web server shares them).
# Failed logins count per login name only: five wrong passwords lock that account for 15 minutes
# without locking out colleagues behind the same NAT; "login" still throttles raw volume per IP.
ACCOUNT_RATE_LIMITS = {
    # A class signing up from one campus NAT must fit; farming trial credit must not.
    "signup": _get("RATE_LIMIT_SIGNUP", env.str, "10/h/ip"),
    "reset_password": _get("RATE_LIMIT_RESET_PASSWORD", env.str, "5/h/ip,3/h/key"),
    "reset_password_from_key": "20/m/ip",
    "login": _get("RATE_LIMIT_LOGIN", env.str, "60/m/ip"),
    "login_failed": _get("RATE_LIMIT_LOGIN_FAILED", env.str, "5/15m/key"),
    "confirm_email": "1/3m/key",
    "change_password": "5/m/user",
    "manage_email": "10/m/user",
    "reauthenticate": "10/m/user",
}
for _action, _rates in ACCOUNT_RATE_LIMITS.items():
    for _rate in _rates.split(","):
        if not re.fullmatch(r"\d+/\d*\.?\d*[smhd](/(ip|key|user))?", _rate.strip()):
            raise ConfigError(
                f"Rate limit {_rate!r} for {_action} is invalid; use e.g. 10/h/ip or 5/15m/key"
            )
# Reverse proxies in front of the web servers that append to X-Forwarded-For (the per-IP limits
# read the client address through them; 0 = use the socket's peer address).
ALLAUTH_TRUSTED_PROXY_COUNT: int = _get("TRUSTED_PROXY_COUNT", env.int, 0)
# Extra disposable-email domains refused at sign-up, besides the bundled block list.
DISPOSABLE_EMAIL_DOMAINS: list[str] = _get("DISPOSABLE_EMAIL_DOMAINS", env.list, [])
API_TOKEN_MAX_PER_USER: int = _get("API_TOKEN_MAX_PER_USER", env.int, 50)
SSH_KEY_MAX_PER_USER: int = _get("SSH_KEY_MAX_PER_USER", env.int, 50)

# --- Email --------------------------------------------------------------------------------------
EMAIL_BACKEND = _get(
    "EMAIL_BACKEND",
    env.str,
    "django.core.mail.backends.smtp.EmailBackend"
    if PRODUCTION
    else "django.core.mail.backends.filebased.EmailBackend",
)
EMAIL_FILE_PATH = STATE_DIR / "mail"
if EMBEDDED:
    _ensure_dir(EMAIL_FILE_PATH)
if PRODUCTION and "EMAIL_URL" in os.environ:
    vars().update(env.email_url("EMAIL_URL"))
DEFAULT_FROM_EMAIL = _get("DEFAULT_FROM_EMAIL", env.str, "GPU Console <noreply@localhost>")
# Where customers write for help: linked from the "check your inbox" page and the footer.
SUPPORT_EMAIL: str = _get("SUPPORT_EMAIL", env.str, "support@localhost")
if not re.fullmatch(r"[^@\s<>\"]+@[^@\s<>\"]+", SUPPORT_EMAIL):
    raise ConfigError(f"SUPPORT_EMAIL {SUPPORT_EMAIL!r} is not an e-mail address")

# --- REST framework -----------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["console.api.permissions.TeamDoor"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "console.api.pagination.ConsolePagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "console.api.exceptions.api_exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "console.api.parsers.SafeJSONParser",  # deeply nested JSON is a 400, not a 500
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Console API",
    "DESCRIPTION": "Everything the console's browser pages can do: instances, slices, marketplace, "
    "billing. Prices in CNY (元).",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Two request fields are named "mode" (a disk attachment's, an instance start's).
    "ENUM_NAME_OVERRIDES": {
        "DiskAttachModeEnum": ["rw", "ro"],
        "InstanceStartModeEnum": ["auto", "same", "gpuless"],
    },
}

# --- Security -----------------------------------------------------------------------------------
SECURE_SSL_REDIRECT: bool = _get("SECURE_SSL_REDIRECT", _strict_bool, PRODUCTION)
SESSION_COOKIE_SECURE: bool = _get("SESSION_COOKIE_SECURE", _strict_bool, PRODUCTION)
CSRF_COOKIE_SECURE: bool = _get("CSRF_COOKIE_SECURE", _strict_bool, PRODUCTION)
SECURE_HSTS_SECONDS: int = _get("SECURE_HSTS_SECONDS", env.int, 31536000 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = PRODUCTION
SECURE_HSTS_PRELOAD = PRODUCTION
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
if _get("BEHIND_TLS_PROXY", _strict_bool, PRODUCTION):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SESSION_COOKIE_HTTPONLY = True
# Behind TLS the console's cookies carry the __Host- prefix: the browser then keeps them only
# when set by this very host, Secure, for Path=/ and without a Domain (issue 29).
LANGUAGE_COOKIE_SECURE = SESSION_COOKIE_SECURE
LANGUAGE_COOKIE_SAMESITE = "Lax"
LANGUAGE_COOKIE_HTTPONLY = True
if SESSION_COOKIE_SECURE:
    SESSION_COOKIE_NAME = "__Host-sessionid"
    LANGUAGE_COOKIE_NAME = "__Host-django_language"
if CSRF_COOKIE_SECURE:
    CSRF_COOKIE_NAME = "__Host-csrftoken"
CSRF_FAILURE_VIEW = "console.views.csrf_failure"  # the styled, translated 403 page
X_FRAME_OPTIONS = "DENY"

CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'", "ws:", "wss:"] if EMBEDDED else ["'self'", "wss:"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'"],
    }
}

# --- Logging ------------------------------------------------------------------------------------
LOG_LEVEL: str = _get("LOG_LEVEL", env.str, "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"paramiko": {"level": "WARNING"}, "django.db.backends": {"level": "INFO"}},
}

CONSOLE_VERSION = "0.1.0"
CONSOLE_MODE_LABEL = _("Production") if PRODUCTION else _("Embedded demo (simulated fleet)")

# --- Real-name verification (实名认证), invoices (发票), bill exports: issue 33 -----------------
# Who checks a person's name, ID number and face: "sandbox" (labelled as such, decides at once)
# is the only provider shipped; console/verification/providers.py names the interface.
VERIFICATION_PROVIDER: str = _get("VERIFICATION_PROVIDER", env.str, "sandbox")
# What needs a verified account (console/verification/services.py, GATED_ACTIONS): online
# top-ups, invoices and slices of VERIFICATION_LARGE_ORDER_CARDS cards or more. The trial credit,
# the demo and small hosts never do. An empty list turns the gate off.
VERIFICATION_REQUIRED_FOR: list[str] = _get(
    "VERIFICATION_REQUIRED_FOR", env.list, ["topup", "invoice", "large_order"]
)
VERIFICATION_LARGE_ORDER_CARDS: int = _get("VERIFICATION_LARGE_ORDER_CARDS", env.int, 64)
# A business licence upload (PNG, JPEG or PDF) is refused above this size.
VERIFICATION_LICENCE_MAX_BYTES: int = _get(
    "VERIFICATION_LICENCE_MAX_BYTES", env.int, 5 * 1024 * 1024
)
# Uploaded licences and issued invoice PDFs: never under a public URL, served by views that check
# the owner (or an operator).
PRIVATE_FILES_DIR = Path(_get("PRIVATE_FILES_DIR", env.str, str(STATE_DIR / "private")))
# The smallest invoice a customer may request (元).
INVOICE_MIN_AMOUNT: str = _get("INVOICE_MIN_AMOUNT", env.str, "1.00")
# The TrueType font embedded in invoice PDFs for Chinese text (`make system-deps` installs
# fonts-wqy-microhei); empty: the first of billing/invoicing/pdf.py's FONT_CANDIDATES found.
INVOICE_FONT_PATH: str = _get("INVOICE_FONT_PATH", env.str, "")
# The seller printed on invoices.
INVOICE_SELLER_NAME: str = _get("INVOICE_SELLER_NAME", env.str, "GPU Console (sandbox seller)")
INVOICE_SELLER_TAX_ID: str = _get("INVOICE_SELLER_TAX_ID", env.str, "91110108MA01ABCD2H")
# Notices (console/notices/): SMS through a backend; the embedded default writes each message to
# var/sms/ as mail goes to var/mail/ (a provider's backend implements send(phone, text)).
SMS_BACKEND: str = _get("SMS_BACKEND", env.str, "console.notices.sms.FileBackend")
SMS_FILE_PATH = Path(_get("SMS_FILE_PATH", env.str, str(STATE_DIR / "sms")))
# 对公转账: the account customers pay by bank transfer (billing/transfers/).
BANK_TRANSFER_ACCOUNT_NAME: str = _get(
    "BANK_TRANSFER_ACCOUNT_NAME", env.str, "GPU Console (sandbox account)"
)
BANK_TRANSFER_BANK: str = _get("BANK_TRANSFER_BANK", env.str, "Sandbox Bank, Beijing branch")
BANK_TRANSFER_ACCOUNT_NUMBER: str = _get(
    "BANK_TRANSFER_ACCOUNT_NUMBER", env.str, "6222 0000 0000 0000 000"
)
