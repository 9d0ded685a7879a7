"""The pages of 实名认证, 发票, 费用中心, 对公转账 and notices speak one language each: no Chinese on
the English page (元 aside), no untranslated English sentence on the Chinese one."""

from __future__ import annotations

import pytest

from billing import services
from billing.invoicing import services as invoicing
from console.notices import services as notices
from tests.console.test_visitor_pages import CJK, ENGLISH_RUN, _main_text, _page

pytestmark = pytest.mark.django_db


def test_the_new_pages_speak_one_language(
    prices, alice, alice_client, operator_client, settings, tmp_path
) -> None:
    settings.PRIVATE_FILES_DIR = tmp_path
    payment, _ = services.start_topup(alice, "100.00")
    services.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="lang", amount=payment.amount
    )
    services.purchase_term(
        alice, gpu_model="RTX 4090", cards=1, days=1, resource_kind="instance", resource_id="l1"
    )
    invoice = invoicing.request_invoice(alice, kind="normal", title_type="personal")
    transfer, _ = services.start_topup(alice, "500.00", provider="bank_transfer")
    notices.notify(alice, "stopped", {"n": 1}, key="lang")
    pages = [
        (alice_client, "/account/verification/"),
        (alice_client, "/billing/invoices/"),
        (alice_client, "/billing/bills/"),
        (alice_client, "/billing/"),
        (alice_client, f"/billing/transfers/{transfer.public_id}/"),
        (alice_client, "/notifications/"),
        (operator_client, "/ops/verifications/"),
        (operator_client, "/ops/invoices/"),
        (operator_client, "/ops/transfers/"),
    ]
    assert invoice.public_id
    for client, path in pages:
        english = _main_text(_page(client, path, "en")).replace("元", "")
        english = english.replace("简体中文", "")  # a language is named in itself (the settings)
        assert not CJK.search(english), (path, CJK.findall(english))
        chinese = _main_text(_page(client, path, "zh-hans"))
        assert CJK.search(chinese), path
        assert not ENGLISH_RUN.search(chinese), (path, ENGLISH_RUN.findall(chinese))
