"""Typed broadcasts to browsers. Call these on commit; the database stays the source of truth."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer


def user_group(public_id: object) -> str:
    return f"user.{public_id}"


def notify_user(public_id: object, kind: str, payload: dict[str, Any]) -> None:
    """Push a notification to every open console tab of one user (``NotificationsConsumer``)."""
    layer = get_channel_layer()
    async_to_sync(layer.group_send)(
        user_group(public_id), {"type": "notify", "kind": kind, "payload": payload}
    )
