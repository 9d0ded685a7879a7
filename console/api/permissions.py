"""The API's door (issue 30): signed in, acting in a team it is a member of (a token: the team
it was made for), and with the role's permission for the app the endpoint belongs to."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext_lazy as _
from rest_framework.permissions import IsAuthenticated

from console.roles import door_perm
from console.tenancy import NotAMember, acting


class TeamDoor(IsAuthenticated):
    message = _("Your role in this team does not allow that.")

    def has_permission(self, request: Any, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        match = getattr(request, "resolver_match", None)
        needed = door_perm(
            type(view).__module__, request.method or "GET", (match.url_name or "") if match else ""
        )
        if needed is None:
            return True
        try:
            return acting(request).can(needed)
        except NotAMember:
            return False


class PersonLevel(TeamDoor):
    """The account's own things (SSH keys, API tokens, new teams): a token made for a team may
    read them but not change them (issue 30), so a team's CI token cannot mint a token for the
    person's other teams or add a key that opens their instances; a session or a token of the
    person's personal team may."""

    message = _(
        "A token made for a team cannot change the account's keys, tokens or teams: use the "
        "console or a token of your personal team."
    )

    def has_permission(self, request: Any, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return True
        token = getattr(request, "auth", None)
        team = getattr(token, "team", None)
        return team is None or team.personal_of_id == request.user.pk
