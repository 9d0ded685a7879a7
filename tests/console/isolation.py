"""Tenant-isolation registry of the console's object routes (see tests/console/test_tenant_isolation.py).

``OBJECT_ROUTES`` maps a URL name to a factory ``(owner) -> url kwargs`` that creates one object
owned by ``owner`` and returns the kwargs that address it. The isolation test checks that another
customer gets 404 on every method of that route, and that the owner does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.console.account_factories import make_api_token, make_ssh_key


def _ssh_key(owner: Any) -> dict[str, Any]:
    return {"public_id": make_ssh_key(owner).public_id}


def _token(owner: Any) -> dict[str, Any]:
    return {"public_id": make_api_token(owner)[0].public_id}


OBJECT_ROUTES: dict[str, Callable[[Any], dict[str, Any]]] = {
    "account:ssh-key-delete": _ssh_key,
    "account:ssh-key-set-default": _ssh_key,
    "account:token-revoke": _token,
    "ssh-key-detail": _ssh_key,
    "ssh-key-set-default": _ssh_key,
    "api-token-detail": _token,
    "api-token-revoke": _token,
}

# Routes that take a parameter that is not an object of a customer, and why.
EXEMPT_ROUTES: dict[str, str] = {
    "account_confirm_email": "the parameter is a secret key mailed to the address, not an object id",
    "account_reset_password_from_key": "uidb36 + secret key from the reset mail, not an object id",
}
