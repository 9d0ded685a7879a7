"""Personas and shared fixtures: two customers (alice, bob) and an operator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client
from hypothesis import settings as hypothesis_settings
from playwright.sync_api import expect

from console.celery import app as celery_app
from console.models import User
from marketplace.models import Asset, Image, License, LicenseAcceptance
from marketplace.services import load_catalogue
from tests.console.factories import PASSWORD, UserFactory
from tests.support.sshd import stop_processes_under

# Every randomised test prints how to reproduce a failure (hypothesis's blob, or `--hypothesis-seed`).
hypothesis_settings.register_profile("console", print_blob=True, deadline=None)
hypothesis_settings.load_profile("console")

# Browser assertions wait for the page instead of sleeping; on a loaded 2-core CI machine the
# default 5 s is tight for a full page load, so they may wait up to 20 s (they pass as soon as true).
expect.set_options(timeout=20_000)

__all__ = ["PASSWORD"]  # tests log in with it (tests/console/factories.py)


def pytest_configure(config: pytest.Config) -> None:
    """Serve static files from the source folders in tests, in both modes.

    Production's hashed manifest is a deployment artifact (collectstatic); the in-process suite
    renders pages in production mode too (the integration run) and must not need it. The
    server-process tests run collectstatic and use the real manifest storage.
    """
    from django.conf import settings

    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    settings.WHITENOISE_USE_FINDERS = True
    settings.STATIC_ROOT = None  # nothing is collected in-process; whitenoise serves the finders


@pytest.fixture(autouse=True, scope="session")
def _celery_runs_tasks_inline() -> None:
    """In-process tests run tasks inline when they are enqueued (on commit).

    The real asynchronous paths (embedded worker thread, a separate `celery worker` process on
    Redis) are exercised end to end by tests/console/test_server_modes.py.
    """
    celery_app.conf.task_always_eager = True
    celery_app.conf.task_eager_propagates = True


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Whatever a test's instances started on the SSH test hosts under its own directory (a
    per-instance sshd, a workload of an instance the test did not release) stops with the test,
    so no later test meets it on a loopback port."""
    # Taken before the test: an autouse fixture is set up first and torn down last.
    path = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if path is not None:
        stop_processes_under(path)


@pytest.fixture(scope="module")
def _catalogue_loaded(django_db_setup, django_db_blocker) -> Iterator[None]:
    """The whole shipped catalogue, loaded once per module and removed after it, so no other
    module (of any app) sees it."""
    with django_db_blocker.unblock():
        load_catalogue()
    yield
    with django_db_blocker.unblock():
        LicenseAcceptance.objects.all().delete()
        Asset.objects.all().delete()
        License.objects.all().delete()
        Image.objects.all().delete()


@pytest.fixture
def full_catalogue(_catalogue_loaded, db) -> None:
    """Use in tests that read the real catalogue (3,242 assets, 4 images)."""
    return None


@pytest.fixture
def alice(db) -> User:
    return UserFactory(username="alice", first_name="Alice")


@pytest.fixture
def bob(db) -> User:
    return UserFactory(username="bob", first_name="Bob")


@pytest.fixture
def operator(db) -> User:
    return UserFactory(username="ops", first_name="Olga", is_staff=True, is_superuser=True)


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def alice_client(alice) -> Client:
    return _client_for(alice)


@pytest.fixture
def bob_client(bob) -> Client:
    return _client_for(bob)


@pytest.fixture
def operator_client(operator) -> Client:
    return _client_for(operator)
