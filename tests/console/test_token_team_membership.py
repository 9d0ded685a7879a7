"""A team token's team and its holder's role are read on every request (one query whose SQL is
built once, console/tenancy.py): a role changed or a membership ended applies to the very next
request, and a token never acts in another team."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from console import services as console_services
from console.models import Membership, Team, User
from console.teams import services as teams
from console.tenancy import NotAMember, acting_in, acting_in_team_id, personal_team

pytestmark = pytest.mark.django_db


def _token_client(user: User, team: Team) -> APIClient:
    _token, raw = console_services.create_api_token(user, name="ci", team=team)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {raw}")
    return api


def test_a_team_token_follows_its_holders_membership_request_by_request(
    alice: User, bob: User
) -> None:
    lab = teams.create_team(alice, "Vision Lab")
    _row, raw = teams.invite(acting_in(alice, lab), bob.email, "developer")
    teams.accept(bob, raw)
    api = _token_client(bob, lab)
    assert [t["name"] for t in api.get("/api/v1/teams/").json()] == ["Vision Lab"]
    assert api.get("/api/v1/instances/").status_code == 200

    acting = acting_in_team_id(bob, lab.pk)
    assert (acting.team, acting.user, acting.role) == (lab, bob, "developer")
    Membership.objects.filter(team=lab, user=bob).update(role="viewer")
    assert acting_in_team_id(bob, lab.pk).role == "viewer"  # read again, not kept

    Membership.objects.filter(team=lab, user=bob).delete()  # bob has left
    with pytest.raises(NotAMember):
        acting_in_team_id(bob, lab.pk)
    with pytest.raises(NotAMember):
        acting_in(bob, lab)
    # The token is refused from then on, with a reason, by every door (not a 500, not bob's
    # personal team).
    for path in ("/api/v1/teams/", "/api/v1/instances/", "/api/v1/billing/wallet/"):
        answer = api.get(path, HTTP_ACCEPT_LANGUAGE="en")
        assert answer.status_code == 401, (path, answer.status_code)
        assert "no longer a member" in answer.json()["detail"], answer.json()
    chinese = api.get("/api/v1/instances/", HTTP_ACCEPT_LANGUAGE="zh-hans").json()
    assert "不再" in chinese["detail"], chinese


def test_a_membership_is_one_users_in_one_team(alice: User, bob: User) -> None:
    lab = teams.create_team(alice, "Vision Lab")
    # bob is in his own personal team only: not in alice's lab, whatever his role there.
    with pytest.raises(NotAMember):
        acting_in_team_id(bob, lab.pk)
    assert acting_in_team_id(bob, personal_team(bob).pk).team == personal_team(bob)
    with pytest.raises(NotAMember):
        acting_in_team_id(alice, personal_team(bob).pk)
    with pytest.raises(NotAMember):
        acting_in_team_id(alice, 10**9)  # no such team
    assert acting_in_team_id(alice, lab.pk).role == "owner"
