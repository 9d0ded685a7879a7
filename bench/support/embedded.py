"""The embedded console as the benchmarks run it in their own process: Django on a throw-away SQLite
file, no PostgreSQL or Redis URL from the environment, the simulated steps instant and retried at
once, tasks run inline."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import django
from django.core.management import call_command

from console.celery import app as celery_app


def setup_embedded_django(work: Path, **env: str) -> None:
    """``django.setup()`` on the embedded settings over ``work``/bench.sqlite3, ``env`` on top."""
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="console.settings",
        SQLITE_PATH=str(work / "bench.sqlite3"),
        SIM_TIME_SCALE="0",
        SLICES_RETRY_BACKOFF_SECONDS="0",
        EMBEDDED_WORKER="false",
        LOG_LEVEL="WARNING",
        **env,
    )
    django.setup()


def migrate_with_shipped_fleet() -> float:
    """Tasks inline, the database migrated and the shipped fleet loaded; the seconds it took."""
    celery_app.conf.task_always_eager = True
    celery_app.conf.task_eager_propagates = True
    t0 = time.perf_counter()
    call_command("migrate", verbosity=0, interactive=False)
    call_command("load_fleet", verbosity=0, stdout=io.StringIO())
    return time.perf_counter() - t0
