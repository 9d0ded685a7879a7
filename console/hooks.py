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
