from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from billing import services
from billing.models import LedgerTransaction, PriceBook

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _operator_may_manage_billing(operator) -> None:
    """Operators are staff with the billing permissions (granted by a group in production)."""
    operator.user_permissions.add(*Permission.objects.filter(content_type__app_label="billing"))


def test_operator_grants_a_voucher_and_refunds_with_reasons(alice, operator_client, prices) -> None:
    wallet = services.get_or_create_wallet(alice)
    url = reverse("admin:billing_wallet_grant_voucher", args=[wallet.pk])
    assert operator_client.get(url).status_code == 200
    response = operator_client.post(
        url, {"amount": "25.00", "valid_days": 30, "reason": "downtime 2026-03-01"}
    )
    assert response.status_code == 302
    assert services.get_wallet_summary(alice).vouchers == Decimal("25.00")
    txn = LedgerTransaction.objects.get(kind="voucher_grant")
    assert txn.memo == "downtime 2026-03-01" and txn.created_by is not None
    refused = operator_client.post(
        reverse("admin:billing_wallet_refund", args=[wallet.pk]), {"amount": "5", "reason": "x"}
    )
    assert refused.status_code == 200 and "errorlist" in refused.content.decode()
    reverse_url = reverse("admin:billing_ledgertransaction_reverse", args=[txn.pk])
    assert operator_client.post(reverse_url, {"reason": "wrong customer"}).status_code == 302
    assert services.get_wallet_summary(alice).vouchers == Decimal("0.00")


def test_customers_cannot_reach_operator_actions(alice, alice_client, prices) -> None:
    wallet = services.get_or_create_wallet(alice)
    response = alice_client.post(
        reverse("admin:billing_wallet_grant_voucher", args=[wallet.pk]),
        {"amount": "9999", "valid_days": 30, "reason": "me"},
    )
    assert response.status_code == 302 and "/admin/login/" in response.url
    assert services.get_wallet_summary(alice).vouchers == 0


def test_prices_in_effect_are_read_only_copies_are_editable(operator_client, prices) -> None:
    book = PriceBook.objects.get(version=1)
    page = operator_client.get(reverse("admin:billing_pricebook_change", args=[book.pk]))
    assert page.status_code == 200 and 'name="storage_free_gb"' not in page.content.decode()
    operator_client.post(
        reverse("admin:billing_pricebook_changelist"),
        {"action": "copy_as_new_version", "_selected_action": [book.pk]},
    )
    copy = PriceBook.objects.get(version=2)
    page = operator_client.get(reverse("admin:billing_pricebook_change", args=[copy.pk]))
    assert 'name="storage_free_gb"' in page.content.decode()
    assert copy.gpu_prices.get(gpu_model="RTX 4090").on_demand_per_card_hour == Decimal("1.90")


def test_operations_need_their_explicit_permission_not_just_view(
    alice,
    django_user_model,
    operator_client,
    prices,
) -> None:
    wallet = services.get_or_create_wallet(alice)
    services.grant_voucher(alice, Decimal("5.00"), reason="goodwill", valid_days=30)
    txn = LedgerTransaction.objects.get(kind="voucher_grant")
    viewer = django_user_model.objects.create_user("viewer", "viewer@example.com", is_staff=True)
    viewer.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="billing", codename__startswith="view_")
    )
    client = Client()
    client.force_login(viewer)
    grant = reverse("admin:billing_wallet_grant_voucher", args=[wallet.pk])
    refund = reverse("admin:billing_wallet_refund", args=[wallet.pk])
    reverse_url = reverse("admin:billing_ledgertransaction_reverse", args=[txn.pk])
    assert client.get(reverse("admin:billing_wallet_change", args=[wallet.pk])).status_code == 200
    assert client.post(grant, {"amount": "99", "valid_days": 30, "reason": "x"}).status_code == 403
    assert client.post(refund, {"amount": "1", "reason": "x"}).status_code == 403
    assert client.post(reverse_url, {"reason": "x"}).status_code == 403
    assert services.get_wallet_summary(alice).vouchers == Decimal("5.00")
    assert LedgerTransaction.objects.count() == 1
    # each permission opens exactly its own operation
    for codename in ("grant_voucher", "refund_cash", "reverse_transaction"):
        viewer.user_permissions.add(Permission.objects.get(codename=codename))
    viewer = django_user_model.objects.get(pk=viewer.pk)  # fresh permission cache
    client.force_login(viewer)
    assert client.get(grant).status_code == 200
    assert client.get(refund).status_code == 200
    assert client.post(reverse_url, {"reason": "granted by mistake"}).status_code == 302
    assert services.get_wallet_summary(alice).vouchers == Decimal("0.00")
    # superusers pass as usual
    assert operator_client.get(grant).status_code == 200
