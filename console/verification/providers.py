"""Who checks that a person is who they say (name + ID number + a face check).

A provider implements ``check_person``; ``VERIFICATION_PROVIDER`` names the one in use. The
embedded default ships only the sandbox, which decides at once and is labelled as such wherever
the page shows it. A real provider (an Alipay or a bank face check) would answer ``pending`` with
a URL to send the person to, and its callback would call ``services.decide``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.crypto import get_random_string
from django.utils.translation import gettext_lazy as _
from django.utils.translation import gettext_noop

# The sandbox refuses this name (so a rejection can be tried); every other valid entry passes.
SANDBOX_REJECTED_NAME = "沙箱拒绝"


@dataclass(frozen=True)
class PersonCheck:
    approved: bool
    reference: str
    reason: str = ""  # an untranslated template (gettext_noop) when refused


class VerificationProvider(Protocol):
    name: str
    label: object  # a lazy translated string
    is_sandbox: bool

    def check_person(self, real_name: str, id_number: str) -> PersonCheck: ...


class SandboxProvider:
    """Decides at once: approves every well-formed submission but the name ``沙箱拒绝``."""

    name = "sandbox"
    label = _("Sandbox (no real identity check)")
    is_sandbox = True

    def check_person(self, real_name: str, id_number: str) -> PersonCheck:
        reference = f"sandbox-{get_random_string(16)}"
        if real_name == SANDBOX_REJECTED_NAME:
            return PersonCheck(
                False, reference, gettext_noop("The face check did not match the ID number.")
            )
        return PersonCheck(True, reference)


PROVIDERS: dict[str, type] = {"sandbox": SandboxProvider}


def get_provider() -> VerificationProvider:
    name = settings.VERIFICATION_PROVIDER
    try:
        provider: VerificationProvider = PROVIDERS[name]()
        return provider
    except KeyError:
        raise ImproperlyConfigured(
            f"VERIFICATION_PROVIDER={name!r} is not one of {sorted(PROVIDERS)}"
        ) from None
