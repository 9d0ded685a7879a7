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
        # A member who leaves a team loses its instances at once (issue 30).
        hooks.member_left.connect(_member_left, dispatch_uid="slices.member_left")
        hooks.close_blocker(_team_holds)


def _key_removed(sender: object, user: object, **kwargs: object) -> None:
    from slices.services import access

    access.sync_for_key_holder(int(getattr(user, "pk", 0)))


def _end_grants(sender: object, user: object = None, **kwargs: object) -> None:
    from slices.services import ports

    ports.end_user_grants(user)


def _member_left(sender: object, team: object, user_id: int, **kwargs: object) -> None:
    from slices.services import access, ports

    ports.end_member_grants(team, user_id)
    access.sync_for_team(team)


def _team_holds(team: object) -> list[str]:
    from slices.choices import InstanceState
    from slices.models import Disk, Instance

    held = []
    n = Instance.objects.filter(team=team).exclude(state=InstanceState.RELEASED).count()
    if n:
        held.append(str(_("%(n)d instance(s)") % {"n": n}))
    d = Disk.objects.filter(team=team).live().count()
    if d:
        held.append(str(_("%(n)d disk(s)") % {"n": d}))
    return held
