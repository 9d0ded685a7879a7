"""Personas and shared fixtures: two customers (alice, bob) and an operator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.utils import translation
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

# `make test` runs the suite on several pytest-xdist workers (``-n``, ``--dist loadfile``). Each
# test module runs on one worker from start to end (its module-scoped servers start once); the
# modules below run one after another on one worker (the scope "host"), as in a serial run: the
# instances they start on the SSH test hosts bind fixed ports of this machine (an app's 8000,
# JupyterLab's 8888, an instance's own sshd in SLICES_INSTANCE_SSH_PORTS, drawn per database, not
# per machine). A module that uses the ``ssh_hosts`` fixture must be listed (checked below).
HOST_GROUP = "host"
HOST_MODULES = frozenset(
    {
        "tests/e2e/test_app_chat.py",
        "tests/e2e/test_edge_browser.py",
        "tests/e2e/test_jupyterlab.py",
        "tests/slices/test_bench_provisioning.py",
        "tests/slices/test_edge.py",
        "tests/slices/test_hostile_tenant.py",
        "tests/slices/test_migration_ssh.py",
        "tests/slices/test_ports.py",
        "tests/slices/test_process_rule_ssh.py",
        "tests/slices/test_process_stop_ssh.py",
        "tests/slices/test_recipe_runs.py",
        "tests/slices/test_ssh_driver.py",
        "tests/slices/test_ssh_gateway.py",
        "tests/slices/test_ssh_provisioning.py",
        "tests/slices/test_slurm_ssh.py",
        "tests/slices/test_ssh_stable_endpoint.py",
        "tests/slices/test_stop_start_ssh.py",
        "tests/slices/test_telemetry_ssh.py",
        "tests/slices/test_terminal_ssh.py",
        "tests/test_bench_access.py",
        "tests/test_bench_apps.py",
    }
)


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
    # PBKDF2 at one iteration (tests/support/hashers.py): the same algorithm and format, without
    # 0.25 s of CPU for every user a test creates or logs in.
    settings.PASSWORD_HASHERS = ["tests.support.hashers.OneIterationPBKDF2PasswordHasher"]
    # Licences, invoice PDFs and SMS files of the in-process suite go to a temporary folder, not
    # to var/ (tests that read them set their own per test).
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    scratch = Path(tempfile.mkdtemp(prefix="gc-private-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    settings.PRIVATE_FILES_DIR = scratch / "private"
    settings.SMS_FILE_PATH = scratch / "sms"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A module on the SSH test hosts that HOST_MODULES does not list would run beside the others."""
    unlisted = {
        item.nodeid.split("::", 1)[0]
        for item in items
        if "ssh_hosts" in getattr(item, "fixturenames", ())
    } - HOST_MODULES
    if unlisted:
        raise pytest.UsageError(f"add {', '.join(sorted(unlisted))} to HOST_MODULES in {__file__}")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the modules of HOST_MODULES as one scope. (pytest-xdist's own
    ``loadgroup`` relies on rewriting test ids, which this pytest no longer allows.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModuleScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return HOST_GROUP if module in HOST_MODULES else module

    return ModuleScheduling(config, log)


_db_blocker_key = pytest.StashKey[Any]()
# pytest-django's fixture that gives a test its database (and flushes it after a transactional one).
DJANGO_DB_FIXTURE = "_django_db_helper"


def _transactional(item: pytest.Item) -> bool:
    """What pytest-django flushes the database after (its own test ordering's rule)."""
    marker = item.get_closest_marker("django_db")
    if marker is not None and (
        marker.kwargs.get("transaction") or marker.kwargs.get("reset_sequences")
    ):
        return True
    return bool({"transactional_db", "live_server"} & set(getattr(item, "fixturenames", ())))


def pytest_fixture_post_finalizer(fixturedef: Any, request: pytest.FixtureRequest) -> None:
    """After a transactional test's flush, put back the rows the migrations wrote.

    Serially, pytest-django runs every test in a transaction before the transactional ones, so none
    of them meets a flushed database; on an xdist worker a module of transactional tests may come
    before another module's tests, which read the seed prices (billing 0002) and the fleet's
    version row (slices 0008) as every database has them after ``migrate``. A migration that writes
    rows adds them here. Called after pytest-django's per-test database fixture (its flush) ends."""
    if fixturedef.argname == DJANGO_DB_FIXTURE and _transactional(request.node):
        with request.config.stash[_db_blocker_key].unblock():
            _reseed_migration_rows()


def _reseed_migration_rows() -> None:
    import secrets

    from django.apps import apps

    from billing.seed import seed_default_prices

    seed_default_prices()  # idempotent: only when no price book / bonus rule exists
    try:
        fleet_version = apps.get_model("slices", "FleetVersion")
    except LookupError:
        return
    fleet_version.objects.get_or_create(pk=1, defaults={"token": secrets.randbits(62)})


@pytest.fixture(autouse=True, scope="session")
def _db_blocker_for_hooks(request: pytest.FixtureRequest, django_db_blocker: Any) -> None:
    """pytest-django's database blocker, for the hook above (hooks get no fixtures)."""
    import pytest_django.fixtures

    if not hasattr(pytest_django.fixtures, DJANGO_DB_FIXTURE):  # renamed in a new pytest-django
        raise pytest.UsageError(
            f"pytest-django has no {DJANGO_DB_FIXTURE}: update tests/conftest.py"
        )
    request.config.stash[_db_blocker_key] = django_db_blocker


@pytest.fixture(autouse=True, scope="session")
def _celery_runs_tasks_inline() -> None:
    """In-process tests run tasks inline when they are enqueued (on commit).

    The real asynchronous paths (embedded worker thread, a separate `celery worker` process on
    Redis) are exercised end to end by tests/console/test_server_modes.py.
    """
    celery_app.conf.task_always_eager = True
    celery_app.conf.task_eager_propagates = True


@pytest.fixture(autouse=True)
def _default_language() -> None:
    """Each test starts in the language a fresh thread has (the default, zh-hans): a request an
    earlier test made in English leaves English active in this thread (Django's LocaleMiddleware
    activates a language per request and does not undo it), and the suite's order varies."""
    translation.deactivate()


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
def alice_api(alice):
    """A DRF client signed in as alice (the API's views, without a token)."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(alice)
    return client


@pytest.fixture
def bob_client(bob) -> Client:
    return _client_for(bob)


@pytest.fixture
def operator_client(operator) -> Client:
    return _client_for(operator)
