"""The one way a service schedules work for the worker: by the task's registered name.

Services never import ``slices.tasks`` (the tasks import the services: that was the cycle). The
task module is loaded by ``SlicesConfig.ready`` in every process (web, worker, beat), so its
tasks are in the Celery app's registry under their names (``slices.tasks.<function>``).
``enqueue`` publishes now (a broker error goes up to the caller, which retries its pass);
``enqueue_on_commit`` publishes once the caller's transaction commits, so a worker never sees a
row its transaction has not written yet (and a rolled-back change schedules nothing).
"""

from __future__ import annotations

from typing import Any

from celery import current_app
from django.db import transaction


def enqueue(task_name: str, *args: Any) -> None:
    """Queue the task called ``task_name`` with ``args`` now."""
    current_app.tasks[task_name].delay(*args)


def enqueue_on_commit(task_name: str, *args: Any) -> None:
    """Queue the task called ``task_name`` with ``args`` when the current transaction commits."""
    transaction.on_commit(lambda: enqueue(task_name, *args))
