"""Signals the accounts send for other apps to answer, so the console's building blocks never
import an app (the apps import the console, not the reverse).

* ``trial_credit_due(sender=User, user=user)`` — a newly verified account earned its one-time
  trial credit (the once-per-mailbox rule has passed). Billing answers (``BillingConfig.ready``)
  and returns whether it granted it; idempotent per wallet.
* ``ssh_key_removed(sender=User, user=user)`` — a key left the account (sent once the deleting
  transaction commits). Slices answers by syncing the gateways of the regions where the account
  has running instances, so the key stops working there at once (the periodic pass would too).
"""

from __future__ import annotations

from django.dispatch import Signal

trial_credit_due = Signal()
ssh_key_removed = Signal()
# ``team_created(sender=Team, team=team)`` — a team was made (a personal one with its account).
team_created = Signal()
# ``member_left(sender=Team, team=team, user_id=id)`` — a member left or was removed (sent after
# the commit): slices writes the gateway's keys again and ends their web-port grants.
member_left = Signal()
# ``team_close_blockers(team)``: what stops a team from closing (live instances, disks, money),
# asked of every app that registered a check with ``close_blocker``.
_close_checks: list = []


def close_blocker(check):  # type: ignore[no-untyped-def]
    """Register ``check(team) -> list[str]`` (what of the app's the team still holds)."""
    _close_checks.append(check)
    return check


def team_close_blockers(team) -> list[str]:  # type: ignore[no-untyped-def]
    found: list[str] = []
    for check in _close_checks:
        found.extend(check(team))
    return found
