"""Who may reach an instance's web port through the console, and where the tunnel goes.

Above ``ports`` (the port rules, links and cookies) and ``provisioning`` (the instance's spec):
the port proxy (``slices/port_views.py``) and an AI app's API ask here, once per request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Q
from django.http import Http404
from django.utils import timezone

from slices.drivers.base import InstanceSpec, NodeTarget
from slices.models import Instance, InstanceNode, ShareLink
from slices.services import ports
from slices.services.provisioning import build_spec


@dataclass(frozen=True)
class Access:
    """Who opened which port, and where the tunnel goes."""

    instance: Instance
    port: int
    via: str  # "owner" or "share"
    share_link_id: int | None
    spec: InstanceSpec
    node: NodeTarget
    node_port: int  # the port on the node: the published host port on a shared node
    keep_prefix: bool  # the app knows its base URL (JupyterLab): forward the full path
    prefix: str  # where the port is mounted (path mode) or "" (its own host)


@dataclass(frozen=True)
class Credentials:
    """What a request brings: the console session's user (path mode only), the share cookie's
    secret (path mode) and the app host's cookie (subdomain mode)."""

    user: Any = None
    share_secret: str = ""
    app_cookie: str = ""
    app_host: bool = False


def _owner_may(user: Any, instance: Instance) -> bool:
    return bool(user is not None and getattr(user, "is_authenticated", False)) and (
        instance.owner_id == user.pk
    )


def resolve_access(public_id: Any, port: int, creds: Credentials) -> Access:
    """The access to ``port`` of instance ``public_id`` these credentials give, or 404."""
    instance = ports.running_instance(public_id)
    if instance is None or port not in {p.port for p in ports.web_ports(instance)}:
        raise Http404
    via, link_id = "", None
    if creds.app_host:
        grant = ports.read_app_cookie(creds.app_cookie, instance, port)
        if grant is not None and ports.grant_allows(grant, instance, port):
            via = "owner" if "u" in grant else "share"
            link_id = None if "u" in grant else int(grant["s"])
    else:
        if _owner_may(creds.user, instance):
            via = "owner"
        elif creds.share_secret:
            link = ports.share_link_for_secret(creds.share_secret)
            if link is not None and link.instance_id == instance.pk and link.port == port:
                via, link_id = "share", link.pk
    if not via:
        raise Http404
    if link_id is not None:
        # Every proxied request of a shared app passes here (JupyterLab loads dozens of files):
        # the time it was last used is written at most once a minute, not once a request.
        now = timezone.now()
        ShareLink.objects.filter(pk=link_id).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - ports.LAST_USED_RESOLUTION)
        ).update(last_used_at=now)
    spec, node, node_port = tunnel_target(instance, port)
    return Access(
        instance=instance,
        port=port,
        via=via,
        share_link_id=link_id,
        spec=spec,
        node=node,
        node_port=node_port,
        keep_prefix=port in ports.BASE_URL_PORTS or creds.app_host,
        prefix="" if creds.app_host else ports.port_path(instance, port).rstrip("/"),
    )


def tunnel_target(instance: Instance, port: int) -> tuple[InstanceSpec, NodeTarget, int]:
    """Rank 0's node (where a web app of a slice runs) and the port there: the host port docker
    published on a shared node, else the port itself (host networking, a bare process)."""
    part = InstanceNode.objects.filter(instance=instance).order_by("rank").first()
    if part is None:
        raise Http404
    spec = build_spec(instance)
    node = spec.nodes[0]
    published = (part.published_ports or {}).get(str(port))
    return spec, node, int(published) if published else port
