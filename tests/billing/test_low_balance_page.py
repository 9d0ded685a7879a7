"""/billing/ shows a low-balance warning only while it holds: something burns and the runway is
within the warning's threshold. After the instances are released (nothing burns) or a top-up
(the runway is long again) the old warning is history and is not shown; a stop notice stays."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from billing import lowbalance, services
from billing.choices import NoticeKind
from billing.models import BillingNotice, Wallet
from tests.billing.factories import open_session

pytestmark = pytest.mark.django_db
WARNING = "Low balance: about 38 minutes left at 15.20 元/h."


def _notice(user, kind: str, threshold: int | None, message: str) -> None:
    wallet, _ = Wallet.objects.get_or_create(team=user.personal_team)
    BillingNotice.objects.create(
        wallet=wallet,
        kind=kind,
        threshold_seconds=threshold,
        message=message,
        created_at=timezone.now(),
    )


def _page(client) -> str:
    response = client.get(reverse("billing:overview"))
    assert response.status_code == 200
    return response.content.decode()


def test_an_old_warning_is_not_shown_when_nothing_burns(alice, alice_client, prices) -> None:
    services.grant_voucher(alice, Decimal("10"), reason="trial", valid_days=30)
    _notice(alice, NoticeKind.LOW_BALANCE, 3600, WARNING)
    _notice(alice, NoticeKind.STOPPED, None, "Your balance cannot cover the next minute.")
    page = _page(alice_client)
    assert WARNING not in page
    assert "Your balance cannot cover the next minute." in page


def test_the_warning_shows_while_the_runway_is_within_its_threshold(
    alice, alice_client, prices
) -> None:
    services.grant_voucher(alice, Decimal("10"), reason="trial", valid_days=30)
    open_session(alice, cards=8)  # 15.20 元/h: 10 元 last about 39 minutes
    _notice(alice, NoticeKind.LOW_BALANCE, 3600, WARNING)
    assert WARNING in _page(alice_client)
    # A top-up that lasts beyond the threshold: the warning no longer holds.
    services.grant_voucher(alice, Decimal("100"), reason="top-up", valid_days=30)
    assert WARNING not in _page(alice_client)


def test_warning_holds_rule() -> None:
    assert not lowbalance.warning_holds(3600, None)  # nothing burns
    assert lowbalance.warning_holds(3600, 2300)
    assert lowbalance.warning_holds(3600, 3600)
    assert not lowbalance.warning_holds(3600, 3601)
    assert lowbalance.warning_holds(None, 10)
