from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = _("Console")

    def ready(self) -> None:
        # Signal receivers (trial credit on email verification) connect when the app loads.
        from console import signals  # noqa: F401
