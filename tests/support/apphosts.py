"""Web ports on their own hosts (issue 29), as a browser reaches them in tests: the console's Open
button or share link, then the one-time hand-off on the app host ``<id>-<port>.localhost``
(a client of its own, as the console's cookies are host-only)."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
from asgiref.sync import async_to_sync
from django.test import Client

from slices.models import Instance, InstanceNode, Node
from slices.services import ports
from tests.slices.factories import load_small_fleet, make_instance

APP_PORT = 7860


def running_with_port(owner, port: int = APP_PORT, **fields) -> Instance:
    """A running sim instance with one declared web port and its node."""
    if not Node.objects.exists():
        load_small_fleet()
    instance = make_instance(
        owner, web_ports=[{"port": port, "name": "Gradio"}], access_token="tok", **fields
    )
    node = Node.objects.order_by("pk").first()
    InstanceNode.objects.create(
        instance=instance, node=node, rank=0, hostname=node.hostname, gpu_mask=1, step="ready"
    )
    return instance


def console_url(instance: Instance, rest: str = "", port: int = APP_PORT) -> str:
    """The console's own route of a port (which only ever redirects)."""
    return f"/instances/{instance.public_id}/ports/{port}/{rest}"


def app_host(instance: Instance, port: int = APP_PORT) -> str:
    return f"{instance.public_id}-{port}.localhost"


def follow_handoff(location: str, **headers: str) -> Client:
    """A browser on the app host (a client of its own: the console's cookies are host-only, so
    the app host is never sent them) that followed the console's hand-off ``location``."""
    url = urlsplit(location)
    assert url.scheme == "http" and url.hostname and url.hostname.endswith(".localhost"), location
    app = Client(HTTP_HOST=url.netloc, **headers)
    landed = app.get(f"{url.path}?{url.query}")
    assert landed.status_code == 302, landed.content
    assert ports.APP_COOKIE in landed.cookies
    return app


def open_app(
    console: Client, instance: Instance, port: int = APP_PORT, next_path: str = ""
) -> Client:
    """The owner clicks Open: the console hands them over to the port's own host."""
    query = f"?next={next_path}" if next_path else ""
    opened = console.get(f"/instances/{instance.public_id}/web-ports/{port}/open/{query}")
    assert opened.status_code == 302, opened.content
    assert urlsplit(opened["Location"]).hostname == app_host(instance, port)
    return follow_handoff(opened["Location"])


def body_of(response) -> bytes:  # noqa: ANN001
    """A proxied response's whole body (its stream is asynchronous)."""
    if not response.streaming:
        return bytes(response.content)

    async def collect() -> bytes:
        return b"".join([bytes(c) async for c in response.streaming_content])

    return async_to_sync(collect)()


def app_host_httpx(console_url: str, instance: Instance, port: int) -> httpx.Client:
    """An HTTP client on the live console's app host of ``port`` (this machine's resolver does
    not map ``*.localhost`` as browsers do, so it connects to 127.0.0.1 naming the host)."""
    number = urlsplit(console_url).port
    return httpx.Client(
        base_url=f"http://127.0.0.1:{number}",
        headers={"Host": f"{app_host(instance, port)}:{number}"},
        timeout=60,
    )


def open_app_httpx(
    console: httpx.Client, console_url: str, instance: Instance, port: int
) -> httpx.Client:
    """The owner's Open on the live console, then the hand-off on the app host."""
    opened = console.get(
        f"{console_url}/instances/{instance.public_id}/web-ports/{port}/open/",
        follow_redirects=False,
    )
    assert opened.status_code == 302, opened.text
    url = urlsplit(opened.headers["location"])
    assert url.hostname == app_host(instance, port)
    app = app_host_httpx(console_url, instance, port)
    landed = app.get(f"{url.path}?{url.query}")
    assert landed.status_code == 302 and ports.APP_COOKIE in app.cookies, landed.text
    return app
