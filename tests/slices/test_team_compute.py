"""Teams at the compute doors (issue 30): a developer orders on the team's wallet and the row
says who; teammates see the team's instances but only their maker or an admin operates them; a
member who leaves keeps nothing and the instance stays with the team; another team sees nothing."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client
from rest_framework.test import APIClient

from billing import services as billing
from billing.models import UsageSession
from console.models import Team, User
from console.teams import services as teams
from console.tenancy import SESSION_KEY, acting_in, personal_team
from slices.models import Instance
from tests.console.factories import UserFactory

pytestmark = pytest.mark.django_db


def _join(team: Team, inviter: User, user: User, role: str) -> None:
    _row, raw = teams.invite(acting_in(inviter, team), user.email, role)
    teams.accept(user, raw)


def _client(user: User, team: Team) -> Client:
    client = Client()
    client.force_login(user)
    session = client.session
    session[SESSION_KEY] = str(team.public_id)
    session.save()
    return client


def _api(user: User, team: Team) -> APIClient:
    from console import services as console_services

    _token, raw = console_services.create_api_token(user, name="t", team=team)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return api


@pytest.fixture
def lab(alice: User, bob: User) -> Team:
    team = teams.create_team(alice, "Lab")
    billing.grant_voucher(team, Decimal("500"), reason="test", valid_days=30)
    _join(team, alice, bob, "developer")
    return team


def test_a_developer_orders_on_the_teams_wallet(
    sim_fleet, lab: Team, alice: User, bob: User, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        r = _api(bob, lab).post(
            "/api/v1/instances/", {"gpu_model": "RTX4090", "cards": 1}, format="json"
        )
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["team"] == str(lab.public_id) and body["created_by"] == bob.email
    instance = Instance.objects.get()
    assert instance.team == lab and instance.created_by == bob
    session = UsageSession.objects.get(resource_id=str(instance.public_id))
    assert session.wallet.team == lab  # the team pays, not bob's personal wallet
    assert not UsageSession.objects.filter(wallet__team=personal_team(bob)).exists()
    # The owner sees it in the team; bob's personal team does not hold it.
    assert _client(alice, lab).get(f"/instances/{instance.public_id}/").status_code == 200
    personal = Client()
    personal.force_login(bob)
    assert personal.get(f"/instances/{instance.public_id}/").status_code == 404


def test_only_the_maker_or_an_admin_operates_an_instance(
    sim_fleet, lab: Team, alice: User, bob: User, django_capture_on_commit_callbacks
) -> None:
    carol = UserFactory(username="carol")
    _join(lab, alice, carol, "developer")
    with django_capture_on_commit_callbacks(execute=True):
        _api(bob, lab).post(
            "/api/v1/instances/", {"gpu_model": "RTX4090", "cards": 1}, format="json"
        )
    instance = Instance.objects.get()
    assert instance.state == "running"
    # Carol sees it (a developer sees the team's instances) but cannot stop it.
    carol_page = _client(carol, lab)
    assert carol_page.get(f"/instances/{instance.public_id}/").status_code == 200
    assert carol_page.post(f"/instances/{instance.public_id}/stop/").status_code == 403
    r = _api(carol, lab).post(f"/api/v1/instances/{instance.public_id}/stop/")
    assert r.status_code == 403 and r.json()["error"] == "permission_denied"
    instance.refresh_from_db()
    assert instance.state == "running"
    # The owner (every instance) can.
    with django_capture_on_commit_callbacks(execute=True):
        r = _client(alice, lab).post(f"/instances/{instance.public_id}/stop/")
    assert r.status_code in (200, 302)
    instance.refresh_from_db()
    assert instance.state in ("stopping", "stopped")


def test_a_leaver_keeps_nothing_and_the_instance_stays_with_the_team(
    sim_fleet, lab: Team, alice: User, bob: User, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        _api(bob, lab).post(
            "/api/v1/instances/", {"gpu_model": "RTX4090", "cards": 1}, format="json"
        )
    instance = Instance.objects.get()
    page = _client(bob, lab)
    with django_capture_on_commit_callbacks(execute=True):
        teams.leave(acting_in(bob, lab))
    assert page.get(f"/instances/{instance.public_id}/").status_code == 404
    instance.refresh_from_db()
    assert instance.team == lab and instance.created_by == bob  # attributed to them still
    assert _client(alice, lab).get(f"/instances/{instance.public_id}/").status_code == 200


def test_another_team_sees_nothing(
    sim_fleet, lab: Team, alice: User, bob: User, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        _api(bob, lab).post(
            "/api/v1/instances/", {"gpu_model": "RTX4090", "cards": 1}, format="json"
        )
    instance = Instance.objects.get()
    stranger = UserFactory(username="mallory")
    other = teams.create_team(stranger, "Other")
    c = _client(stranger, other)
    assert c.get(f"/instances/{instance.public_id}/").status_code == 404
    assert c.post(f"/instances/{instance.public_id}/release/").status_code == 404
    assert _api(stranger, other).get(f"/api/v1/instances/{instance.public_id}/").status_code == 404
    assert str(instance.public_id) not in c.get("/instances/").content.decode()


def test_an_ai_apps_key_is_for_its_maker_and_admins_not_every_member(
    sim_fleet, lab: Team, alice: User, bob: User, settings, django_capture_on_commit_callbacks
) -> None:
    carol = UserFactory(username="carol")
    _join(lab, alice, carol, "viewer")
    Instance.objects.all().delete()
    with django_capture_on_commit_callbacks(execute=True):
        instance = Instance.objects.create(
            team=lab,
            created_by=bob,
            name="chat",
            kind="host",
            cards=1,
            state="running",
            gpu_model=__import__("slices.models", fromlist=["GpuModel"]).GpuModel.objects.get(
                code="RTX4090"
            ),
            quoted_per_hour=Decimal("1.90"),
            driver="sim",
            app="llm-chat",
            app_api_key="secret-key-123",
        )
    assert (
        "secret-key-123"
        not in _client(carol, lab).get(f"/instances/{instance.public_id}/").content.decode()
    )
    mine = _api(bob, lab).get(f"/api/v1/instances/{instance.public_id}/").json()
    assert mine["app"]["api_key"] == "secret-key-123"  # the maker's
    body = _api(carol, lab).get(f"/api/v1/instances/{instance.public_id}/").json()
    assert body["app"]["api_key"] is None  # a viewer's: the app, not its key
