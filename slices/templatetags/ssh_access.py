"""``{% ssh_access instance as ssh %}``: how to reach a running instance over SSH (the command
and the ``~/.ssh/config`` block, ``slices.services.access.ssh_access``), or None."""

from __future__ import annotations

from django import template

from slices.models import Instance
from slices.services.access import SshAccess
from slices.services.access import ssh_access as _ssh_access

register = template.Library()


@register.simple_tag
def ssh_access(instance: Instance) -> SshAccess | None:
    return _ssh_access(instance)
