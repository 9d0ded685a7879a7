from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.cache import cache

from marketplace import services
from marketplace.models import Asset, Image, License, LicenseAcceptance


@pytest.fixture(autouse=True)
def _fresh_facets() -> None:
    """Facets are cached across requests; every test starts from an empty cache."""
    cache.clear()


@pytest.fixture(scope="module")
def _catalogue_loaded(django_db_setup, django_db_blocker) -> Iterator[None]:  # noqa: ANN001
    """The whole shipped catalogue, loaded once per module and removed after it, so no other
    module (of any app) sees it."""
    with django_db_blocker.unblock():
        services.load_catalogue()
    yield
    with django_db_blocker.unblock():
        LicenseAcceptance.objects.all().delete()
        Asset.objects.all().delete()
        License.objects.all().delete()
        Image.objects.all().delete()


@pytest.fixture
def full_catalogue(_catalogue_loaded, db) -> None:  # noqa: ANN001
    """Use in tests that read the real catalogue (3,242 assets, 4 images)."""
    return None
