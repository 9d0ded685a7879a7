"""A request that meets a transient database error answers 503 with ``Retry-After``, never a 500.

In-process (SQLite): the test's real connection is made to fail every statement with SQLite's own
``interrupted`` error (a progress handler that aborts), which Django wraps as ``OperationalError``
exactly as it does a cut PostgreSQL connection. The production-mode test (PostgreSQL, a real
server process, a pool exhausted and a backend terminated) is in tests/console/test_db_budget.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection
from django.test import Client

from console.models import User
from tests.console.factories import UserFactory, make_api_token

pytestmark = pytest.mark.django_db


@contextmanager
def database_down() -> Iterator[None]:
    """Every statement on this thread's connection fails (SQLite's ``interrupted``) inside the
    block; the test client runs requests on this thread, with this connection."""
    connection.ensure_connection()
    raw = connection.connection
    raw.set_progress_handler(lambda: 1, 1)  # non-zero: abort the statement
    try:
        yield
    finally:
        raw.set_progress_handler(None, 1)


@pytest.fixture
def customer() -> User:
    # The fault is SQLite's (make test's database); PostgreSQL's variant is test_db_budget.py, which
    # cuts real backends. Never skipped: under another database this fails and says why.
    assert connection.vendor == "sqlite", "database_down() breaks a SQLite connection"
    return UserFactory()


def _assert_unavailable(response, *, api: bool) -> None:
    assert response.status_code == 503, response.content[:300]
    assert response["Retry-After"] == "5"
    if api:
        assert response["Content-Type"] == "application/json"
        body = response.json()
        assert body["error"] == "unavailable"
        assert body["retry_after"] == 5
        assert "retry in 5 seconds" in body["detail"]


def test_api_view_answers_503_with_retry_after(customer: User) -> None:
    # The token is checked inside the API view (DRF's authentication): the API's handler answers.
    _, raw = make_api_token(customer)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_ACCEPT_LANGUAGE="en")
    with database_down():
        response = client.get("/api/v1/instances/")
    _assert_unavailable(response, api=True)


def test_api_error_outside_the_view_answers_503_json(customer: User) -> None:
    # The signed-in user is loaded by a middleware after the view (PrivatePagesMiddleware), not
    # by an API view: handler500 meets that error, and still answers the API's JSON body.
    client = Client(raise_request_exception=False, HTTP_ACCEPT_LANGUAGE="en")
    client.force_login(customer)
    with database_down():
        response = client.get("/api/v1/no-such-resource/")
    _assert_unavailable(response, api=True)


def test_page_answers_the_503_page(customer: User) -> None:
    client = Client(raise_request_exception=False, HTTP_ACCEPT_LANGUAGE="en")
    client.force_login(customer)
    with database_down():
        response = client.get("/")
    _assert_unavailable(response, api=False)
    assert b"503" in response.content and b"briefly unavailable" in response.content


def test_the_same_request_succeeds_once_the_database_is_back(customer: User) -> None:
    _, raw = make_api_token(customer)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")  # the default language: Chinese
    with database_down():
        response = client.get("/api/v1/instances/")
    assert response.status_code == 503
    assert response.json()["detail"] == "服务暂时不可用，请在 5 秒后重试。"
    assert client.get("/api/v1/instances/").status_code == 200
