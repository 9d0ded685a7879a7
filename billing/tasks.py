"""Billing's periodic work: thin wrappers over services, safe to run twice (see services).

A transient error (the database cut, Redis away: console/retries.py) retries the whole run in
place, then the task itself with backoff: a settlement is one transaction, so a run that met one
either committed (the retry finds nothing left to charge up to that second) or rolled back (the
retry charges it); nothing is lost or charged twice, and the next beat catches up regardless.
"""

from __future__ import annotations

from celery import shared_task

from billing import services
from console.retries import TransientRetryTask, retry_transient


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def settle_usage_task() -> str:
    """Charge every open usage session up to now (Celery beat, every 60 s by default).

    Two beats or a redelivered message are harmless: a second run finds nothing left to charge.
    """
    result = retry_transient(services.settle_usage, what="settling usage")
    return f"{result.sessions} sessions, {result.charged} 元, {len(result.stopped)} stopped"


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def expire_vouchers_task() -> int:
    return retry_transient(services.expire_vouchers, what="expiring vouchers")
