"""Tenant-isolation registry for the marketplace (see tests/console/test_tenant_isolation.py).

The catalogue is shared by every user: its routes address public catalogue entries, never a
customer's object. A user's own license acceptances are only ever read for ``request.user``.
"""

from __future__ import annotations

_PUBLIC = "a public catalogue entry, the same for every user (not a customer's object)"

OBJECT_ROUTES: dict = {}

EXEMPT_ROUTES: dict[str, str] = {
    "marketplace:model-detail": _PUBLIC,
    "marketplace:dataset-detail": _PUBLIC,
    "marketplace:image-detail": _PUBLIC,
    "marketplace:license-detail": _PUBLIC,
    "marketplace:license-accept": "records the caller's own acceptance of a public license",
    "marketplace-model-detail": _PUBLIC,
    "marketplace-dataset-detail": _PUBLIC,
    "marketplace-image-detail": _PUBLIC,
    "marketplace-license-detail": _PUBLIC,
    "marketplace-license-accept": "records the caller's own acceptance of a public license",
}
