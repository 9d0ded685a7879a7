"""The console's entries in the tenant-isolation registry (tests/console/test_tenant_isolation.py).

Other apps add a ``tests/<app>/isolation.py`` with the same names (any may be omitted):
``OBJECT_ROUTES`` and ``STAFF_ROUTES`` map a URL name to ``factory(owner) -> url kwargs``;
``EXEMPT_ROUTES`` maps a URL name to the reason its parameter is not a customer's object;
``WEBSOCKET_ROUTES`` maps a websocket route's name (or pattern text) to ``factory(owner) -> path``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile

from console.notices import services as notices
from console.tenancy import personal_team
from console.verification import services as verification
from console.verification.models import Verification
from tests.console.factories import make_api_token, make_ssh_key


def _ssh_key(owner: Any) -> dict[str, Any]:
    return {"public_id": make_ssh_key(owner).public_id}


def _token(owner: Any) -> dict[str, Any]:
    return {"public_id": make_api_token(owner)[0].public_id}


def _licence(owner: Any) -> dict[str, Any]:
    """An organisation's verification with its licence file (the owner's personal one removed)."""
    Verification.objects.filter(owner=owner).delete()
    row = verification.submit_organisation(
        owner,
        kind="enterprise",
        organisation_name="某某科技有限公司",
        credit_code="91350100M000100Y43",
        licence=SimpleUploadedFile("licence.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64),
        contact_name="李四",
        contact_phone="010-12345678",
    )
    return {"public_id": row.public_id}


def _notice(owner: Any) -> dict[str, Any]:
    notice = notices.notify(owner, "stopped", {"n": 1}, key=f"isolation:{uuid.uuid4()}")
    return {"public_id": notice.public_id}


def _team(owner: Any) -> dict[str, Any]:
    return {"public_id": personal_team(owner).public_id}


def _shared_team(owner: Any) -> Any:
    from console.teams import services as teams

    return teams.create_team(owner, f"team-{uuid.uuid4().hex[:6]}")


def _team_page(owner: Any) -> dict[str, Any]:
    return {"public_id": _shared_team(owner).public_id}


def _member(owner: Any) -> dict[str, Any]:
    return {"public_id": _shared_team(owner).public_id, "member": owner.public_id}


def _invitation(owner: Any) -> dict[str, Any]:
    from console.teams import services as teams
    from console.tenancy import acting_in

    team = _shared_team(owner)
    row, _raw = teams.invite(
        acting_in(owner, team), f"{uuid.uuid4().hex[:8]}@example.com", "viewer"
    )
    return {"public_id": team.public_id, "invitation": row.public_id}


def _team_api(owner: Any) -> dict[str, Any]:
    return {"team_id": _shared_team(owner).public_id}


def _member_api(owner: Any) -> dict[str, Any]:
    return {"team_id": _shared_team(owner).public_id, "member_id": owner.public_id}


OBJECT_ROUTES: dict[str, Callable[[Any], dict[str, Any]]] = {
    # teams (console/team_views.py, console/team_api.py)
    "team-detail": _team_page,
    "team-invite": _team_page,
    "team-leave": _team_page,
    "team-transfer": _team_page,
    "team-close": _team_page,
    "team-member": _member,
    "team-member-remove": _member,
    "team-invitation-revoke": _invitation,
    "team-api-detail": _team_api,
    "team-api-members": _team_api,
    "team-api-member": _member_api,
    "team-api-invitations": _team_api,
    # the audit log (console/audit/)
    "team-audit": _team,
    "team-audit-api": _team,
    "account-verification-licence": _licence,
    "notification-read": _notice,
    "notifications-read-one": _notice,
    "notification-detail": _notice,
    # pages
    "account:ssh-key-delete": _ssh_key,
    "account:ssh-key-set-default": _ssh_key,
    "account:token-revoke": _token,
    # API
    "ssh-key-detail": _ssh_key,
    "ssh-key-set-default": _ssh_key,
    "api-token-detail": _token,
    "api-token-revoke": _token,
}

STAFF_ROUTES: dict[str, Callable[[Any], dict[str, Any]]] = {"ops-verification-decide": _licence}

EXEMPT_ROUTES: dict[str, str] = {
    "team-join": "an invitation's secret token, not an object id: a wrong or used one is 404 for "
    "everyone, and a right one only accepts for the address it was sent to "
    "(tests/console/test_teams.py)",
}
