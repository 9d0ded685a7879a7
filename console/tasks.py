from __future__ import annotations

import time

from celery import shared_task
from django.contrib.auth import get_user_model

from console.events import notify_user


@shared_task(name="console.ping_worker_task", ignore_result=True)
def ping_worker_task(user_id: int, token: str, delay: float = 0.5) -> None:
    """Round-trip check of the background worker: wait, then push the token to the user's tabs."""
    user = get_user_model().objects.filter(pk=user_id).only("public_id").first()
    if user is None:
        return  # the account is gone; nothing to tell
    time.sleep(min(max(delay, 0.0), 10.0))
    notify_user(user.public_id, "diagnostic.pong", {"token": token, "finished_at": time.time()})
