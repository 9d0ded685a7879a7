"""Web ports through the console (issues 19, 29) on the simulated fleet: declared at order time,
served by the proxy on each port's own host (<id>-<port>.localhost, a site apart from the
console's) with the sim driver's stand-in app (real HTTP over a socket tunnel: a page, a streamed
download, Server-Sent Events, an upload, a websocket), owner-only through a one-time hand-off,
share links that stop working when revoked, and 404 for everyone else."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import paramiko
import pytest
from asgiref.sync import async_to_sync
from channels.auth import AuthMiddlewareStack
from django.test import Client
from rest_framework.test import APIClient

from console.routing import OriginValidator, websocket_router
from slices.drivers.base import NodeTarget
from slices.drivers.ssh import SshDriver, SshSettings, tunnel
from slices.errors import OrderRefused
from slices.models import Instance, ShareLink
from slices.proxy import AsyncTunnel, UpstreamWebsocket
from slices.services import ports
from tests.support import servers
from tests.support.apphosts import app_host, follow_handoff, open_app, running_with_port
from tests.support.sshd import SshHostPool, ssh_hosts  # noqa: F401
from tests.support.websocket import open_websocket, websocket_scope

pytestmark = pytest.mark.django_db

APP_PORT = 7860


def _url(instance: Instance, rest: str = "", port: int = APP_PORT) -> str:
    """The console's own route of a port (which only ever redirects)."""
    return f"/instances/{instance.public_id}/ports/{port}/{rest}"


def _chunks(response) -> list[bytes]:
    """A streamed response's chunks as the server sends them (the proxy's are asynchronous)."""
    if not response.streaming:
        return [response.content]

    async def collect() -> list[bytes]:
        return [bytes(c) async for c in response.streaming_content]

    return async_to_sync(collect)()


def _body(response) -> bytes:
    return b"".join(_chunks(response))


# -- order time --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ([{"port": 80}], "between 1024 and 65535"),
        ([{"port": 30022}], "SSH"),
        ([{"port": 7860}, {"port": 7860}], "twice"),
        ([{"port": "abc"}], "not a port number"),
        ([{"port": 7000 + i} for i in range(11)], "At most 10"),
        ([{"port": 7860, "name": "bad\u202ename"}], "invisible"),
    ],
)
def test_bad_web_ports_are_refused_naming_the_field(value, fragment) -> None:
    with pytest.raises(OrderRefused) as caught:
        ports.clean_web_ports(value)
    assert caught.value.params.get("field") == "web_ports" or "web_ports" in str(
        caught.value.__dict__
    )
    assert fragment in caught.value.template % caught.value.params


def test_good_web_ports_are_kept_with_names() -> None:
    assert ports.clean_web_ports([{"port": "7860", "name": " Gradio "}, {"port": 8000}]) == [
        {"port": 7860, "name": "Gradio"},
        {"port": 8000, "name": "Port 8000"},
    ]
    assert ports.parse_web_ports_text("7860 Gradio, 8000 API server\n9000") == [
        {"port": "7860", "name": "Gradio"},
        {"port": "8000", "name": "API server"},
        {"port": "9000", "name": ""},
    ]


def test_the_api_orders_with_web_ports_and_answers_their_urls(
    sim_fleet, funded, django_capture_on_commit_callbacks
) -> None:
    api = APIClient(HTTP_ACCEPT_LANGUAGE="en")
    api.force_authenticate(funded)
    order = {"gpu_model": "RTX4090", "cards": 1}
    bad = api.post("/api/v1/instances/", {**order, "web_ports": [{"port": 22}]}, format="json")
    assert bad.status_code == 400, bad.content
    assert list(bad.json()["fields"]) == ["web_ports"]
    assert not Instance.objects.filter(created_by=funded).exists()
    with django_capture_on_commit_callbacks(execute=True):
        ok = api.post(
            "/api/v1/instances/", {**order, "web_ports": [{"port": 7860, "name": "Gradio"}]},
            format="json",
        )  # fmt: skip
    assert ok.status_code == 202, ok.content
    instance = Instance.objects.get(created_by=funded)
    assert instance.web_ports == [{"port": 7860, "name": "Gradio"}]
    assert len(instance.access_token) >= 32
    body = api.get(f"/api/v1/instances/{instance.public_id}/").json()
    assert body["state"] == "running"
    assert body["ports"] == [
        {
            "port": 7860,
            "name": "Gradio",
            "kind": "declared",
            "url": f"http://{instance.public_id}-7860.localhost/",
            "share_links": [],
        }
    ]


# -- the proxy (sim) ---------------------------------------------------------------------------


def test_the_owner_opens_the_simulated_app_on_its_own_host(alice, alice_client) -> None:
    instance = running_with_port(alice)
    app = open_app(alice_client, instance)
    page = app.get("/")
    assert page.status_code == 200
    text = _body(page).decode()
    assert "(simulated)" in text and "port 7860" in text
    # The app is at "/" of its own host.
    assert "Path: <code>/</code>" in text


def test_the_app_host_keeps_the_port_the_browser_used(alice) -> None:
    """Behind the edge the web process listens on a port of its own (WEB_PORT, 8001 here) while
    the browser reached nginx on another: the hand-off and the API's URLs name the browser's
    port (the Host header), never the web process's (Django's SERVER_PORT)."""
    instance = running_with_port(alice)
    console = Client(HTTP_HOST="127.0.0.1:8443", SERVER_PORT="8001")
    console.force_login(alice)
    opened = console.get(f"/instances/{instance.public_id}/web-ports/{APP_PORT}/open/")
    assert opened.status_code == 302
    assert urlsplit(opened["Location"]).netloc == f"{app_host(instance)}:8443"
    api = APIClient(HTTP_HOST="127.0.0.1:8443", SERVER_PORT="8001")
    api.force_authenticate(alice)
    body = api.get(f"/api/v1/instances/{instance.public_id}/").json()
    assert body["ports"][0]["url"] == f"http://{app_host(instance)}:8443/"
    # A Host without a port: the scheme's own (no port in the URL), whatever SERVER_PORT says.
    plain = APIClient(HTTP_HOST="127.0.0.1", SERVER_PORT="8001")
    plain.force_authenticate(alice)
    body = plain.get(f"/api/v1/instances/{instance.public_id}/").json()
    assert body["ports"][0]["url"] == f"http://{app_host(instance)}/"


def test_the_console_routes_of_a_port_only_redirect_to_its_host(alice, alice_client) -> None:
    """Issue 29: the console's origin never serves a tenant's app, only sends the owner on."""
    instance = running_with_port(alice)
    for rest in ("", "download?size=10", "sw.js"):
        answer = alice_client.get(_url(instance, rest))
        assert answer.status_code == 302
        assert answer["Location"].startswith(
            f"/instances/{instance.public_id}/web-ports/{APP_PORT}/open/?next="
        )
        assert not answer.streaming and b"simulated" not in answer.content
    opened = alice_client.get(answer["Location"])
    assert urlsplit(opened["Location"]).hostname == app_host(instance)
    assert "next=%2Fsw.js" in opened["Location"]


def test_a_download_streams_intact(alice, alice_client) -> None:
    instance = running_with_port(alice)
    app = open_app(alice_client, instance)
    size = 8 * 1024 * 1024 + 123
    response = app.get(f"/download?size={size}")
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Length"] == str(size)
    digest, total = hashlib.sha256(), 0
    for chunk in _chunks(response):
        digest.update(chunk)
        total += len(chunk)
    block = bytes(range(256)) * 256
    expected = hashlib.sha256()
    left = size
    while left:
        expected.update(block[: min(left, len(block))])
        left -= min(left, len(block))
    assert (total, digest.hexdigest()) == (size, expected.hexdigest())


def test_server_sent_events_arrive_as_events(alice, alice_client) -> None:
    instance = running_with_port(alice)
    response = open_app(alice_client, instance).get("/events")
    assert response["Content-Type"] == "text/event-stream"
    chunks = _chunks(response)
    assert len(chunks) >= 5  # one per event: nothing buffered them into one
    assert b"".join(chunks).count(b"data: simulated tick") == 5


def test_an_upload_reaches_the_app_whole(alice, alice_client) -> None:
    instance = running_with_port(alice)
    payload = bytes(range(256)) * 4096 + b"end"
    response = open_app(alice_client, instance).post(
        "/upload", data=payload, content_type="application/octet-stream"
    )
    assert response.status_code == 200
    body = _body(response)
    assert hashlib.sha256(payload).hexdigest().encode() in body
    assert f'"bytes": {len(payload)}'.encode() in body


def test_a_cross_site_request_never_reaches_the_app(alice, alice_client) -> None:
    """The proxy answers the app's own authentication for the owner, so another site's page must
    not be able to make the owner's browser change anything through it: refused by Origin (or
    Referer), whatever the cookie; the same request from the app's own pages goes through."""
    instance = running_with_port(alice)
    app = open_app(alice_client, instance)
    payload = b"x" * 100
    for headers in (
        {"HTTP_ORIGIN": "https://evil.example"},
        {"HTTP_REFERER": "https://evil.example/page"},
        {"HTTP_ORIGIN": "http://testserver"},  # the console itself is another site too
    ):
        refused = app.post("/upload", data=payload, content_type="text/plain", **headers)
        assert refused.status_code == 403, headers
        assert b"sha256" not in refused.content
    own = app.post(
        "/upload",
        data=payload,
        content_type="text/plain",
        HTTP_ORIGIN=f"http://{app_host(instance)}",
    )
    assert own.status_code == 200 and hashlib.sha256(payload).hexdigest().encode() in _body(own)
    # Reading stays open to a link from anywhere (a GET changes nothing).
    assert app.get("/", HTTP_REFERER="https://elsewhere.example/").status_code == 200


def test_another_customer_a_visitor_and_a_released_instance_get_404(
    alice, alice_client, bob_client, client
) -> None:
    instance = running_with_port(alice)
    stranger = Client(HTTP_HOST=app_host(instance))
    for method in ("get", "post", "put", "delete"):
        assert getattr(stranger, method)("/").status_code == 404
    # Another customer cannot open it; nor can a visitor (sent to log in).
    assert (
        bob_client.get(f"/instances/{instance.public_id}/web-ports/{APP_PORT}/open/").status_code
        == 404
    )
    assert (
        client.get(f"/instances/{instance.public_id}/web-ports/{APP_PORT}/open/").status_code == 302
    )
    # A port the instance does not have: neither its host nor its Open link.
    assert (
        alice_client.get(f"/instances/{instance.public_id}/web-ports/7861/open/").status_code == 404
    )
    app = open_app(alice_client, instance)
    assert app.get("/").status_code == 200
    # The owner's cookie is for its one port: another port's host does not take it.
    other = Client(HTTP_HOST=app_host(instance, 7861))
    other.cookies = app.cookies
    assert other.get("/").status_code == 404
    Instance.objects.filter(pk=instance.pk).update(state="released")
    assert app.get("/").status_code == 404
    assert (
        alice_client.get(f"/instances/{instance.public_id}/web-ports/7860/open/").status_code == 404
    )


def test_the_console_cookies_are_not_forwarded() -> None:
    from slices.proxy import forward_headers

    out = forward_headers(
        [("Cookie", "sessionid=s; csrftoken=c; gpc_app=x; _xsrf=j"), ("Connection", "x")],
        drop_cookies=frozenset({"sessionid", "csrftoken", "gpc_app"}),
    )
    assert out == [("Cookie", "_xsrf=j")]


# -- share links -------------------------------------------------------------------------------


def _make_link(console: Client, instance: Instance, lifetime: str = "") -> str:
    data = {"lifetime": lifetime} if lifetime else {}
    made = console.post(
        f"/instances/{instance.public_id}/web-ports/{APP_PORT}/share-links/",
        data,
        HTTP_HX_REQUEST="true",
    )
    assert made.status_code == 200, made.content
    return made.content.decode().split("/shared/ports/")[1].split("/")[0]


def _visit(secret: str) -> Client:
    """A visitor follows a share link: on the console, then on to the app host."""
    opened = Client().get(f"/shared/ports/{secret}/")
    assert opened.status_code == 302
    assert opened["Referrer-Policy"] == "no-referrer"
    return follow_handoff(opened["Location"])


def test_a_share_link_opens_its_port_until_revoked(alice, alice_client, bob_client) -> None:
    instance = running_with_port(alice)
    secret = _make_link(alice_client, instance)
    link = ShareLink.objects.get(instance=instance)
    assert hashlib.sha256(secret.encode()).hexdigest() == link.token_hash
    assert secret not in link.token_hash
    # Another customer cannot make or revoke one.
    assert (
        bob_client.post(
            f"/instances/{instance.public_id}/web-ports/{APP_PORT}/share-links/"
        ).status_code
        == 404
    )
    assert (
        bob_client.post(
            f"/instances/{instance.public_id}/share-links/{link.pk}/revoke/"
        ).status_code
        == 404
    )

    visitor = _visit(secret)
    assert visitor.get("/").status_code == 200
    ShareLink.objects.filter(pk=link.pk).update(last_used_at=None)
    assert visitor.get("/download?size=10").status_code == 200
    assert ShareLink.objects.get(pk=link.pk).last_used_at is not None
    assert Client().get("/shared/ports/not-a-secret/").status_code == 404

    revoked = alice_client.post(f"/instances/{instance.public_id}/share-links/{link.pk}/revoke/")
    assert revoked.status_code == 302
    assert visitor.get("/").status_code == 404
    assert Client().get(f"/shared/ports/{secret}/").status_code == 404


# -- websockets --------------------------------------------------------------------------------


def _ws(
    instance: Instance, cookie: str | None, *, host: str | None = None, path: str = "/ws/echo"
) -> list[str] | None:
    from slices.port_views import AppHostRouter

    app = AppHostRouter(OriginValidator(AuthMiddlewareStack(websocket_router())))
    host = host or app_host(instance)
    headers = [(b"origin", f"http://{host}".encode()), (b"host", host.encode())]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    scope = websocket_scope(path, headers=headers, client=("127.0.0.1", 50000), server=(host, 80))

    async def attempt() -> list[str] | None:
        communicator, first = await open_websocket(app, scope)
        if first["type"] != "websocket.accept":
            await communicator.wait(timeout=5)
            return None
        await communicator.send_input({"type": "websocket.receive", "text": "你好 42"})
        reply = await communicator.receive_output(timeout=5)
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=5)
        return [reply.get("text", "")]

    return async_to_sync(attempt)()


@pytest.mark.django_db(transaction=True)
def test_websockets_relay_for_the_owner_only(alice, alice_client, bob_client) -> None:
    instance = running_with_port(alice)
    app = open_app(alice_client, instance)
    grant = f"{ports.APP_COOKIE}={app.cookies[ports.APP_COOKIE].value}"
    assert _ws(instance, grant) == ["simulated echo: 你好 42"]
    # The console's own session opens nothing on the app host, nor on the console's host.
    assert _ws(instance, f"sessionid={alice_client.cookies['sessionid'].value}") is None
    assert _ws(instance, f"sessionid={bob_client.cookies['sessionid'].value}") is None
    assert _ws(instance, None) is None
    assert _ws(instance, grant, host="testserver", path=_url(instance, "ws/echo")) is None
    # Another name under the apps' domain is nobody's.
    assert _ws(instance, grant, host="evil.localhost") is None


# -- the relay over a real SSH tunnel ----------------------------------------------------------


@pytest.fixture
def ws_echo_app() -> Iterator[int]:
    """A websocket app on this machine (which is the sshd test host's "node"): echoes every
    message, and pings every few milliseconds, as busy apps and Jupyter's keepalive do."""
    from websockets.sync.server import serve

    def echo(ws) -> None:  # noqa: ANN001
        for message in ws:
            ws.send(message)

    server = serve(echo, "127.0.0.1", servers.free_port(), max_size=None, ping_interval=0.005)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.socket.getsockname()[1]
    server.shutdown()
    thread.join(timeout=10)


def test_websocket_messages_larger_than_the_ssh_window_survive_pings_in_both_directions(
    ssh_hosts: SshHostPool,  # noqa: F811
    ws_echo_app: int,
) -> None:
    """Through a paramiko ``direct-tcpip`` channel, as the proxy relays Jupyter's kernels: a
    message several SSH windows long goes out in pieces while the app's pings arrive, and the
    pongs wait for it (a pong sent between two pieces would corrupt the frame and the app would
    drop the connection); a burst of small messages and the big one all come back, in order."""
    host = ssh_hosts.get(1)[0]
    driver = SshDriver(SshSettings(key_file=str(ssh_hosts.client_key), connect_timeout=5.0))
    node = NodeTarget(
        hostname="tunnel-n01",
        address=host.address,
        port=host.port,
        host_key=host.host_key_line,
        rank=0,
        gpus=(),
        runtime="process",
    )
    window = paramiko.common.DEFAULT_WINDOW_SIZE
    big = os.urandom(4 * window + 12345)
    burst = [f"消息 {i}" for i in range(200)]

    async def relay() -> list[tuple[str | None, bytes | None]]:
        # The channel itself (the driver's open_tunnel also asks whether the port is an
        # instance's: this app is the test machine's own, which it refuses).
        raw = await asyncio.to_thread(tunnel.open_channel, driver, node, ws_echo_app)
        upstream = UpstreamWebsocket(AsyncTunnel(raw))
        assert await upstream.connect(f"127.0.0.1:{ws_echo_app}", "/", [], [])
        got: list[tuple[str | None, bytes | None]] = []

        async def pump() -> None:  # as PortProxyConsumer._pump: the app's messages, meanwhile
            async for message in upstream.messages():
                got.append(message)
                if len(got) == 2 * len(burst) + 2:
                    return

        task = asyncio.create_task(pump())
        for _ in range(2):
            for text in burst:
                await upstream.send(text, None)
            await upstream.send(None, big)
        await asyncio.wait_for(task, timeout=120)
        await upstream.close()
        return got

    try:
        got = asyncio.run(relay())
    finally:
        tunnel.close_all()
    expected = [(t, None) for t in burst] + [(None, big)]
    assert len(got) == len(expected) * 2
    assert got == expected * 2
