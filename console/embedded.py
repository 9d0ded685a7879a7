"""The embedded default's background worker: a real Celery worker and beat inside the web process.

With no services configured, the console still runs tasks asynchronously: the ASGI process starts a
Celery ``WorkController`` (thread pool) consuming from kombu's in-memory transport, and beat as a
thread, so the same ``@shared_task`` code and ``.delay()`` calls as production run in the background.
Production never calls this (settings refuse ``EMBEDDED_WORKER`` there); it runs ``celery worker`` and
``celery beat`` as processes.

Time limits: the thread pool cannot stop a thread, so Celery's soft and hard time limits
(``CELERY_TASK_SOFT_TIME_LIMIT``/``CELERY_TASK_TIME_LIMIT`` and the follower's own) are not enforced
here; a prefork worker enforces them. What keeps these few threads serving every customer is that
no task waits or loops without a bound of its own: the recipe follower is one short pass per task
run (it queues itself again instead of sleeping in a thread), the simulated recipe costs O(1) per
read whatever its parameters, launches refuse parameters outside the recipe's bounds, and
provisioning is bounded by its step and SSH command timeouts and its attempts.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from django.conf import settings

logger = logging.getLogger(__name__)

_started = threading.Event()
_lock = threading.Lock()


def start_embedded_worker() -> bool:
    """Start the in-process worker and beat once per process. Returns whether this call started them."""
    if not settings.EMBEDDED_WORKER:
        return False
    with _lock:
        if _started.is_set():
            return False
        _started.set()

    from celery import beat
    from celery.worker import WorkController

    from console.celery import app

    # The memory transport polls; 0.05 s keeps the demo snappy at negligible cost.
    app.conf.broker_transport_options = {
        **(app.conf.broker_transport_options or {}),
        "polling_interval": 0.05,
    }
    worker = WorkController(
        app=app,
        hostname="embedded@localhost",
        pool_cls="threads",
        concurrency=settings.EMBEDDED_WORKER_THREADS,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        loglevel=logging.INFO,
    )
    threading.Thread(target=worker.start, name="embedded-celery-worker", daemon=True).start()

    state_dir = Path(settings.STATE_DIR)  # created by the settings
    beat_service = beat.EmbeddedService(
        app, thread=True, schedule_filename=str(state_dir / "celerybeat-schedule")
    )
    beat_service.daemon = True
    beat_service.start()
    logger.info(
        "embedded Celery worker (%d threads) and beat started", settings.EMBEDDED_WORKER_THREADS
    )
    # Live GPU telemetry: the 1 Hz relay is a long-lived loop, not a task; here it is a thread.
    from slices.telemetry.relay import start_relay_thread

    start_relay_thread()
    return True
