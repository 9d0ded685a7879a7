"""CSV exports give times in the reader's time zone with its offset, as the pages show them."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing import services
from billing.models import LedgerTransaction

pytestmark = pytest.mark.django_db


def _rows(client: Client, url: str, **params: str) -> list[list[str]]:
    body = client.get(url, params).content.decode("utf-8-sig")
    return list(csv.reader(io.StringIO(body)))


def test_statement_csv_times_are_local_with_their_offset(
    alice,
    alice_client: Client,
    prices: None,
) -> None:
    services.grant_trial_credit(alice)
    txn = LedgerTransaction.objects.get(wallet__team__personal_of=alice)
    month = timezone.localtime(txn.created_at).strftime("%Y-%m")
    rows = _rows(alice_client, reverse("billing:statement-csv"), month=month)
    line = next(r for r in rows if r[1] == str(txn.public_id))
    local = timezone.localtime(txn.created_at)
    assert line[0] == local.isoformat() and line[0].endswith("+08:00")
    page = alice_client.get(reverse("billing:statement"), {"month": month}).content.decode()
    assert local.strftime("%Y-%m-%d %H:%M:%S") in page  # the page shows the same wall time


def test_usage_csv_times_are_local_with_their_offset(
    alice,
    alice_client: Client,
    prices: None,
) -> None:
    services.grant_trial_credit(alice)
    started = datetime(2026, 3, 1, 17, 30, tzinfo=UTC)  # 01:30 the next day in Shanghai
    services.open_usage_session(
        alice,
        resource_kind="instance",
        resource_id="i-1",
        gpu_model="RTX 4090",
        cards=1,
        at=started,
    )
    header, row = _rows(alice_client, reverse("billing:usage-csv"))[:2]
    assert row[header.index("started")] == "2026-03-02T01:30:00+08:00"
    assert row[header.index("ended")] == ""
