"""Teams (issue 30): personal teams, create, invite, accept, roles and their rules, leave, the
switch in the header, the teams API, and the door check on every write route (a viewer changes
nothing, derived from the URL conf)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from django.core import mail
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from console.audit.models import AuditEntry
from console.models import ApiToken, Membership, Team, User
from console.teams import services
from console.tenancy import SESSION_KEY, acting_in, personal_team
from tests.console.factories import UserFactory, make_api_token

pytestmark = pytest.mark.django_db


def _client(user: User, team: Team | None = None) -> Client:
    client = Client()
    client.force_login(user)
    if team is not None:
        session = client.session
        session[SESSION_KEY] = str(team.public_id)
        session.save()
    return client


@pytest.fixture
def lab(alice: User) -> Team:
    return services.create_team(alice, "Vision Lab")


def _join(team: Team, inviter: User, user: User, role: str) -> Membership:
    _row, raw = services.invite(acting_in(inviter, team), user.email, role)
    return services.accept(user, raw)


def test_every_account_has_a_personal_team_that_owns_its_wallet_path(alice: User) -> None:
    team = personal_team(alice)
    assert team.personal and team.personal_of == alice
    assert team.pfs_key == str(alice.public_id)  # /pfs paths of personal teams stay as they were
    assert Membership.objects.get(team=team, user=alice).role == "owner"


def test_a_personal_team_takes_no_members(alice: User, bob: User) -> None:
    with pytest.raises(services.TeamRefused):
        services.invite(acting_in(alice), bob.email, "developer")


def test_invite_accept_and_the_mail_link_expires(
    lab: Team, alice: User, bob: User, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        row, raw = services.invite(acting_in(alice, lab), bob.email.upper(), "developer")
    assert row.email == bob.email.lower()
    assert len(mail.outbox) == 1 and f"/teams/join/{raw}/" in mail.outbox[0].body
    assert (row.expires_at - timezone.now()).days == 6  # 7 days, less the seconds gone
    # Another account cannot use it; the invitation stays for its owner.
    carol = UserFactory(username="carol")
    with pytest.raises(services.NotAllowed):
        services.accept(carol, raw)
    member = services.accept(bob, raw)
    assert member.role == "developer"
    with pytest.raises(services.TeamRefused):  # works once
        services.accept(bob, raw)
    # An expired link answers the same refusal.
    row2, raw2 = services.invite(acting_in(alice, lab), carol.email, "viewer")
    type(row2).objects.filter(pk=row2.pk).update(expires_at=timezone.now())
    with pytest.raises(services.TeamRefused):
        services.accept(carol, raw2)


def test_nobody_grants_above_their_own_role_and_the_last_owner_stays(
    lab: Team, alice: User, bob: User
) -> None:
    admin = _join(lab, alice, bob, "admin")
    carol = UserFactory(username="carol")
    dev = _join(lab, alice, carol, "developer")
    as_bob = acting_in(bob, lab)
    with pytest.raises(services.NotAllowed):
        services.set_role(as_bob, dev, "owner")  # above an admin's own
    services.set_role(as_bob, dev, "admin")  # up to their own
    alice_row = Membership.objects.get(team=lab, user=alice)
    with pytest.raises(services.NotAllowed):
        services.set_role(as_bob, alice_row, "viewer")  # an owner is above an admin
    with pytest.raises(services.TeamRefused):
        services.leave(acting_in(alice, lab))  # the last owner
    with pytest.raises(services.TeamRefused):
        services.set_role(acting_in(alice, lab), alice_row, "admin")
    services.transfer_ownership(acting_in(alice, lab), admin)
    assert Membership.objects.get(team=lab, user=bob).role == "owner"
    assert Membership.objects.get(team=lab, user=alice).role == "admin"
    actions = set(AuditEntry.objects.filter(team=lab).values_list("action", flat=True))
    assert {
        "team.create",
        "member.invite",
        "member.join",
        "member.role",
        "team.transfer",
    } <= actions


def test_a_member_who_leaves_loses_the_team_at_once(lab: Team, alice: User, bob: User) -> None:
    _join(lab, alice, bob, "developer")
    token, raw = services_token(bob, lab)
    client = _client(bob, lab)
    assert client.get(f"/teams/{lab.public_id}/").status_code == 200
    services.leave(acting_in(bob, lab))
    token.refresh_from_db()
    assert token.revoked_at is not None  # the token for the team ends
    assert client.get(f"/teams/{lab.public_id}/").status_code == 404
    # The session falls back to the personal team on the next request.
    page = client.get("/instances/")
    assert page.status_code == 200 and SESSION_KEY not in client.session
    api = APIClient()
    assert api.get("/api/v1/teams/", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401


def services_token(user: User, team: Team) -> tuple[ApiToken, str]:
    from console import services as console_services

    return console_services.create_api_token(user, name="ci", team=team)


def test_the_header_switch_acts_in_a_team_only_for_members(
    lab: Team, alice: User, bob: User
) -> None:
    client = _client(bob)
    r = client.post("/teams/switch/", {"team": str(lab.public_id)})
    assert r.status_code == 404  # not a member
    _join(lab, alice, bob, "viewer")
    r = client.post("/teams/switch/", {"team": str(lab.public_id), "next": "/billing/"})
    assert r.status_code == 302 and r["Location"] == "/billing/"
    assert client.session[SESSION_KEY] == str(lab.public_id)
    page = client.get("/instances/").content.decode()
    assert "Vision Lab" in page  # the header names the team acted in
    r = client.post(
        "/teams/switch/",
        {"team": str(personal_team(bob).public_id), "next": "https://evil.example/"},
    )
    assert r["Location"] == "/instances/" and SESSION_KEY not in client.session


def test_pages_in_both_languages(lab: Team, alice: User) -> None:
    client = _client(alice, lab)
    zh = client.get(f"/teams/{lab.public_id}/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "成员" in zh and "邀请" in zh
    client.cookies["django_language"] = "en"
    en = client.get(f"/teams/{lab.public_id}/").content.decode()
    assert "Members" in en and "Invite by email" in en
    assert client.get("/teams/").status_code == 200


def test_the_form_refuses_bad_input_with_a_message_and_changes_nothing(
    lab: Team, alice: User
) -> None:
    client = _client(alice, lab)
    before = lab.invitations.count()
    r = client.post(
        f"/teams/{lab.public_id}/invite/",
        {"email": "not-an-email", "role": "developer"},
        follow=True,
    )
    assert lab.invitations.count() == before
    assert "请输入合法的邮件地址" in r.content.decode()  # the message, in the default language
    me = Membership.objects.get(team=lab, user=alice)
    r = client.post(
        f"/teams/{lab.public_id}/members/{alice.public_id}/",
        {"budget_monthly": "-3", "gpu_quota": ""},
        follow=True,
    )
    me.refresh_from_db()
    assert me.budget_monthly is None


# --- the doors ----------------------------------------------------------------------------------
def _routes(resolver: URLResolver | None = None, prefix: str = "") -> list[tuple[str, object]]:
    from console.roles import BILLING_OPEN

    out = []
    for p in (resolver or get_resolver()).url_patterns:
        if isinstance(p, URLResolver):
            out.extend(_routes(p, prefix + str(p.pattern)))
        elif isinstance(p, URLPattern) and p.name not in BILLING_OPEN:
            out.append((prefix + str(p.pattern), p.callback))  # prices and quotes change nothing
    return out


def _fill(pattern: str) -> str:
    path = re.sub(r"<uuid:\w+>", str(uuid.uuid4()), pattern)
    path = re.sub(r"<int:\w+>", "1", path)
    path = re.sub(r"<(?:str|slug|path):\w+>|<\w+>", "x", path)
    return "/" + path.lstrip("^").rstrip("$").replace("\\", "")


def _write_routes() -> list[str]:
    """Every route of the apps a team acts through (compute, billing, the marketplace), from the
    URL conf, as a path to POST to."""
    found = []
    for pattern, callback in _routes():
        module = getattr(callback, "__module__", "") or ""
        if module.split(".")[0] not in {"slices", "billing", "marketplace"}:
            continue
        if (
            "ops" in pattern
            or "webhook" in pattern
            or pattern.startswith("api/")
            or "(?P" in pattern
        ):
            continue
        found.append(_fill(pattern))
    return sorted(set(found))


def test_a_viewer_changes_nothing_on_any_write_route(lab: Team, alice: User, bob: User) -> None:
    _join(lab, alice, bob, "viewer")
    client = _client(bob, lab)
    routes = _write_routes()
    assert len(routes) > 20
    for path in routes:
        for method in ("post", "put", "patch", "delete"):
            r = getattr(client, method)(path)
            assert r.status_code in (403, 404), (method, path, r.status_code)


def test_a_viewer_changes_nothing_through_the_api(lab: Team, alice: User, bob: User) -> None:
    _join(lab, alice, bob, "viewer")
    _token, raw = services_token(bob, lab)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    for path in ("/api/v1/instances/", "/api/v1/disks/", "/api/v1/billing/top-ups/"):
        r = api.post(path, {}, format="json")
        assert r.status_code == 403 and r.json()["error"] == "permission_denied", path
    assert api.get("/api/v1/instances/").status_code == 200  # reading is allowed


def test_a_billing_member_cannot_order_and_a_developer_cannot_top_up(
    lab: Team, alice: User, bob: User
) -> None:
    carol = UserFactory(username="carol")
    _join(lab, alice, bob, "billing")
    _join(lab, alice, carol, "developer")
    assert _client(bob, lab).post("/instances/new/", {"gpu_model": "RTX4090"}).status_code == 403
    assert _client(carol, lab).post("/billing/top-up/", {"amount": "10"}).status_code == 403


# --- the API ------------------------------------------------------------------------------------
def test_teams_api(alice: User, bob: User, django_capture_on_commit_callbacks) -> None:
    api = APIClient()
    api.force_authenticate(alice)
    r = api.post("/api/v1/teams/", {"name": "Start-up"}, format="json")
    assert r.status_code == 201 and r.json()["role"] == "owner"
    team_id = r.json()["id"]
    assert {t["name"] for t in api.get("/api/v1/teams/").json()} >= {"Start-up"}
    detail = api.get(f"/api/v1/teams/{team_id}/").json()
    assert detail["role"] == "owner" and detail["wallet"]["spendable"] == "0.00"
    with django_capture_on_commit_callbacks(execute=True):
        r = api.post(
            f"/api/v1/teams/{team_id}/invitations/",
            {"email": bob.email, "role": "developer"},
            format="json",
        )
    assert r.status_code == 201
    r = api.post(
        f"/api/v1/teams/{team_id}/invitations/",
        {"email": "x@example.com", "role": "root"},
        format="json",
    )
    assert r.status_code == 400
    raw = re.search(r"/teams/join/([^/]+)/", mail.outbox[-1].body).group(1)
    services.accept(bob, raw)
    r = api.patch(
        f"/api/v1/teams/{team_id}/members/{bob.public_id}/",
        {"budget_monthly": "200.00", "gpu_quota": "8", "stop_on_budget": True},
        format="json",
    )
    assert r.status_code == 200, r.content
    assert r.json()["budget_monthly"] == "200.00" and r.json()["gpu_quota"] == 8
    r = api.patch(
        f"/api/v1/teams/{team_id}/members/{bob.public_id}/",
        {"budget_monthly": "abc"},
        format="json",
    )
    assert r.status_code == 400 and r.json()["error"] == "invalid"
    bob_api = APIClient()
    bob_api.force_authenticate(bob)
    assert bob_api.get(f"/api/v1/teams/{team_id}/").json()["wallet"] is None  # a developer
    r = bob_api.patch(
        f"/api/v1/teams/{team_id}/members/{alice.public_id}/", {"role": "viewer"}, format="json"
    )
    assert r.status_code == 403
    # Another customer sees nothing of it.
    carol = UserFactory(username="carol")
    carol_api = APIClient()
    carol_api.force_authenticate(carol)
    assert carol_api.get(f"/api/v1/teams/{team_id}/").status_code == 404
    assert carol_api.get(f"/api/v1/teams/{team_id}/members/").status_code == 404
    assert api.delete(f"/api/v1/teams/{team_id}/members/{bob.public_id}/").status_code == 204
    assert not Membership.objects.filter(team__public_id=team_id, user=bob).exists()


def test_a_token_acts_in_the_one_team_it_was_made_for(lab: Team, alice: User) -> None:
    api = APIClient()
    api.force_authenticate(alice)
    r = api.post(
        "/api/v1/api-tokens/", {"name": "lab-ci", "team": str(lab.public_id)}, format="json"
    )
    assert r.status_code == 201 and r.json()["team"] == str(lab.public_id)
    tok = APIClient()
    tok.credentials(HTTP_AUTHORIZATION=f"Bearer {r.json()['token']}")
    assert [t["name"] for t in tok.get("/api/v1/teams/").json()] == ["Vision Lab"]
    assert tok.get(f"/api/v1/teams/{personal_team(alice).public_id}/").status_code == 404
    r = api.post("/api/v1/api-tokens/", {"name": "x", "team": str(uuid.uuid4())}, format="json")
    assert r.status_code == 400 and "team" in r.json()["fields"]
    _t, plain = make_api_token(alice)
    assert ApiToken.objects.get(prefix=plain.split("_")[1]).team == personal_team(alice)


def test_no_owner_writes_or_reads_outside_the_accounts() -> None:
    """The seam: nothing outside the accounts (keys, tokens, verification, notices) scopes rows
    by a login any more (``for_owner(user)``, ``owner=request.user``)."""
    root = Path(__file__).resolve().parents[2]
    allowed = {
        "console/services.py",
        "console/account_views.py",
        "console/api/views.py",
        "console/querysets.py",
        "console/verification",
        "console/notices",
    }
    offenders = []
    for path in root.glob("*/**/*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] not in {"console", "slices", "billing", "marketplace"}:
            continue
        if "/migrations/" in rel or any(rel.startswith(a) for a in allowed):
            continue
        text = path.read_text(encoding="utf-8")
        if (
            "for_owner(" in text
            or "owner=request.user" in text
            or "owner=self.request.user" in text
        ):
            offenders.append(rel)
    assert offenders == []


def test_a_team_token_cannot_change_the_persons_keys_tokens_or_teams(
    lab: Team, alice: User
) -> None:
    _tok, raw = services_token(alice, lab)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    r = api.post(
        "/api/v1/api-tokens/",
        {"name": "escalate", "team": str(personal_team(alice).public_id)},
        format="json",
    )
    assert r.status_code == 403
    assert (
        api.post("/api/v1/ssh-keys/", {"name": "k", "public_key": "x"}, format="json").status_code
        == 403
    )
    assert api.post("/api/v1/teams/", {"name": "Another"}, format="json").status_code == 403
    other, _ = services_token(alice, personal_team(alice))
    listed = {t["id"] for t in api.get("/api/v1/api-tokens/").json()["results"]}
    assert str(other.public_id) not in listed  # a team's token sees its team's tokens only
    assert api.get(f"/api/v1/api-tokens/{other.public_id}/").status_code == 404
    assert ApiToken.objects.filter(owner=alice).count() == 2  # nothing was made


def test_reading_billing_needs_the_billing_role(lab: Team, alice: User, bob: User) -> None:
    carol = UserFactory(username="carol")
    _join(lab, alice, bob, "developer")
    _join(lab, alice, carol, "billing")
    assert _client(bob, lab).get("/billing/").status_code == 403
    assert _client(bob, lab).get("/billing/bills/").status_code == 403
    assert _client(bob, lab).get("/prices/").status_code == 200  # prices stay open to all
    assert _client(carol, lab).get("/billing/").status_code == 200
    _t, raw = services_token(bob, lab)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/api/v1/billing/wallet/").status_code == 403


def test_only_an_owner_sets_an_owners_limits(lab: Team, alice: User, bob: User) -> None:
    _join(lab, alice, bob, "billing")
    owner_row = Membership.objects.get(team=lab, user=alice)
    with pytest.raises(services.NotAllowed):
        services.set_limits(acting_in(bob, lab), owner_row, budget_monthly="0", stop_on_budget=True)
    owner_row.refresh_from_db()
    assert owner_row.budget_monthly is None and not owner_row.stop_on_budget


def test_a_leavers_invitations_end_with_them(lab: Team, alice: User, bob: User) -> None:
    _join(lab, alice, bob, "admin")
    _row, raw = services.invite(acting_in(bob, lab), "second-address@example.com", "admin")
    services.remove(acting_in(alice, lab), Membership.objects.get(team=lab, user=bob))
    assert services.find_invitation(raw) is None


def test_the_dashboard_shows_the_wallet_of_the_team_acted_in(lab: Team, alice: User) -> None:
    from billing import services as billing

    billing.grant_voucher(lab, "42", reason="lab", valid_days=30)
    page = _client(alice, lab).get("/").content.decode()
    assert "42.00" in page
    assert "42.00" not in _client(alice).get("/").content.decode()  # the personal team's
