from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SlicesConfig(AppConfig):
    name = "slices"
    verbose_name = _("Instances and fleet")

    def ready(self) -> None:
        # The worker's tasks, registered by name (services queue them through services.jobs).
        # Logging out ends every app host's cookie made from the session (issue 29).
        from django.contrib.auth.signals import user_logged_out

        from slices import tasks  # noqa: F401
        from slices.services import ports

        def _end_grants(sender: object, user: object = None, **kwargs: object) -> None:
            ports.end_user_grants(user)

        user_logged_out.connect(_end_grants, weak=False, dispatch_uid="slices.end_port_grants")
