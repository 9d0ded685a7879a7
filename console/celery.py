"""The Celery application. Configuration comes from Django settings (``CELERY_*``).

Every task runs under soft and hard time limits (``CELERY_TASK_SOFT_TIME_LIMIT`` /
``CELERY_TASK_TIME_LIMIT``, shorter ones per task in slices/tasks.py); the prefork pool of
``celery worker`` enforces them, the embedded worker's thread pool cannot (console/embedded.py).
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
