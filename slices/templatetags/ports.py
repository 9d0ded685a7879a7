"""The instance page's web ports (``{% instance_web_ports instance as web %}``, issue 19)."""

from __future__ import annotations

from typing import Any

from django import template

from slices.models import Instance
from slices.services import ports

register = template.Library()


@register.simple_tag(takes_context=True)
def instance_web_ports(context: template.Context, instance: Instance) -> list[dict[str, Any]]:
    """Each web port with its URL (its own host), the console's Open link and its live share
    links."""
    return ports.page_ports(instance, context.get("request"))
