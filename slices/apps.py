from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SlicesConfig(AppConfig):
    name = "slices"
    verbose_name = _("Instances and fleet")

    def ready(self) -> None:
        # The worker's tasks, registered by name (services queue them through services.jobs).
        from console import hooks
        from slices import tasks  # noqa: F401

        hooks.ssh_key_removed.connect(_key_removed, dispatch_uid="slices.ssh_key_removed")


def _key_removed(sender: object, user: object, **kwargs: object) -> None:
    from slices.services import access

    access.sync_for_owner(int(getattr(user, "pk", 0)))
