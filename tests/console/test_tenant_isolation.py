"""Tenant isolation derived from the URL configuration and the API router.

Every route whose URL carries a parameter must be covered: either by a factory in some app's
``tests/<app>/isolation.py`` ``OBJECT_ROUTES`` (then another customer must get 404 on every HTTP
method of it, and the owner must not), or listed in ``EXEMPT_ROUTES`` there with a reason. A new
route with an object id and no entry makes ``test_every_route_with_a_parameter_is_covered`` fail.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.urls.resolvers import RegexPattern, RoutePattern

pytestmark = pytest.mark.django_db

APPS = ("console", "slices", "marketplace", "billing")
METHODS = ("get", "post", "put", "patch", "delete")
# URL parameters that never identify a customer's object.
NEUTRAL_PARAMS = {"format"}
# Namespaces that customers never reach at all (checked below: they are sent to log in).
STAFF_NAMESPACES = ("admin",)


def _registry() -> tuple[dict[str, Callable[[Any], dict[str, Any]]], dict[str, str]]:
    routes: dict[str, Callable[[Any], dict[str, Any]]] = {}
    exempt: dict[str, str] = {}
    for app in APPS:
        try:
            module = importlib.import_module(f"tests.{app}.isolation")
        except ModuleNotFoundError as exc:
            if exc.name not in (f"tests.{app}", f"tests.{app}.isolation"):
                raise
            continue
        for name in getattr(module, "OBJECT_ROUTES", {}):
            assert name not in routes, f"{name} registered twice"
        routes.update(getattr(module, "OBJECT_ROUTES", {}))
        exempt.update(getattr(module, "EXEMPT_ROUTES", {}))
    return routes, exempt


OBJECT_ROUTES, EXEMPT_ROUTES = _registry()


@dataclass(frozen=True)
class ParamRoute:
    name: str
    params: frozenset[str]


def _params(pattern: RoutePattern | RegexPattern) -> set[str]:
    if isinstance(pattern, RoutePattern):
        return set(pattern.converters)
    return set(pattern.regex.groupindex)


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
        if r.name not in OBJECT_ROUTES and r.name not in EXEMPT_ROUTES
    ]
    assert not uncovered, (
        "Routes with an object id but no tenant-isolation coverage; add a factory to "
        f"tests/<app>/isolation.py OBJECT_ROUTES (or a reasoned EXEMPT_ROUTES entry): {uncovered}"
    )


def test_registry_names_only_existing_routes() -> None:
    names = {r.name for r in _customer_routes()}
    stale = sorted(set(OBJECT_ROUTES) - names)
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
    bob_client: Client,  # noqa: ANN001
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
) -> None:  # noqa: ANN001
    url = reverse(url_name, kwargs=OBJECT_ROUTES[url_name](alice))
    for method, code in _statuses(client, url).items():
        assert code in (302, 401, 403, 404, 405), (method, url, code)


def test_customers_are_sent_to_log_in_on_staff_pages(alice_client: Client) -> None:
    response = alice_client.get(reverse("admin:index"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
