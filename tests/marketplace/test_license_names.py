"""Licence names are proper names and stay as the sources give them, except the catch-all ones,
which are words and follow the page's language (listings, filters, the licence page)."""

from __future__ import annotations

import pytest
from django.utils import translation

from marketplace.models import License

pytestmark = pytest.mark.django_db


def test_catch_all_licences_are_translated_and_proper_names_are_not() -> None:
    other = License.objects.create(
        key="other", name="Other (see the model's page on the source hub)"
    )
    apache = License.objects.create(key="apache-2.0", name="Apache License 2.0")
    with translation.override("zh-hans"):
        assert other.display_name.startswith("其他")
        assert apache.display_name == "Apache License 2.0"
    with translation.override("en"):
        assert other.display_name.startswith("Other")
