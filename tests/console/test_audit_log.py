"""The audit log's page (/teams/<id>/audit/) and API (/api/v1/teams/<id>/audit/): who may read it
(owner, admin, billing; 403 for other members, 404 for everyone else and for another team's API
token), the filters, pages, CSV, both languages; and the log is append-only."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from billing import services as billing
from billing.seed import seed_default_prices
from console import services as console_services
from console.audit import services as audit
from console.audit.models import AuditEntry
from console.models import Membership, Team, User
from console.tenancy import Acting
from tests.console.factories import UserFactory, ed25519_public_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def lab(alice: User, bob: User) -> Team:
    """A team: alice owns it; a billing member, a developer and a viewer; bob is not in it."""
    team = Team.objects.create(name="Lab")
    Membership.objects.create(team=team, user=alice, role="owner")
    for role in ("billing", "developer", "viewer"):
        Membership.objects.create(team=team, user=UserFactory(username=role), role=role)
    return team


def _log(team: Team, who: User | None, action: str, **kw) -> AuditEntry:  # noqa: ANN003
    acting = Acting(team=team, user=who, role="owner") if who is not None else None
    return audit.record(acting, action, team=team, **kw)


@pytest.fixture
def entries(lab: Team, alice: User) -> list[AuditEntry]:
    dev = User.objects.get(username="developer")
    return [
        _log(lab, alice, "wallet.topup", label="100 元", after={"amount": "100.00"}),
        _log(lab, dev, "instance.order", label="=HYPERLINK(1)", after={"cards": 8}),
        _log(lab, None, "instance.release", label="run-1", before={"state": "running"}),
        _log(lab, alice, "member.role", before={"role": "viewer"}, after={"role": "developer"}),
    ]


def _url(team: Team) -> str:
    return f"/teams/{team.public_id}/audit/"


def _client(username: str) -> Client:
    client = Client()
    client.force_login(User.objects.get(username=username))
    return client


# -- the page ------------------------------------------------------------------------------------
@pytest.mark.parametrize("role", ["owner", "admin", "billing"])
def test_owner_admin_and_billing_read_the_log(lab, entries, role) -> None:  # noqa: ANN001
    user = User.objects.get(username="alice") if role == "owner" else UserFactory()
    if role != "owner":
        Membership.objects.update_or_create(team=lab, user=user, defaults={"role": role})
    client = Client()
    client.force_login(user)
    page = client.get(_url(lab), HTTP_ACCEPT_LANGUAGE="en")
    assert page.status_code == 200
    body = page.content.decode()
    assert body.count("<tr data-action=") == 4
    assert "developer@example.com" in body and "the console" in body
    assert "viewer → developer" in body  # before → after
    assert "Started a top-up" in body


@pytest.mark.parametrize("role", ["developer", "viewer"])
def test_a_member_whose_role_may_not_read_it_gets_403(lab, entries, role) -> None:  # noqa: ANN001
    assert _client(role).get(_url(lab)).status_code == 403


def test_someone_outside_the_team_gets_404_and_a_visitor_the_login(lab, entries, bob) -> None:  # noqa: ANN001
    client = Client()
    client.force_login(bob)
    assert client.get(_url(lab)).status_code == 404
    assert client.get("/teams/00000000-0000-0000-0000-000000000000/audit/").status_code == 404
    assert Client().get(_url(lab)).status_code == 302


def test_the_filters_narrow_by_action_prefix_actor_and_days(lab, entries, alice_client) -> None:  # noqa: ANN001
    def actions(**params: str) -> list[str]:
        body = alice_client.get(_url(lab), params).content.decode()
        return sorted(e.action for e in entries if f'data-action="{e.action}"' in body)

    assert actions(action="instance.") == ["instance.order", "instance.release"]
    # The CSV link carries the filters (also in the htmx answer, which replaces it).
    part = alice_client.get(_url(lab), {"action": "wallet."}, HTTP_HX_REQUEST="true")
    assert "?action=wallet.&amp;format=csv" in part.content.decode()
    assert "<html" not in part.content.decode()
    assert actions(action="wallet.topup") == ["wallet.topup"]
    assert actions(actor="developer") == ["instance.order"]
    today = timezone.localdate()
    assert len(actions(since=f"{today}", until=f"{today}")) == 4
    assert actions(since=f"{today + timedelta(days=1)}") == []
    assert actions(until=f"{today - timedelta(days=1)}") == []
    # An impossible day is no filter, not an error.
    assert alice_client.get(_url(lab), {"since": "2026-02-30"}).status_code == 200
    empty = alice_client.get(_url(lab), {"action": "disk."}, HTTP_ACCEPT_LANGUAGE="en")
    assert "No entries match these filters." in empty.content.decode()


def test_the_log_pages_and_keeps_the_filters(lab, alice_client, alice) -> None:  # noqa: ANN001
    for i in range(55):
        _log(lab, alice, "disk.create", label=f"d{i}")
    first = alice_client.get(_url(lab), {"action": "disk."}).content.decode()
    assert first.count("<tr data-action=") == 50
    assert "?action=disk.&amp;page=2" in first
    second = alice_client.get(_url(lab), {"action": "disk.", "page": "2"}).content.decode()
    assert second.count("<tr data-action=") == 5


def test_an_empty_log_says_what_will_appear_in_both_languages(lab, alice_client) -> None:  # noqa: ANN001
    en = alice_client.get(_url(lab), HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert 'id="audit-empty"' in en and "Nothing recorded yet." in en and "Audit log" in en
    zh = alice_client.get(_url(lab)).content.decode()  # zh-hans is the default
    assert "操作审计" in zh and "尚无记录" in zh


def test_the_csv_is_the_filtered_log_with_formulas_neutralised(lab, entries, alice_client) -> None:  # noqa: ANN001
    response = alice_client.get(_url(lab), {"format": "csv", "action": "instance."})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode("utf-8-sig"))))
    assert rows[0] == list(audit.CSV_HEADER)
    assert sorted(r[2] for r in rows[1:]) == ["instance.order", "instance.release"]
    order = next(r for r in rows[1:] if r[2] == "instance.order")
    assert order[5] == "'=HYPERLINK(1)" and order[1] == "developer@example.com"
    assert _client("developer").get(_url(lab), {"format": "csv"}).status_code == 403


def test_the_page_lists_in_a_fixed_number_of_queries(lab, entries, alice_client) -> None:  # noqa: ANN001
    """No query per entry: 20 more entries by 20 more people cost the page nothing more."""

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert alice_client.get(_url(lab)).status_code == 200
        return len(ctx.captured_queries)

    queries()  # the session and the team warm up
    before = queries()
    for _ in range(20):
        _log(lab, UserFactory(), "instance.order", after={"cards": 1})
    assert queries() == before


# -- the API -------------------------------------------------------------------------------------
def _api_url(team: Team) -> str:
    return f"/api/v1/teams/{team.public_id}/audit/"


def test_the_api_lists_the_log_paged_and_filtered(lab, entries, alice_api) -> None:  # noqa: ANN001
    body = alice_api.get(_api_url(lab)).json()
    assert body["count"] == 4
    first = body["results"][0]
    assert first["action"] == "member.role" and first["actor"] == "alice@example.com"
    assert first["before"] == {"role": "viewer"} and first["after"] == {"role": "developer"}
    assert set(first) == {
        "id",
        "at",
        "actor",
        "operator",
        "action",
        "object",
        "before",
        "after",
        "ip",
    }
    paged = alice_api.get(_api_url(lab), {"limit": 1, "offset": 1}).json()
    assert paged["count"] == 4 and len(paged["results"]) == 1 and paged["next"]
    only = alice_api.get(_api_url(lab), {"action": "instance.", "actor": "developer"}).json()
    assert [r["action"] for r in only["results"]] == ["instance.order"]
    assert only["results"][0]["object"]["label"] == "=HYPERLINK(1)"
    csv_body = alice_api.get(_api_url(lab), {"format": "csv"})
    assert csv_body.status_code == 200 and csv_body["Content-Type"].startswith("text/csv")
    assert "member.role" in csv_body.content.decode("utf-8-sig")


def test_the_api_lists_in_a_fixed_number_of_queries(
    lab, alice, alice_api, django_assert_max_num_queries
) -> None:  # noqa: ANN001
    for i in range(60):
        _log(lab, alice, "disk.create", label=f"d{i}")
    with django_assert_max_num_queries(4):  # the team, the role, the page, the count
        body = alice_api.get(_api_url(lab)).json()
    assert body["count"] == 60 and len(body["results"]) == 50


def test_the_api_answers_404_outside_the_team_and_403_to_a_developer(lab, entries, bob) -> None:  # noqa: ANN001
    outsider = APIClient()
    outsider.force_authenticate(bob)
    assert outsider.get(_api_url(lab)).status_code == 404
    dev = APIClient()
    dev.force_authenticate(User.objects.get(username="developer"))
    refused = dev.get(_api_url(lab))
    assert refused.status_code == 403 and refused.json()["error"]


def test_a_token_reads_only_the_team_it_was_made_for(lab, entries, alice) -> None:  # noqa: ANN001
    personal = console_services.create_api_token(alice, name="mine")[1]
    for_lab = console_services.create_api_token(alice, name="lab", team=lab)[1]
    by_personal = Client(headers={"Authorization": f"Bearer {personal}"})
    by_lab = Client(headers={"Authorization": f"Bearer {for_lab}"})
    # Alice owns the lab, but her personal team's token does not act in it.
    assert by_personal.get(_api_url(lab)).status_code == 404
    assert by_lab.get(_api_url(lab)).json()["count"] >= 4
    personal_team = alice.personal_team
    assert by_lab.get(_api_url(personal_team)).status_code == 404
    assert by_personal.get(_api_url(personal_team)).status_code == 200


def test_keys_and_tokens_are_recorded_with_the_address(alice_client, alice) -> None:  # noqa: ANN001
    response = alice_client.post(
        "/accounts/ssh-keys/",
        {"name": "laptop", "public_key": ed25519_public_key()},
        REMOTE_ADDR="198.51.100.4",
    )
    assert response.status_code in (200, 302)
    key_entry = AuditEntry.objects.get(action="sshkey.add")  # alice is in no other team
    assert (key_entry.actor, key_entry.ip, key_entry.object_label) == (
        alice,
        "198.51.100.4",
        "laptop",
    )
    assert key_entry.team == alice.personal_team
    token, _raw = console_services.create_api_token(alice, name="ci")
    console_services.revoke_api_token(alice, token)
    assert list(
        AuditEntry.objects.filter(action__startswith="token.")
        .order_by("id")
        .values_list("action", "object_id")
    ) == [("token.create", str(token.public_id)), ("token.revoke", str(token.public_id))]


def test_a_key_is_in_the_log_of_every_team_of_its_account(lab, alice, alice_client) -> None:  # noqa: ANN001
    """A key opens the instances its account may reach in each of its teams: each log shows it."""
    key = console_services.add_ssh_key(alice, name="laptop", public_key=ed25519_public_key())
    assert console_services.delete_ssh_key(alice, key)
    rows = AuditEntry.objects.filter(action__startswith="sshkey.")
    assert sorted((e.action, e.team_id) for e in rows) == sorted(
        (action, team.pk)
        for action in ("sshkey.add", "sshkey.delete")
        for team in (lab, alice.personal_team)
    )
    body = alice_client.get(_url(lab), {"action": "sshkey."}).content.decode()
    assert body.count("<tr data-action=") == 2


# -- append-only ---------------------------------------------------------------------------------
def test_an_entry_cannot_be_saved_again(lab, entries) -> None:  # noqa: ANN001
    entry = AuditEntry.objects.get(pk=entries[0].pk)
    entry.action = "wallet.refund"
    with pytest.raises(ValueError, match="append-only"):
        entry.save()
    assert AuditEntry.objects.get(pk=entry.pk).action == "wallet.topup"


@pytest.mark.integration
def test_postgresql_refuses_a_raw_update_or_delete(lab, entries) -> None:  # noqa: ANN001
    # The integration run is PostgreSQL's (make test-integration): never skipped there.
    assert connection.vendor == "postgresql", (
        "the trigger is PostgreSQL's (console/migrations/0007)"
    )
    for sql in (
        "UPDATE console_auditentry SET action = 'x' WHERE id = %s",
        "DELETE FROM console_auditentry WHERE id = %s",
    ):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql, [entries[0].pk])
    assert AuditEntry.objects.filter(pk=entries[0].pk, action="wallet.topup").exists()


def test_an_invoice_request_and_the_operator_s_decisions_are_recorded(
    alice, alice_client, operator_client, operator, settings
) -> None:  # noqa: ANN001
    settings.BILLING_SANDBOX_PAYMENTS = True
    seed_default_prices()
    payment, _ = billing.start_topup(alice, "500")
    billing.confirm_payment(
        str(payment.public_id), provider="sandbox", provider_txn_id="inv-1", amount=Decimal(500)
    )
    billing.purchase_term(
        alice, gpu_model="RTX 4090", cards=1, days=1, resource_kind="instance", resource_id="r-1"
    )
    response = alice_client.post(
        "/billing/invoices/", {"kind": "normal", "title_type": "personal"}, REMOTE_ADDR="192.0.2.9"
    )
    assert response.status_code in (200, 302)
    entry = AuditEntry.objects.get(action="invoice.request")
    assert (entry.actor, entry.team, entry.ip) == (alice, alice.personal_team, "192.0.2.9")
    assert Decimal(entry.after["amount"]) > 0 and entry.after["kind"] == "normal"
    row_id = entry.object_id
    operator_client.post(f"/ops/invoices/{row_id}/issue/")
    operator_client.post(f"/ops/invoices/{row_id}/reverse/", {"reason": "wrong title"})
    decided = AuditEntry.objects.filter(action__in=("invoice.issue", "invoice.reverse"))
    assert sorted((e.action, e.actor_id, e.operator, e.team_id) for e in decided) == [
        ("invoice.issue", operator.pk, True, alice.personal_team.pk),
        ("invoice.reverse", operator.pk, True, alice.personal_team.pk),
    ]
    assert decided.get(action="invoice.reverse").after["state"] == "reversed"
