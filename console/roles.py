"""What each team role may do (issue 30): one matrix, read by console/tenancy.py, the views' and
the API's permission checks, and the README's table. Pure: no Django."""

from __future__ import annotations

from enum import StrEnum


class Perm(StrEnum):
    VIEW = "view"  # see the team's instances, disks, /pfs, bills
    COMPUTE = "compute"  # order, start, stop, release one's own instances; use disks and /pfs
    OPERATE_ALL = "operate_all"  # operate every instance of the team, whoever started it
    BILLING = "billing"  # wallet, top-ups, invoices, statements, budgets and quotas
    MEMBERS = "members"  # invite, remove, change roles (up to one's own)
    AUDIT = "audit"  # read the audit log
    OWN = "own"  # delete the team, transfer ownership


ROLES: tuple[str, ...] = ("owner", "admin", "billing", "developer", "viewer")

MATRIX: dict[str, frozenset[Perm]] = {
    "owner": frozenset(Perm),
    "admin": frozenset(
        {Perm.VIEW, Perm.COMPUTE, Perm.OPERATE_ALL, Perm.MEMBERS, Perm.AUDIT, Perm.BILLING}
    ),
    "billing": frozenset({Perm.VIEW, Perm.BILLING, Perm.AUDIT}),
    "developer": frozenset({Perm.VIEW, Perm.COMPUTE}),
    "viewer": frozenset({Perm.VIEW}),
}

# Who may grant which role: nobody grants a role above their own.
RANK = {"owner": 4, "admin": 3, "billing": 2, "developer": 2, "viewer": 1}


def can(role: str | None, perm: Perm) -> bool:
    return role is not None and perm in MATRIX.get(role, frozenset())


def may_grant(granter: str, role: str) -> bool:
    """Owners grant any role; admins up to admin; nobody else changes roles."""
    if granter == "owner":
        return role in MATRIX
    if granter == "admin":
        return role in MATRIX and role != "owner"
    return False


# The doors (issue 30): what a request needs, from the app its view lives in and its method. Safe
# methods need only to be a member (``view``); a write to compute (slices, its telemetry, the
# marketplace) needs ``compute``, a write to billing needs ``billing``. The console's own views
# (the account, keys, tokens, notices, teams) check for themselves: keys and tokens are a
# person's, and the teams' views apply the members rules. Operators' pages are staff-only.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
APP_WRITE_PERMS: dict[str, Perm] = {
    "slices": Perm.COMPUTE,
    "marketplace": Perm.COMPUTE,
    "billing": Perm.BILLING,
}


# What anyone who may order needs from billing: prices and a quote (the order form asks).
BILLING_OPEN = frozenset({"quote", "prices", "billing-quote", "billing-prices"})


def door_perm(view_module: str, method: str, url_name: str = "") -> Perm | None:
    """The permission a request to a view of ``view_module`` with ``method`` needs in the acting
    team, or None when the view decides itself (console's own, operators', public callbacks).
    Reading compute is every member's; reading billing (the wallet, the ledger, bills, invoices)
    is the billing permission's, as changing it is."""
    if url_name.startswith("ops") or url_name.endswith("webhook") or url_name in BILLING_OPEN:
        return None
    app = view_module.split(".", 1)[0]
    if app not in APP_WRITE_PERMS:
        return None
    if method.upper() in SAFE_METHODS:
        return Perm.BILLING if app == "billing" else None
    return APP_WRITE_PERMS[app]
