from __future__ import annotations

import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def _fresh_facets() -> None:
    """Facets are cached across requests; every test starts from an empty cache."""
    cache.clear()
