"""An instance's history: events appended (never updated) and broadcast once their transaction
commits. The bottom of the services: every action records here, and it imports no other service."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from slices import events
from slices.choices import EventKind, EventLevel
from slices.models import Instance, InstanceEvent


def record_event(
    instance: Instance,
    kind: str,
    *,
    code: str = "",
    params: dict[str, Any] | None = None,
    text: str = "",
    step: str = "",
    node: str = "",
    level: str = EventLevel.INFO,
    at: datetime | None = None,
) -> InstanceEvent:
    """Append one event (never updated) and broadcast it once the transaction commits."""
    event = InstanceEvent.objects.create(
        instance=instance,
        at=at or timezone.now(),
        kind=kind,
        code=code,
        params=params or {},
        text=text[:4000],
        step=step,
        node=node,
        level=level,
    )
    events.broadcast_event_on_commit(instance, event)
    return event


def record_logs(instance: Instance, lines: list[tuple[str, str, str]]) -> None:
    """Append node log lines (node, step, text) in one INSERT and broadcast them on commit, in
    one message."""
    if not lines:
        return
    now = timezone.now()
    rows = InstanceEvent.objects.bulk_create(
        [
            InstanceEvent(
                instance=instance, at=now, kind=EventKind.LOG, node=n, step=s, text=t[:4000]
            )
            for n, s, t in lines
        ]
    )
    events.broadcast_logs_on_commit(instance, rows)


def record_output(instance: Instance, node: str, step: str, lines: list[str]) -> None:
    """A workload's output lines (an app's start-up, a recipe's run) as log events, and
    ``output_read`` advanced with them in one transaction: the follower reads on from the field."""
    if not lines:
        return
    with transaction.atomic():
        record_logs(instance, [(node, step, line) for line in lines])
        Instance.objects.filter(pk=instance.pk).update(output_read=F("output_read") + len(lines))
        instance.output_read += len(lines)
