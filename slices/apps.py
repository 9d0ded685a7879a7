from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SlicesConfig(AppConfig):
    name = "slices"
    verbose_name = _("Instances and fleet")

    def ready(self) -> None:
        # The worker's tasks, registered by name (services queue them through services.jobs).
        from django.contrib.auth.signals import user_logged_out

        from console import hooks
        from slices import tasks  # noqa: F401

        hooks.ssh_key_removed.connect(_key_removed, dispatch_uid="slices.ssh_key_removed")
        # Logging out ends every app host's cookie made from the session (issue 29).
        user_logged_out.connect(_end_grants, dispatch_uid="slices.end_port_grants")


def _key_removed(sender: object, user: object, **kwargs: object) -> None:
    from slices.services import access

    access.sync_for_owner(int(getattr(user, "pk", 0)))


def _end_grants(sender: object, user: object = None, **kwargs: object) -> None:
    from slices.services import ports

    ports.end_user_grants(user)
