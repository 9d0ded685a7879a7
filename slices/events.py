"""Typed broadcasts of instance changes to browsers, sent on commit (the database is the truth).

Group ``instance.<uuid>`` (the instance page) gets every event; the owner's user group gets state
changes (the list page, notifications). A browser that reconnects reloads from the database.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from channels.layers import get_channel_layer
from django.db import transaction

from console import layer_loop
from console.events import notify_user

if TYPE_CHECKING:
    from slices.models import Instance, InstanceEvent

logger = logging.getLogger(__name__)

# A broadcast is best effort: one that the channel layer has not taken within this is dropped.
SEND_TIMEOUT_SECONDS = 5.0


def instance_group(public_id: object) -> str:
    return f"instance.{public_id}"


def _send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        # Queued on the process's one layer loop, in order (console.layer_loop): neither a new
        # thread, loop and Redis connection for each message, nor the caller (the thread that
        # records every node's steps) waiting for the channel layer. A message the layer drops
        # is logged there; pages reload from the database.
        layer_loop.post(
            layer.group_send(group, message),
            timeout=SEND_TIMEOUT_SECONDS,
            what=f"broadcast to {group}",
        )
    except Exception:  # the channel layer may drop messages; pages reload from the database
        logger.debug("broadcast to %s dropped", group, exc_info=True)


def _event_payload(event: InstanceEvent) -> dict[str, Any]:
    return {
        "id": event.pk,
        "kind": event.kind,
        "level": event.level,
        "step": event.step,
        "node": event.node,
        "code": event.code,
        "params": event.params,
        "text": event.text,
        "at": event.at.isoformat(),
    }


def _message(kind: str, payload: Any) -> dict[str, Any]:
    return {"type": "instance.message", "kind": kind, "payload": payload}


def _send_on_commit(instance: Instance, kind: str, payload: Any) -> None:
    """Send ``kind`` with ``payload`` to the instance's page once the transaction commits."""
    group = instance_group(instance.public_id)
    transaction.on_commit(lambda: _send(group, _message(kind, payload)))


def broadcast_event_on_commit(instance: Instance, event: InstanceEvent) -> None:
    _send_on_commit(instance, "event", _event_payload(event))


def broadcast_logs_on_commit(instance: Instance, rows: list[InstanceEvent]) -> None:
    """Log lines flushed together go out as one ``logs`` message (a list of events), not one
    channel-layer message per line: a chatty image start is a burst of hundreds of lines."""
    if rows:
        _send_on_commit(instance, "logs", [_event_payload(row) for row in rows])


def broadcast_progress_on_commit(instance: Instance) -> None:
    _send_on_commit(instance, "progress", {})


def broadcast_state_on_commit(instance: Instance) -> None:
    group = instance_group(instance.public_id)
    payload = {"instance": str(instance.public_id), "state": instance.state, "name": instance.name}
    owner = getattr(instance.created_by, "public_id", None)

    def send() -> None:
        _send(group, _message("state", payload))
        if owner is not None:
            try:
                notify_user(owner, "instance.state", payload)
            except Exception:  # best effort, like every broadcast
                logger.debug("notification dropped", exc_info=True)

    transaction.on_commit(send)


def broadcast_job_on_commit(instance: Instance, job: Any, text: str) -> None:
    """A Slurm job's new state and the output the follower just read (``text``: only the new
    part), to the instance's page and its job pages (issue 31)."""
    _send_on_commit(
        instance,
        "job",
        {
            "id": str(job.public_id),
            "slurm_id": job.slurm_id,
            "state": job.group,
            "slurm_state": job.slurm_state,
            "exit_code": job.exit_code,
            "text": text,
        },
    )
