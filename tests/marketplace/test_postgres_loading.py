"""Loading the catalogue from two processes at once on PostgreSQL (an advisory lock serialises them)."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from marketplace import services
from marketplace.models import Asset

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_two_concurrent_loads_create_each_asset_once() -> None:
    errors: list[BaseException] = []
    reports: list[services.LoadReport] = []

    def load() -> None:
        try:
            reports.append(services.load_catalogue())
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(r.created.get("models", 0) for r in reports) == [0, 1736]
    assert Asset.objects.filter(kind="model").count() == 1736
