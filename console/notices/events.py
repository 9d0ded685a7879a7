"""What each event says (title and text templates, filled from the notice's parameters and
rendered in the reader's language) and the channels it uses unless the account chose others."""

from __future__ import annotations

from dataclasses import dataclass

from django.utils.translation import gettext_lazy as _
from django.utils.translation import gettext_noop


@dataclass(frozen=True)
class Event:
    label: object  # lazy: the event's name on the preferences form
    title: str  # gettext_noop templates
    body: str
    channels: tuple[str, ...]


EVENTS: dict[str, Event] = {
    "low_balance": Event(
        _("Low balance"),
        gettext_noop("Low balance"),
        gettext_noop(
            "About %(minutes)s minutes of usage are left at %(burn)s 元/h. Top up to keep your "
            "instances running."
        ),
        ("inbox", "mail", "sms"),
    ),
    "low_balance_threshold": Event(
        _("Balance below my threshold"),
        gettext_noop("Balance below %(threshold)s 元"),
        gettext_noop(
            "Your balance is %(balance)s 元, below the %(threshold)s 元 you asked to be told "
            "about. Top up to keep your instances running."
        ),
        ("inbox", "mail", "sms"),
    ),
    "stopped": Event(
        _("Stopped for lack of funds"),
        gettext_noop("Instances stopped: balance exhausted"),
        gettext_noop(
            "Your balance cannot cover the next minute of usage: %(n)s instance(s) were stopped. "
            "Disks and files are kept."
        ),
        ("inbox", "mail", "sms"),
    ),
    "budget_stopped": Event(  # issue 30: a member's monthly budget, "stop on exhaustion"
        _("Stopped for lack of funds"),
        gettext_noop("Instances stopped: monthly budget spent"),
        gettext_noop(
            "You have spent %(spent)s 元 of your monthly budget of %(budget)s 元 in %(team)s: "
            "%(n)s instance(s) of yours were stopped. Disks and files are kept."
        ),
        ("inbox", "mail", "sms"),
    ),
    "verification_approved": Event(
        _("Verification decisions"),
        gettext_noop("Your real-name verification was approved"),
        gettext_noop(
            "Your account is verified (%(name)s). Top-ups, invoices and large orders are open."
        ),
        ("inbox", "mail"),
    ),
    "verification_rejected": Event(
        _("Verification decisions"),
        gettext_noop("Your real-name verification was rejected"),
        gettext_noop(
            "Your verification (%(name)s) was rejected: %(reason)s. You can submit again."
        ),
        ("inbox", "mail"),
    ),
    "node_failed_migrating": Event(
        _("A node failed: my instance moves"),
        gettext_noop("Instance %(name)s is moving to another node"),
        gettext_noop(
            "The node %(node)s under your instance %(name)s failed. The instance is moving to a "
            "healthy node and restarts from its latest checkpoint; it is not billed while it "
            "moves."
        ),
        ("inbox", "mail", "sms"),
    ),
    "queued_started": Event(  # issue 32: a queued order started
        _("My queued order starts"),
        gettext_noop("Your queued instance %(name)s is starting"),
        gettext_noop(
            "Your queued order %(name)s got its GPUs after %(minutes)s minutes in the queue and "
            "is starting now; billing begins when it runs."
        ),
        ("inbox", "mail"),
    ),
    "queued_skipped": Event(
        _("My queued order starts"),
        gettext_noop("Your queued order %(name)s left the queue"),
        gettext_noop(
            "Your queued order %(name)s did not start (%(reason)s): it waited past its maximum "
            "wait, or at its start the balance, the card quota or your limits did not allow it. "
            "Nothing was charged; you can order again."
        ),
        ("inbox", "mail"),
    ),
    "release_warning": Event(
        _("Before anything is deleted"),
        gettext_noop("Instance %(name)s will be released in %(days)s day(s)"),
        gettext_noop(
            "Your instance %(name)s has been stopped for long and will be released, with its "
            "system disk, at %(release_at)s. Start it, or copy what you need, before then."
        ),
        ("inbox", "mail", "sms"),
    ),
    "invoice_issued": Event(
        _("Invoice issued"),
        gettext_noop("Your invoice %(number)s is issued"),
        gettext_noop(
            "Your electronic invoice %(number)s of %(amount)s 元 is issued; download it at "
            "/billing/invoices/."
        ),
        ("inbox", "mail"),
    ),
    # Booked windows (预约, issue 32): T−24 h and T−1 h, and a start that cannot be kept.
    "reservation_soon": Event(
        _("Booked windows"),
        gettext_noop("Your booked window %(name)s starts at %(starts_at)s"),
        gettext_noop(
            "%(cards)s × %(gpu_model)s in %(region)s from %(starts_at)s to %(ends_at)s. The "
            "instance is prepared before then; it is paid for and not billed by the second."
        ),
        ("inbox", "mail"),
    ),
    "reservation_delayed": Event(
        _("Booked windows"),
        gettext_noop("Your booked window %(name)s is delayed"),
        gettext_noop(
            "A node the window %(name)s needed failed and no other node is free yet. It starts "
            "as soon as one is; the time it starts late is refunded, never billed."
        ),
        ("inbox", "mail", "sms"),
    ),
}

# The preferences form: one row per kind of event (the two verification events share one).
PREFERENCE_EVENTS = (
    "low_balance",
    "low_balance_threshold",
    "stopped",
    "verification_approved",
    "node_failed_migrating",
    "queued_started",
    "release_warning",
    "invoice_issued",
    "reservation_soon",
)
SHARED = {
    "reservation_delayed": "reservation_soon",
    "verification_rejected": "verification_approved",
    "budget_stopped": "stopped",
    "queued_skipped": "queued_started",
}
