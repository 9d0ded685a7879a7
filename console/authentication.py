"""DRF authentication with personal API tokens: ``Authorization: Token <t>`` or ``Bearer <t>``."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext_lazy as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from console import services, tenancy

KEYWORDS = ("token", "bearer")
FAILURES = {
    "invalid": _("Invalid token."),
    "expired": _("This token has expired; create a new one on the account page."),
    "revoked": _("This token has been revoked."),
    "inactive_user": _("This account is disabled."),
    "not_a_member": _(
        "This token acts for a team you are no longer a member of; create a new one on the "
        "account page."
    ),
}


class ApiTokenAuthentication(BaseAuthentication):
    keyword = "Token"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower().decode("latin-1") not in KEYWORDS:
            return None  # not ours: let the next class (session) try
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                _("Malformed Authorization header: use “Token <token>” or “Bearer <token>”.")
            )
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed(FAILURES["invalid"]) from None
        check = services.check_api_token(raw)
        if check.token is None:
            raise exceptions.AuthenticationFailed(FAILURES[check.failure or "invalid"])
        token = check.token
        if token.team_id is not None:
            # A team's token is its holder's membership: one who left (or was removed) is
            # refused here, as a revoked token, not served a personal view or an error later.
            try:
                token.acting = tenancy.acting_in_team_id(token.owner, token.team_id)
            except tenancy.NotAMember:
                raise exceptions.AuthenticationFailed(FAILURES["not_a_member"]) from None
        return token.owner, token

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (with this challenge) rather than 403 to unauthenticated calls.
        return self.keyword


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "console.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "gct_<prefix>_<secret>",
            "description": (
                "A personal API token from the console's account page (Account → API tokens), "
                "sent as `Authorization: Bearer <token>` or `Authorization: Token <token>`."
            ),
        }
