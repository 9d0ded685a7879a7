"""Websockets: unknown paths and bad frames end with a close code, never a 500 or a dropped socket.

In-process through asgiref's ``ApplicationCommunicator`` (what Channels' ``WebsocketCommunicator``
does; its package needs daphne, which we do not install); the same cases against the real server
process are in ``test_server_hardening.py``.
"""

from __future__ import annotations

import json

import pytest
from asgiref.testing import ApplicationCommunicator

from console.consumers import (
    CLOSE_BAD_REQUEST,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_NOT_FOUND,
    CLOSE_UNAUTHENTICATED,
    CLOSE_UNSUPPORTED_DATA,
)
from console.routing import websocket_router
from tests.support.servers import run_async
from tests.support.websocket import open_websocket, websocket_scope

pytestmark = pytest.mark.django_db(transaction=True)

DEEP_JSON = '{"a":' * 1000 + "1" + "}" * 1000


async def _connect(path: str, user: object) -> ApplicationCommunicator:
    communicator, accepted = await open_websocket(
        websocket_router(), websocket_scope(path, user=user)
    )
    assert accepted["type"] == "websocket.accept", accepted
    return communicator


async def _closed_with(path: str, user: object, frame: dict | None) -> int:
    communicator = await _connect(path, user)
    if frame is not None:
        hello = await communicator.receive_output(timeout=5)
        assert json.loads(hello["text"])["kind"] == "hello"
        await communicator.send_input({"type": "websocket.receive", **frame})
    closed = await communicator.receive_output(timeout=5)
    assert closed["type"] == "websocket.close", closed
    await communicator.send_input({"type": "websocket.disconnect", "code": closed["code"]})
    await communicator.wait(timeout=5)  # the consumer finished without an exception
    return closed["code"]


@pytest.mark.parametrize(
    "path", ["/ws/nope/", "/ws/", "/ws/notifications/x/", "/anything", "/ws/%00"]
)
def test_unknown_path_closes_with_4404(path: str, alice) -> None:
    assert run_async(_closed_with(path, alice, None)) == CLOSE_NOT_FOUND


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"text": "not json"}, CLOSE_BAD_REQUEST),
        ({"text": "[1, 2]"}, CLOSE_BAD_REQUEST),
        ({"text": '"a string"'}, CLOSE_BAD_REQUEST),
        ({"text": DEEP_JSON}, CLOSE_BAD_REQUEST),
        ({"text": "[" * 100_000}, CLOSE_MESSAGE_TOO_BIG),
        ({"text": json.dumps({"pad": "x" * (1024 * 1024)})}, CLOSE_MESSAGE_TOO_BIG),
        ({"bytes": b"\x00\x01binary"}, CLOSE_UNSUPPORTED_DATA),
        ({"bytes": b'{"kind": "ping"}'}, CLOSE_UNSUPPORTED_DATA),
    ],
)
def test_bad_frame_closes_the_notifications_socket_with_a_code(
    frame: dict, code: int, alice
) -> None:
    assert run_async(_closed_with("/ws/notifications/", alice, frame)) == code


def test_a_well_formed_object_keeps_the_socket_open(alice) -> None:
    async def run() -> None:
        communicator = await _connect("/ws/notifications/", alice)
        await communicator.receive_output(timeout=5)  # hello
        await communicator.send_input({"type": "websocket.receive", "text": '{"kind": "ping"}'})
        assert await communicator.receive_nothing(timeout=0.2)
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=5)

    run_async(run())


@pytest.mark.parametrize(
    "path",
    [
        "/ws/notifications/",
        "/ws/instances/00000000-0000-4000-8000-000000000000/",
        "/ws/instances/00000000-0000-4000-8000-000000000000/terminal/",
        "/ws/telemetry/instances/00000000-0000-4000-8000-000000000000/",
        "/ws/telemetry/clusters/yinchuan-a800/",
    ],
)
def test_every_console_socket_refuses_a_visitor_with_4401(path: str) -> None:
    """One login check (``LayerConsumer.signed_in_user``) guards every socket of the console."""
    from django.contrib.auth.models import AnonymousUser

    async def handshake() -> int:
        communicator, first = await open_websocket(
            websocket_router(), websocket_scope(path, user=AnonymousUser())
        )
        assert first["type"] == "websocket.close", first
        await communicator.wait(timeout=5)
        return first["code"]

    assert run_async(handshake()) == CLOSE_UNAUTHENTICATED
