"""The console's entries in the tenant-isolation registry (tests/console/test_tenant_isolation.py).

Other apps add a ``tests/<app>/isolation.py`` with the same names (any may be omitted):
``OBJECT_ROUTES`` and ``STAFF_ROUTES`` map a URL name to ``factory(owner) -> url kwargs``;
``EXEMPT_ROUTES`` maps a URL name to the reason its parameter is not a customer's object;
``WEBSOCKET_ROUTES`` maps a websocket route's name (or pattern text) to ``factory(owner) -> path``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.console.factories import make_api_token, make_ssh_key


def _ssh_key(owner: Any) -> dict[str, Any]:
    return {"public_id": make_ssh_key(owner).public_id}


def _token(owner: Any) -> dict[str, Any]:
    return {"public_id": make_api_token(owner)[0].public_id}


OBJECT_ROUTES: dict[str, Callable[[Any], dict[str, Any]]] = {
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
