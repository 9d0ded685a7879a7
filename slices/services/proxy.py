"""Who may reach an instance's web port through the console, and where the tunnel goes.

Above ``ports`` (the port rules, links and cookies) and ``provisioning`` (the instance's spec):
the port proxy (``slices/port_views.py``), the edge's auth answer (``slices/edge_views.py``) and an
AI app's API ask here, once per request.

Who may open the port is decided afresh on every request (the grant, the share link, the
instance running). Only where the tunnel goes (rank 0's node and the port there, several reads)
is kept, for ``TARGET_SECONDS`` in this process, and only for the instance as it was: the key
holds its ``state_changed_at``, which every transition sets, so a stop, a release, a restart
or a migration is never answered with the target from before it."""

from __future__ import annotations

import threading
import time
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
    keep_prefix: bool  # forward the full path (an app host: the app is at "/" of its own host)
    prefix: str  # where the console mounts it (an AI app's API) or "" (its own host)


def resolve_access(public_id: Any, port: int, app_cookie: str) -> Access:
    """The access to ``port`` of instance ``public_id`` that the app host's cookie gives (a live
    ``PortGrant``: the owner's or a share link's), or 404."""
    instance = ports.running_instance(public_id)
    if instance is None or port not in {p.port for p in ports.web_ports(instance)}:
        raise Http404
    grant = ports.grant_from_cookie(app_cookie, instance, port)
    if grant is None:
        raise Http404
    link_id = grant.share_link_id
    if link_id is not None:
        # Every proxied request of a shared app passes here (JupyterLab loads dozens of files):
        # the time it was last used is written at most once a minute, not once a request.
        now = timezone.now()
        ShareLink.objects.filter(pk=link_id).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - ports.LAST_USED_RESOLUTION)
        ).update(last_used_at=now)
    spec, node, node_port = cached_tunnel_target(instance, port)
    return Access(
        instance=instance,
        port=port,
        via="owner" if grant.user_id is not None else "share",
        share_link_id=link_id,
        spec=spec,
        node=node,
        node_port=node_port,
        keep_prefix=True,
        prefix="",
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


# How long this process keeps an instance's tunnel target (a few seconds at most: the decision of
# who may open the port is never kept).
TARGET_SECONDS = 2.0
_targets: dict[tuple[int, int, Any], tuple[float, tuple[InstanceSpec, NodeTarget, int]]] = {}
_targets_lock = threading.Lock()


def cached_tunnel_target(instance: Instance, port: int) -> tuple[InstanceSpec, NodeTarget, int]:
    """``tunnel_target``, kept ``TARGET_SECONDS`` for the instance in its present state (its
    ``state_changed_at``): JupyterLab's page asks for dozens of files at once, each asking
    the edge's auth answer or the proxy for the same target."""
    key = (instance.pk, int(port), instance.state_changed_at)
    now = time.monotonic()
    with _targets_lock:
        kept = _targets.get(key)
    if kept is not None and kept[0] > now:
        return kept[1]
    target = tunnel_target(instance, port)
    with _targets_lock:
        for old in [k for k, (until, _t) in _targets.items() if until <= now]:
            del _targets[old]
        _targets[key] = (now + TARGET_SECONDS, target)
    return target


def forget_tunnel_targets() -> None:
    """Drop every kept target (tests)."""
    with _targets_lock:
        _targets.clear()
