"""Tenant isolation derived from the URL configuration, the API router and the websocket routing.

Every route whose URL carries an object id (a ``<uuid:...>`` converter, or a parameter named
``pk``/``id``/``public_id``/``*_id``) must be registered in some app's ``tests/<app>/isolation.py``:

* ``OBJECT_ROUTES = {url_name: factory}``: customer-owned objects. ``factory(owner)`` creates one
  object owned by ``owner`` and returns the URL kwargs. Another customer must get 404 on every HTTP
  method (405 where the method is not allowed, never 403); the owner must reach it.
* ``STAFF_ROUTES = {url_name: factory}``: operator pages; a customer never gets a 2xx.
* ``EXEMPT_ROUTES = {url_name: "reason"}``: parameters that are not objects of a customer.
* ``WEBSOCKET_ROUTES = {route name or pattern text: factory(owner) -> path}``: anonymous users and
  other customers are refused, the owner connects.

A new route with an object id and no entry makes the ``*_is_covered`` tests fail.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.urls.converters import UUIDConverter
from django.urls.resolvers import RegexPattern, RoutePattern

from tests.support.websocket import open_websocket, websocket_scope

pytestmark = pytest.mark.django_db

APPS = ("console", "slices", "marketplace", "billing")
METHODS = ("get", "post", "put", "patch", "delete")
# URL parameters that never identify a customer's object.
NEUTRAL_PARAMS = {"format"}
# Objects in URLs are addressed by UUID (STYLE.md: public_id, never sequential keys); these
# parameter names also count as object ids whatever their converter.
OBJECT_PARAM_NAMES = {"pk", "id", "public_id", "uuid", "object_id"}
# Namespaces that customers never reach at all (checked below: they are sent to log in).
STAFF_NAMESPACES = ("admin",)


Factory = Callable[[Any], dict[str, Any]]


def _isolation_modules() -> Iterator[ModuleType]:
    """Each app's ``tests/<app>/isolation.py``, the apps without one skipped."""
    for app in APPS:
        try:
            yield importlib.import_module(f"tests.{app}.isolation")
        except ModuleNotFoundError as exc:
            if exc.name not in (f"tests.{app}", f"tests.{app}.isolation"):
                raise


def _registry() -> tuple[dict[str, Factory], dict[str, Factory], dict[str, str]]:
    routes: dict[str, Factory] = {}
    staff: dict[str, Factory] = {}
    exempt: dict[str, str] = {}
    for module in _isolation_modules():
        for name in getattr(module, "OBJECT_ROUTES", {}):
            assert name not in routes, f"{name} registered twice"
        routes.update(getattr(module, "OBJECT_ROUTES", {}))
        staff.update(getattr(module, "STAFF_ROUTES", {}))
        exempt.update(getattr(module, "EXEMPT_ROUTES", {}))
    return routes, staff, exempt


OBJECT_ROUTES, STAFF_ROUTES, EXEMPT_ROUTES = _registry()


@dataclass(frozen=True)
class ParamRoute:
    name: str
    params: frozenset[str]


def _is_object_param(name: str, converter: object | None) -> bool:
    return (
        isinstance(converter, UUIDConverter)
        or name in OBJECT_PARAM_NAMES
        or name.endswith(("_id", "_pk", "_uuid"))
    )


def _params(pattern: RoutePattern | RegexPattern) -> set[str]:
    """The parameters of one pattern that address an object (public slugs of catalogues do not)."""
    if isinstance(pattern, RoutePattern):
        return {n for n, c in pattern.converters.items() if _is_object_param(n, c)}
    return {n for n in pattern.regex.groupindex if _is_object_param(n, None)}


def iter_param_routes() -> Iterator[ParamRoute]:
    def walk(patterns: list, ns: str, inherited: set[str]) -> Iterator[ParamRoute]:
        for p in patterns:
            params = inherited | _params(p.pattern)
            if isinstance(p, URLResolver):
                sub_ns = f"{ns}{p.namespace}:" if p.namespace else ns
                yield from walk(p.url_patterns, sub_ns, params)
            elif isinstance(p, URLPattern):
                object_params = params - NEUTRAL_PARAMS
                if object_params:
                    name = f"{ns}{p.name}" if p.name else f"{ns}<unnamed {p.pattern}>"
                    yield ParamRoute(name, frozenset(object_params))

    yield from walk(get_resolver().url_patterns, "", set())


def _customer_routes() -> list[ParamRoute]:
    routes = {}
    for route in iter_param_routes():
        if route.name.split(":")[0] in STAFF_NAMESPACES:
            continue
        routes[route.name] = route
    return sorted(routes.values(), key=lambda r: r.name)


def test_every_route_with_a_parameter_is_covered() -> None:
    uncovered = [
        r.name
        for r in _customer_routes()
        if r.name not in OBJECT_ROUTES
        and r.name not in STAFF_ROUTES
        and r.name not in EXEMPT_ROUTES
    ]
    assert not uncovered, (
        "Routes with an object id but no tenant-isolation coverage; add a factory to "
        f"tests/<app>/isolation.py OBJECT_ROUTES or STAFF_ROUTES (or a reasoned EXEMPT_ROUTES entry): {uncovered}"
    )


def test_registry_names_only_existing_routes() -> None:
    names = {r.name for r in _customer_routes()}
    stale = sorted((set(OBJECT_ROUTES) | set(STAFF_ROUTES)) - names)
    assert not stale, f"OBJECT_ROUTES entries with no such route: {stale}"


def _statuses(client: Client, url: str) -> dict[str, int]:
    return {
        method: getattr(client, method)(url, data={}, content_type="application/json").status_code
        for method in METHODS
    }


@pytest.mark.parametrize("url_name", sorted(OBJECT_ROUTES))
def test_another_customer_gets_404_on_every_object_route(
    url_name: str,
    alice,
    bob,
    alice_client: Client,
    bob_client: Client,
) -> None:
    factory = OBJECT_ROUTES[url_name]
    url = reverse(url_name, kwargs=factory(alice))
    statuses = _statuses(bob_client, url)
    # Every method answers 404 (or 405 where the route does not take that method), never 403:
    # a 403 would confirm that the object exists.
    assert set(statuses.values()) <= {404, 405}, statuses
    assert 404 in statuses.values(), statuses

    # The factory made a real object: its owner reaches it on at least one method.
    own_url = reverse(url_name, kwargs=factory(alice))
    own = _statuses(alice_client, own_url)
    assert any(code not in (404, 405) for code in own.values()), own


@pytest.mark.parametrize("url_name", sorted(OBJECT_ROUTES))
def test_anonymous_visitors_never_reach_an_object_route(
    url_name: str, alice, client: Client
) -> None:
    url = reverse(url_name, kwargs=OBJECT_ROUTES[url_name](alice))
    for method, code in _statuses(client, url).items():
        assert code in (302, 401, 403, 404, 405), (method, url, code)


def test_customers_never_reach_staff_object_routes(
    operator,
    alice_client: Client,
    operator_client: Client,
) -> None:
    # One test looping over the table (it may be empty; an empty parametrize would be a skip).
    for url_name, factory in sorted(STAFF_ROUTES.items()):
        url = reverse(url_name, kwargs=factory(operator))
        statuses = _statuses(alice_client, url)
        assert all(code in (302, 403, 404, 405) for code in statuses.values()), (url, statuses)
        own = _statuses(operator_client, reverse(url_name, kwargs=factory(operator)))
        assert any(code not in (404, 405) and code < 500 for code in own.values()), (url, own)


def test_customers_are_sent_to_log_in_on_staff_pages(alice_client: Client) -> None:
    response = alice_client.get(reverse("admin:index"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


# --- websockets ---------------------------------------------------------------------------------
def _ws_registry() -> dict[str, Callable[[Any], str]]:
    routes: dict[str, Callable[[Any], str]] = {}
    for module in _isolation_modules():
        routes.update(getattr(module, "WEBSOCKET_ROUTES", {}))
    return routes


WEBSOCKET_ROUTES = _ws_registry()


def iter_websocket_param_routes() -> Iterator[ParamRoute]:
    """Websocket routes with parameters, keyed by name or, unnamed, by their pattern text."""
    from channels.routing import URLRouter

    from console.routing import websocket_urlpatterns

    def walk(patterns: list, prefix: str, inherited: set[str]) -> Iterator[ParamRoute]:
        for p in patterns:
            params = inherited | _params(p.pattern)
            text = prefix + str(p.pattern)
            if isinstance(p.callback, URLRouter):
                yield from walk(p.callback.routes, text, params)
            elif params - NEUTRAL_PARAMS:
                yield ParamRoute(p.name or text, frozenset(params - NEUTRAL_PARAMS))

    yield from walk(websocket_urlpatterns, "", set())


def test_every_websocket_route_with_a_parameter_is_covered() -> None:
    uncovered = [r.name for r in iter_websocket_param_routes() if r.name not in WEBSOCKET_ROUTES]
    assert not uncovered, (
        "Websocket routes with an object id but no isolation coverage; add a factory "
        f"(owner) -> path to tests/<app>/isolation.py WEBSOCKET_ROUTES: {uncovered}"
    )


def _ws_connects(path: str, client: Client | None) -> bool:
    """Open a websocket through the production stack (origin check, session auth, routing)."""
    from asgiref.sync import async_to_sync
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter

    from console.routing import OriginValidator, websocket_urlpatterns

    app = OriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if client is not None:
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    scope = websocket_scope(
        path, headers=headers, client=("127.0.0.1", 50000), server=("testserver", 80)
    )

    async def attempt() -> bool:
        communicator, first = await open_websocket(app, scope)
        accepted = first["type"] == "websocket.accept"
        if accepted:
            await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=5)
        return accepted

    return async_to_sync(attempt)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", sorted(WEBSOCKET_ROUTES) or ["ws/notifications/"])
def test_websockets_refuse_anonymous_users_and_other_customers_objects(
    route: str,
    alice,
    alice_client: Client,
    bob_client: Client,
) -> None:
    path = (
        "/" + WEBSOCKET_ROUTES[route](alice).lstrip("/")
        if route in WEBSOCKET_ROUTES
        else "/" + route
    )
    assert not _ws_connects(path, None)
    if route in WEBSOCKET_ROUTES:
        assert not _ws_connects(path, bob_client)
    # A route served only on an app host refuses its owner's console session too (issue 29);
    # its owner's own case is tested where the app host is (tests/slices/test_ports.py).
    owner_connects = getattr(WEBSOCKET_ROUTES.get(route), "owner_connects", True)
    assert _ws_connects(path, alice_client) is owner_connects
