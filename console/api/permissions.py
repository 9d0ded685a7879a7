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
