"""Billing's periodic work: thin wrappers over services, safe to run twice (see services)."""

from __future__ import annotations

from celery import shared_task

from billing import services


@shared_task(acks_late=True, ignore_result=True)
def settle_usage_task() -> str:
    """Charge every open usage session up to now (Celery beat, every 60 s by default).

    Two beats or a redelivered message are harmless: a second run finds nothing left to charge.
    """
    result = services.settle_usage()
    return f"{result.sessions} sessions, {result.charged} 元, {len(result.stopped)} stopped"


@shared_task(acks_late=True, ignore_result=True)
def expire_vouchers_task() -> int:
    return services.expire_vouchers()
