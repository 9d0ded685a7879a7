"""The instance list's one filter (``?state=active|all|released``) on the page and the API: the same
instances for the same value, the same default (active: everything not yet archived, failed ones
included), counts per tab, and what each does with a value it does not know."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from slices.forms import InstanceListFilter
from tests.slices.factories import make_instance

pytestmark = pytest.mark.django_db

PAGE = "/instances/"
API = "/api/v1/instances/"

# One instance per kind of state the filter tells apart (rows only: no GPUs are held).
STATES = {
    "run": "running",
    "stop": "stopped",
    "prov": "provisioning",
    "broke": "failed",
    "gone1": "released",
    "gone2": "released",
}
ACTIVE = {"run", "stop", "prov", "broke"}
RELEASED = {"gone1", "gone2"}


@pytest.fixture
def owned(alice: Any, bob: Any) -> dict[str, Any]:
    made = {name: make_instance(alice, name=name, state=state) for name, state in STATES.items()}
    make_instance(bob, name="bobs", state="running")  # never listed for alice
    make_instance(bob, name="bobs-old", state="released")
    return made


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _api_names(client: APIClient, query: str = "") -> set[str]:
    r = client.get(f"{API}{query}")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["count"] == len(body["results"])
    return {row["name"] for row in body["results"]}


def _page(client: Client, query: str = "", **headers: str) -> str:
    r = client.get(f"{PAGE}{query}", **headers)
    assert r.status_code == 200
    return r.content.decode()


def _page_names(html: str) -> set[str]:
    return set(re.findall(r'<a href="/instances/[0-9a-f-]+/">([^<]+)</a>', html))


def _counts(html: str) -> dict[str, int]:
    return {
        f: int(n)
        for f, n in re.findall(r'data-filter="(\w+)"[^>]*>[^<]*<span[^>]*data-count="(\d+)"', html)
    }


def _current_tab(html: str) -> str:
    [tab] = re.findall(r'class="nav-link active" href="[^"]*" data-filter="(\w+)"', html)
    return tab


def test_the_default_lists_active_instances_on_the_page_and_the_api_alike(
    owned: dict[str, Any], alice: Any, alice_client: Client
) -> None:
    html = _page(alice_client)
    assert _page_names(html) == ACTIVE  # the failed one stays until its owner archives it
    assert _current_tab(html) == "active"
    assert _api_names(_api(alice)) == ACTIVE
    assert InstanceListFilter.DEFAULT == "active"
    # The explicit value is the default, both ways.
    assert _page_names(_page(alice_client, "?state=active")) == ACTIVE
    assert _api_names(_api(alice), "?state=active") == ACTIVE
    assert _api_names(_api(alice), "?state=") == ACTIVE  # blank = not given


@pytest.mark.parametrize(
    ("value", "expected"), [("all", ACTIVE | RELEASED), ("released", RELEASED)]
)
def test_all_and_released_list_the_same_on_both(
    owned: dict[str, Any], alice: Any, alice_client: Client, value: str, expected: set[str]
) -> None:
    html = _page(alice_client, f"?state={value}")
    assert _page_names(html) == expected
    assert _current_tab(html) == value
    assert _api_names(_api(alice), f"?state={value}") == expected


def test_the_tabs_count_each_filter_and_keep_it_in_the_polling_url(
    owned: dict[str, Any], alice_client: Client
) -> None:
    html = _page(alice_client, "?state=released", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert _counts(html) == {"active": 4, "all": 6, "released": 2}
    # Labels of the pill group, in the default language and in English.
    assert re.search(r'data-filter="active"[^>]*>\s*\S', html)
    en = _page(alice_client, "?state=released", HTTP_ACCEPT_LANGUAGE="en")
    for label in ("Active", "All", "Released"):
        assert f">{label} <span" in en
    # A provisioning instance keeps the list polling, with the filter in the URL; a released
    # row offers no Release button.
    assert 'hx-get="/instances/?state=released"' in html
    assert "instance-release" not in html and "/release/" not in html
    # The htmx poll answers the rows region with the tabs (their counts stay current).
    part = _page(alice_client, "?state=active", HTTP_HX_REQUEST="true")
    assert part.lstrip().startswith("<div") and 'id="instance-filter"' in part
    assert _counts(part) == {"active": 4, "all": 6, "released": 2}


def test_nothing_in_transition_stops_the_polling(alice: Any, alice_client: Client) -> None:
    make_instance(alice, name="calm", state="running")
    make_instance(alice, name="old", state="released")
    # No polling of the list (the header's one-time notice badge is not the list's).
    page = _page(alice_client)
    assert 'hx-trigger="every' not in page and f'hx-get="{PAGE}' not in page
    r = alice_client.get(f"{PAGE}?state=all", HTTP_HX_REQUEST="true")
    assert r.status_code == 286  # htmx: stop polling


def test_an_unknown_value_is_a_400_on_the_api_and_the_default_on_the_page(
    owned: dict[str, Any], alice: Any, alice_client: Client
) -> None:
    r = _api(alice).get(f"{API}?state=running")
    assert r.status_code == 400
    body = r.json()
    assert body["error"] == "invalid"
    assert "active, all, released" in body["detail"]
    assert body["fields"] == {"state": [body["detail"]]}
    # A browser with a stale or hand-edited URL still gets a working list: the default, marked.
    html = _page(alice_client, "?state=running")
    assert _page_names(html) == ACTIVE
    assert _current_tab(html) == "active"


def test_each_filter_says_what_to_do_when_empty(alice: Any, alice_client: Client) -> None:
    en = {"HTTP_ACCEPT_LANGUAGE": "en"}
    html = _page(alice_client, **en)
    assert "No instances yet" in html and 'href="/instances/new/"' in html
    assert _counts(html) == {"active": 0, "all": 0, "released": 0}
    old = make_instance(alice, name="old", state="released")
    html = _page(alice_client, **en)
    assert "No active instances" in html and "Released" in html
    assert 'href="/instances/new/"' in html and _page_names(html) == set()
    old.delete()
    make_instance(alice, name="now", state="running")
    html = _page(alice_client, "?state=released", **en)
    assert "No released instances" in html
    assert 'class="btn btn-primary" href="/instances/"' in html  # back to the active ones
    assert _api_names(_api(alice), "?state=released") == set()


def test_the_api_pages_keep_the_filter(alice: Any) -> None:
    for n in range(3):
        make_instance(alice, name=f"old{n}", state="released")
    make_instance(alice, name="live", state="running")
    first = _api(alice).get(f"{API}?state=released&limit=2").json()
    assert first["count"] == 3 and len(first["results"]) == 2
    assert "state=released" in first["next"]
    rest = _api(alice).get(first["next"]).json()
    assert {r["name"] for r in first["results"] + rest["results"]} == {"old0", "old1", "old2"}


def test_the_schema_documents_the_filter(alice: Any) -> None:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    params = schema["paths"]["/api/v1/instances/"]["get"]["parameters"]
    [state] = [p for p in params if p["name"] == "state"]
    assert state["in"] == "query"
    assert state["schema"]["enum"] == ["active", "all", "released"]
    assert state["schema"]["default"] == "active"
