"""The sandbox payment callback: each refusal says why, a failure credits nothing, no 500."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from decimal import Decimal

import pytest
from django.urls import reverse

from billing import services
from billing.models import Payment
from billing.providers.sandbox import SIGNATURE_HEADER, SandboxProvider, sign

pytestmark = pytest.mark.django_db

DEEP_JSON = ('{"a":' * 1000 + "1" + "}" * 1000).encode()


def _post(client, body: bytes, signature: str | None):
    headers = {SIGNATURE_HEADER: signature} if signature is not None else {}
    return client.post(
        reverse("billing:sandbox-webhook"),
        data=body,
        content_type="application/json",
        headers=headers,
    )


def _body(payment: Payment, /, **changes: object) -> bytes:
    data = {
        "payment": str(payment.public_id),
        "txn": f"sbx_{payment.public_id.hex}",
        "amount": str(payment.amount),
        "status": "succeeded",
        **changes,
    }
    return json.dumps(data).encode()


def test_a_failed_callback_credits_nothing_and_says_so(alice, client, prices) -> None:
    payment, _ = services.start_topup(alice, "80.00")
    body, headers = SandboxProvider().build_callback(payment, "failed")
    response = _post(client, body, headers[SIGNATURE_HEADER])
    assert response.status_code == 200
    assert response.json() == {"ok": True, "credited": False}
    payment.refresh_from_db()
    assert payment.state == "failed"
    assert services.get_wallet_summary(alice).cash == Decimal("0.00")


def test_each_refusal_has_its_own_code(alice, client, prices) -> None:
    payment, _ = services.start_topup(alice, "80.00")
    other, _ = services.start_topup(alice, "10.00")
    good = _body(payment)
    stale = int(time.time()) - 3600
    cases = [
        (good, None, "missing_signature"),
        (good, "garbage", "bad_signature"),
        (good, sign(good, secret=b"not the install's key"), "bad_signature"),
        (good, sign(good, stale), "stale_signature"),
        (b"not json", None, "malformed_body"),
        (DEEP_JSON, None, "malformed_body"),
        (_body(payment, amount="80.001"), None, "invalid_amount"),
        (_body(payment, status="refunded"), None, "unknown_status"),
        (_body(payment, payment=str(uuid.uuid4())), None, "unknown_payment"),
        (_body(payment, amount="8000.00"), None, "amount_mismatch"),
    ]
    for body, signature, code in cases:
        response = _post(
            client,
            body,
            signature if signature is not None or code == "missing_signature" else sign(body),
        )
        assert response.status_code == 400, (code, response.content)
        assert response.json()["error"] == code, (code, response.json())
        assert response.json()["detail"]
    # A provider transaction id that already paid another payment.
    assert _post(client, good, sign(good)).json() == {"ok": True, "credited": True}
    reused = _body(other, txn=f"sbx_{payment.public_id.hex}")
    response = _post(client, reused, sign(reused))
    assert response.status_code == 400 and response.json()["error"] == "transaction_reused"
    assert services.get_wallet_summary(alice).cash == Decimal("80.00")


def test_any_valid_v1_signature_is_accepted_in_either_order(alice, client, prices) -> None:
    """Like Stripe's scheme: during a key rotation the provider signs with both keys."""
    first, _ = services.start_topup(alice, "10.00")
    second, _ = services.start_topup(alice, "20.00")
    for payment, order in ((first, "good-last"), (second, "good-first")):
        body = _body(payment)
        ts = int(time.time())
        good = sign(body, ts).split("v1=", 1)[1]
        bad = hmac.new(b"old key", f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
        pair = (bad, good) if order == "good-last" else (good, bad)
        header = f"t={ts},v1={pair[0]},v1={pair[1]}"
        assert _post(client, body, header).json() == {"ok": True, "credited": True}, order
    bad_only = _body(first)
    ts = int(time.time())
    wrong = hmac.new(b"k", f"{ts}.".encode() + bad_only, hashlib.sha256).hexdigest()
    response = _post(client, bad_only, f"t={ts},v1={wrong},v1={wrong}")
    assert response.json()["error"] == "bad_signature"
    assert services.get_wallet_summary(alice).cash == Decimal("30.00")


def test_amounts_are_never_rounded(alice, client, prices) -> None:
    payment, _ = services.start_topup(alice, "80.00")
    for amount in ("80.001", "79.999", "80.0049"):
        body = _body(payment, amount=amount)
        assert _post(client, body, sign(body)).json()["error"] == "invalid_amount", amount
    exact = _body(payment, amount="80.000")  # the same amount written with a trailing zero
    assert _post(client, exact, sign(exact)).json() == {"ok": True, "credited": True}
