from __future__ import annotations

from decimal import Decimal

import pytest
from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model
from django.core.management import call_command

from billing.services import get_wallet_summary

pytestmark = pytest.mark.django_db


def test_demo_setup_is_idempotent_and_prepares_logins_fleet_and_catalogue() -> None:
    call_command("demo_setup", verbosity=0)
    call_command("demo_setup", verbosity=0)
    users = get_user_model().objects.filter(username__in=["demo", "ops"])
    assert sorted(u.username for u in users) == ["demo", "ops"]
    demo = users.get(username="demo")
    assert demo.check_password("demo-password-2026")
    assert users.get(username="ops").is_staff
    assert EmailAddress.objects.filter(user=demo, verified=True, primary=True).count() == 1
    assert get_wallet_summary(demo).trial == Decimal("10.00")  # granted once, not twice

    from marketplace.models import Asset
    from slices.models import GPU, Region

    assert set(Region.objects.values_list("code", flat=True)) >= {"xiamen", "yinchuan", "ulanqab"}
    assert GPU.objects.count() >= 6000
    assert Asset.objects.count() >= 1400
