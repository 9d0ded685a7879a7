"""An instance's web ports through the console (issues 19, 29): which ports an instance has, their
URLs, who may open them, share links, and where the proxy's tunnel goes.

- Ports: the image's http ports (catalogue data: JupyterLab 8888, TensorBoard 6006) and up to
  ``MAX_WEB_PORTS`` the customer declared at order time (``Instance.web_ports``).
- The origin rule (SECURITY.md): a port is served only on its own host
  ``<id>-<port>.<APPS_DOMAIN>``, a site apart from the console's (``console.sites``), never on
  the console's origin. The console's own routes for ports and share links only redirect there.
- Access: the console hands a browser over to the app host with a one-time, short-lived signed
  hand-off naming a ``PortGrant`` (the owner's, or a share link's); the app host claims it once
  and keeps its own cookie naming the grant. Every request checks the grant is live: the owner's
  end when they log out, a share link's when the link does; all end when the instance stops.
  Anyone else, and every port of an instance that is not running, gets 404: the same answer as
  for an instance that does not exist.
- Share links expire (``SHARE_LIFETIMES``, 24 h by default), end when revoked and when the
  instance stops or is released. The secret is only in the URL; the database keeps its sha256.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core import signing
from django.db import transaction
from django.http import Http404
from django.http.request import split_domain_port
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import get_language, gettext_noop

from console import sites
from console.api.compiled import CompiledQuery
from console.names import NameRefused, clean_name
from console.tenancy import as_acting, member_role, user_of
from marketplace import aiapps
from marketplace import services as marketplace
from slices.choices import InstanceState
from slices.errors import OrderRefused
from slices.models import Instance, PortGrant, ShareLink

MAX_WEB_PORTS = 10
PORT_MIN, PORT_MAX = 1024, 65535
JUPYTER_PORT = 8888
TENSORBOARD_PORT = 6006
# Ports whose app is told its base URL by the launch template (JUPYTER_BASE_URL): the proxy keeps
# the path prefix for them. Every other app sees its requests at "/" (X-Forwarded-Prefix says
# where it is mounted).
BASE_URL_PORTS = frozenset({JUPYTER_PORT})
# How long the signed hand-off to an app host is good for, and its cookie.
HANDOFF_SECONDS = 60
LAST_USED_RESOLUTION = timedelta(minutes=1)  # a share link's last use, to the minute
APP_COOKIE_SECONDS = 12 * 3600
APP_COOKIE = "gpc_app"
# The lifetimes an owner may give a share link (its select on the page, ``lifetime`` in a form).
SHARE_LIFETIMES: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
DEFAULT_SHARE_LIFETIME = "24h"
_SALT_HANDOFF = "slices.ports.handoff"
_SALT_APP = "slices.ports.app"


# ---------------------------------------------------------------------------------------------
# Declared ports (order time)
# ---------------------------------------------------------------------------------------------


def ssh_port_range() -> range:
    """The node ports the instances' own sshd use (SLICES_INSTANCE_SSH_PORTS, "30000-30999"):
    never a web port."""
    text = str(getattr(settings, "SLICES_INSTANCE_SSH_PORTS", "30000-30999") or "30000-30999")
    m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not m:
        return range(30000, 31000)
    return range(int(m.group(1)), int(m.group(2)) + 1)


def _refuse(template: str, **params: Any) -> OrderRefused:
    return OrderRefused(template, field="web_ports", **params)


def clean_web_ports(value: Any) -> list[dict[str, Any]]:
    """The declared web ports as stored (``[{"port": 7860, "name": "Gradio"}]``), or
    ``OrderRefused`` naming the ``web_ports`` field: at most 10, each an integer 1024–65535
    outside the instances' SSH port range, not twice, and a name by console/names.py's rules."""
    if value in (None, ""):
        return []
    if not isinstance(value, list | tuple):
        raise _refuse(gettext_noop("Web ports must be a list of {port, name} entries."))
    if len(value) > MAX_WEB_PORTS:
        raise _refuse(gettext_noop("At most %(max)d web ports."), max=MAX_WEB_PORTS)
    ssh = ssh_port_range()
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    for entry in value:
        raw = entry.get("port") if isinstance(entry, dict) else entry
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise _refuse(gettext_noop("Each web port needs a port number."))
        try:
            port = int(str(raw).strip())
        except ValueError:
            raise _refuse(
                gettext_noop("%(port)s is not a port number."), port=repr(str(raw)[:16])
            ) from None
        if not PORT_MIN <= port <= PORT_MAX:
            raise _refuse(
                gettext_noop("Web ports are between %(min)d and %(max)d (not %(port)d)."),
                min=PORT_MIN,
                max=PORT_MAX,
                port=port,
            )
        if port in ssh:
            raise _refuse(
                gettext_noop(
                    "Port %(port)d is in the range kept for the instances' SSH "
                    "(%(first)d–%(last)d)."
                ),
                port=port,
                first=ssh.start,
                last=ssh.stop - 1,
            )
        if port in seen:
            raise _refuse(gettext_noop("Port %(port)d is listed twice."), port=port)
        seen.add(port)
        name_raw = entry.get("name", "") if isinstance(entry, dict) else ""
        if not isinstance(name_raw, str):
            raise _refuse(gettext_noop("A web port's name must be text."))
        try:
            name = clean_name(name_raw, max_length=40, field="web_ports")
        except NameRefused as exc:
            raise OrderRefused(exc.template, field="web_ports", **exc.params) from None
        out.append({"port": port, "name": name or f"Port {port}"})
    return out


def parse_web_ports_text(text: str) -> list[dict[str, Any]]:
    """The order form's field: entries separated by commas or lines, each ``<port> [name]``
    ("7860 Gradio, 8000 API"); checked by ``clean_web_ports`` afterwards."""
    entries: list[dict[str, Any]] = []
    for chunk in re.split(r"[,\n;，]", text or ""):
        chunk = chunk.strip()
        if not chunk:
            continue
        port, _sep, name = chunk.partition(" ")
        entries.append({"port": port, "name": name.strip()})
    return entries


def new_access_token() -> str:
    """The instance's secret (JupyterLab's token), made at order time."""
    return secrets.token_hex(24)


def new_app_api_key() -> str:
    """An AI application's API key (issue 20): ``sk-gpc-`` and 40 hex digits (clients that expect
    an OpenAI-like key accept it); it opens the app's API and nothing else of the instance."""
    return "sk-gpc-" + secrets.token_hex(20)


# ---------------------------------------------------------------------------------------------
# An instance's ports and their URLs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebPort:
    port: int
    name: str
    kind: str  # "jupyter", "tensorboard", "declared" or "image"


def _image_http_ports(instance: Instance) -> list[tuple[int, str]]:
    if not instance.image:
        return []
    try:
        version = marketplace.get_image_version(instance.image)
    except Http404:
        return []
    out = []
    for p in version.ports:
        if isinstance(p, dict) and p.get("protocol", "http") == "http":
            port = p.get("port")
            if isinstance(port, int) and 0 < port < 65536:
                out.append((port, str(p.get("name") or f"Port {port}")))
    return out


def _app_ports(instance: Instance) -> list[WebPort] | None:
    """An AI application's ports (its manifest's, the primary first), or None for any other
    instance: an app runs its own command, not the image's JupyterLab."""
    app = aiapps.get_app(instance.app) if instance.app else None
    if app is None:
        return None
    language = get_language() or "zh-hans"
    kinds = {JUPYTER_PORT: "jupyter", TENSORBOARD_PORT: "tensorboard"}
    return [
        WebPort(p.port, p.localized_name(language), kinds.get(p.port, "app"))
        for p in sorted(app.ports, key=lambda p: not p.primary)
    ]


def web_ports(instance: Instance) -> list[WebPort]:
    """The instance's web ports: JupyterLab first, then the image's others, then the declared;
    an AI application's are its manifest's."""
    app_ports = _app_ports(instance)
    if app_ports is not None:
        return app_ports
    found: dict[int, WebPort] = {}
    for port, name in _image_http_ports(instance):
        kind = {JUPYTER_PORT: "jupyter", TENSORBOARD_PORT: "tensorboard"}.get(port, "image")
        found.setdefault(port, WebPort(port, name, kind))
    for entry in instance.web_ports or []:
        port = int(entry["port"])
        found.setdefault(port, WebPort(port, str(entry.get("name") or port), "declared"))
    order = {"jupyter": 0, "tensorboard": 1, "image": 2, "declared": 3}
    return sorted(found.values(), key=lambda p: (order[p.kind], p.port))


def node_ports(instance: Instance) -> tuple[int, ...]:
    """What a shared node publishes for the instance: its image's ports and the declared ones."""
    return tuple(sorted({p.port for p in web_ports(instance)}))


def apps_domain() -> str:
    return str(getattr(settings, "APPS_DOMAIN", "") or "").strip().strip(".").lower()


def port_path(instance: Instance, port: int) -> str:
    """The console's own route for a port: it only ever redirects to the app host."""
    return f"/instances/{instance.public_id}/ports/{port}/"


def app_host(instance: Instance, port: int) -> str:
    return f"{instance.public_id}-{port}.{apps_domain()}"


def port_url(instance: Instance, port: int, request: Any = None) -> str:
    """The port's own origin (``http://<id>-<port>.localhost:8000/`` in the embedded default):
    ``APPS_SCHEME``/``APPS_PORT`` when set, else the scheme and port the console was reached on.

    The port is the one the browser used, from the request's ``Host``: behind the edge (issue 34)
    the web process listens on a port of its own (``WEB_PORT``) that nobody outside reaches,
    and the app hosts are served by nginx on the browser's port, as the console is."""
    scheme = str(getattr(settings, "APPS_SCHEME", "") or "")
    if not scheme:
        scheme = request.scheme if request is not None else "http"
        if getattr(settings, "SESSION_COOKIE_SECURE", False):
            scheme = "https"
    number = getattr(settings, "APPS_PORT", None)
    if number is None and request is not None:
        _domain, given = split_domain_port(request.get_host())
        number = int(given) if given.isdigit() else None
    default = {"http": 80, "https": 443}[scheme]
    suffix = f":{number}" if number and number != default else ""
    return f"{scheme}://{app_host(instance, port)}{suffix}/"


def base_url_env(instance: Instance) -> dict[str, str]:
    """The console's variables for the launch template: JupyterLab's token and base URL (its own
    host: "/"), and an AI application's slug and API key (its server accepts the key, or the
    token the console's proxy adds for the owner)."""
    env = {"JUPYTER_TOKEN": instance.access_token, "JUPYTER_BASE_URL": "/"}
    if instance.app:
        env |= {"GPC_APP": instance.app, "GPC_APP_API_KEY": instance.app_api_key}
    return env


def ports_data(
    instance: Instance, *, owner_view: bool, request: Any = None
) -> list[dict[str, Any]]:
    """The API's ``ports``: each port's number, name, URL and, for the owner, its share links."""
    if instance.state != InstanceState.RUNNING:
        return []  # opened only while running
    found = web_ports(instance)
    links: dict[int, list[ShareLink]] = {}
    if owner_view and found:
        # .all(): the list's prefetch when there is one
        now = timezone.now()
        for link in instance.share_links.all():
            if link.revoked_at is None and link.expires_at > now:
                links.setdefault(link.port, []).append(link)
    return [
        {
            "port": p.port,
            "name": p.name,
            "kind": p.kind,
            "url": port_url(instance, p.port, request),
            "share_links": [
                {
                    "id": link.pk,
                    "created_at": link.created_at,
                    "expires_at": link.expires_at,
                    "last_used_at": link.last_used_at,
                }
                for link in links.get(p.port, [])
            ],
        }
        for p in found
    ]


def page_ports(instance: Instance, request: Any = None) -> list[dict[str, Any]]:
    """The instance page's rows: each port, the console's Open link and its live share links."""
    links: dict[int, list[ShareLink]] = {}
    live = instance.share_links.filter(revoked_at__isnull=True, expires_at__gt=timezone.now())
    for link in live.order_by("created_at"):
        links.setdefault(link.port, []).append(link)
    return [
        {
            "port": p.port,
            "name": p.name,
            "kind": p.kind,
            "url": port_url(instance, p.port, request),
            "open_url": reverse(
                "slices:instance-port-open",
                kwargs={"public_id": instance.public_id, "port": p.port},
            ),
            "links": links.get(p.port, []),
        }
        for p in web_ports(instance)
    ]


# ---------------------------------------------------------------------------------------------
# Share links
# ---------------------------------------------------------------------------------------------


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _owned_port(user: Any, instance: Instance, port: int) -> None:
    if not as_acting(user).may_operate(instance):
        raise Http404
    if port not in {p.port for p in web_ports(instance)}:
        raise Http404


def share_lifetime(value: Any) -> timedelta:
    """The lifetime an owner picked (``SHARE_LIFETIMES``), the default when none; any other value
    is refused naming the ``lifetime`` field."""
    key = str(value or DEFAULT_SHARE_LIFETIME)
    if key not in SHARE_LIFETIMES:
        raise OrderRefused(
            gettext_noop("A share link lasts %(choices)s; %(value)s is not one of them."),
            field="lifetime",
            choices=", ".join(SHARE_LIFETIMES),
            value=key[:20],
        )
    return SHARE_LIFETIMES[key]


@transaction.atomic
def create_share_link(
    user: Any, instance: Instance, port: int, lifetime: Any = None
) -> tuple[ShareLink, str]:
    """A new share link to ``port`` of the owner's running instance, and its secret (shown once,
    in the URL; only its hash is kept). It lasts ``lifetime`` (24 h unless chosen)."""
    _owned_port(user, instance, port)
    ttl = share_lifetime(lifetime)
    secret = secrets.token_urlsafe(32)
    link = ShareLink.objects.create(
        instance=instance,
        port=port,
        token_hash=_hash(secret),
        created_by=user_of(user),
        expires_at=timezone.now() + ttl,
    )
    return link, secret


def revoke_share_link(user: Any, instance: Instance, link_id: int) -> bool:
    """Revoke one of the owner's share links (404 for anyone else's); whether this call did."""
    if not as_acting(user).may_operate(instance):
        raise Http404
    link = ShareLink.objects.filter(pk=link_id, instance=instance).first()
    if link is None:
        raise Http404
    now = timezone.now()
    done = ShareLink.objects.filter(pk=link.pk, revoked_at__isnull=True).update(revoked_at=now)
    PortGrant.objects.filter(share_link=link, revoked_at__isnull=True).update(revoked_at=now)
    return done == 1


def end_web_access(instance: Instance) -> int:
    """The instance stops or is released: its share links and every browser's grant end now
    (a later start gives no link back). How many links ended."""
    now = timezone.now()
    PortGrant.objects.filter(instance=instance, revoked_at__isnull=True).update(revoked_at=now)
    return ShareLink.objects.filter(instance=instance, revoked_at__isnull=True).update(
        revoked_at=now
    )


def end_member_grants(team: Any, user_id: int) -> int:
    """A member left the team: their app-host cookies on its instances end now, and so do the
    share links they made and every cookie those links gave (issue 30)."""
    now = timezone.now()
    links = ShareLink.objects.filter(
        created_by_id=user_id, instance__team=team, revoked_at__isnull=True
    )
    PortGrant.objects.filter(share_link__in=links, revoked_at__isnull=True).update(revoked_at=now)
    links.update(revoked_at=now)
    return PortGrant.objects.filter(
        user_id=user_id, instance__team=team, revoked_at__isnull=True
    ).update(revoked_at=now)


def end_user_grants(user: Any) -> int:
    """The user logged out: every app host's cookie made from their session ends."""
    if getattr(user, "pk", None) is None:
        return 0
    return PortGrant.objects.filter(user_id=user.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )


def share_url(secret: str) -> str:
    return reverse("slices:port-share", kwargs={"secret": secret})


def share_link_for_secret(secret: str) -> ShareLink | None:
    """The live share link of ``secret`` on a running instance, or None."""
    if not secret or len(secret) > 100:
        return None
    return (
        ShareLink.objects.select_related("instance")
        .filter(
            token_hash=_hash(secret),
            revoked_at__isnull=True,
            expires_at__gt=timezone.now(),
            instance__state=InstanceState.RUNNING,
        )
        .first()
    )


# ---------------------------------------------------------------------------------------------
# Access
# ---------------------------------------------------------------------------------------------


# Every request to an app host asks these three (the edge's auth answer, the embedded proxy):
# their SQL is built once per process (console/api/compiled.py), the values checked every time.
_RUNNING = CompiledQuery(
    lambda public_id: Instance.objects.select_related("team", "created_by").filter(
        public_id=public_id, state=InstanceState.RUNNING
    ),
    public_id=Instance._meta.get_field("public_id"),
)
_LIVE_GRANT = CompiledQuery(
    lambda pk, instance, port, now: PortGrant.objects.select_related(
        "share_link", "instance"
    ).filter(
        pk=pk,
        instance=instance,
        port=port,
        claimed_at__isnull=False,
        revoked_at__isnull=True,
        expires_at__gt=now,
    ),
    pk=PortGrant._meta.get_field("id"),
    instance=PortGrant._meta.get_field("instance"),
    port=PortGrant._meta.get_field("port"),
    now=PortGrant._meta.get_field("expires_at"),
)


def _running(public_id: Any) -> Instance | None:
    try:
        pid = uuid.UUID(str(public_id))
    except ValueError:
        return None
    return _RUNNING.first(public_id=pid)


def running_instance(public_id: Any) -> Instance | None:
    """The running instance ``public_id`` whoever owns it (callers check access), or None."""
    return _running(public_id)


def is_open(instance: Instance, port: int) -> bool:
    """Whether ``port`` is one of the running instance's web ports."""
    return instance.state == InstanceState.RUNNING and port in {p.port for p in web_ports(instance)}


# -- the hand-off and the app host's cookie -------------------------------------------------


def handoff_token(
    instance: Instance, port: int, *, user_id: int | None, link_id: int | None
) -> str:
    """A signed, short-lived, one-time ticket the app host exchanges for its own cookie: it names
    a new ``PortGrant`` (the owner's or a share link's)."""
    grant = PortGrant.objects.create(
        instance=instance,
        port=port,
        user_id=user_id,
        share_link_id=link_id,
        expires_at=timezone.now() + timedelta(seconds=APP_COOKIE_SECONDS),
    )
    body = {"g": grant.pk, "i": str(instance.public_id), "p": port}
    return signing.dumps(body, salt=_SALT_HANDOFF, compress=True)


def handoff_url(
    instance: Instance, port: int, token: str, next_path: str = "/", request: Any = None
) -> str:
    from urllib.parse import urlencode

    query = urlencode({"t": token, "next": next_path})
    return f"{port_url(instance, port, request)}__gpc/auth?{query}"


def _signed(value: str, salt: str, max_age: int, instance: Instance, port: int) -> int | None:
    if not value or len(value) > 500:
        return None
    try:
        body = signing.loads(value, salt=salt, max_age=max_age)
    except signing.BadSignature:
        return None
    if not isinstance(body, dict) or body.get("i") != str(instance.public_id):
        return None
    grant_id = body.get("g")
    if body.get("p") != port or not isinstance(grant_id, int):
        return None
    return grant_id


def claim_handoff(token: str, instance: Instance, port: int) -> PortGrant | None:
    """The app host's half of the hand-off: the grant it names, claimed by this call (a token
    works once, within ``HANDOFF_SECONDS``), if it still holds; else None."""
    grant_id = _signed(token, _SALT_HANDOFF, HANDOFF_SECONDS, instance, port)
    if grant_id is None:
        return None
    now = timezone.now()
    claimed = PortGrant.objects.filter(pk=grant_id, claimed_at__isnull=True).update(claimed_at=now)
    if claimed != 1:
        return None
    return live_grant(grant_id, instance, port)


def app_cookie_value(grant: PortGrant) -> str:
    body = {"g": grant.pk, "i": str(grant.instance.public_id), "p": grant.port}
    return signing.dumps(body, salt=_SALT_APP, compress=True)


def live_grant(grant_id: int, instance: Instance, port: int) -> PortGrant | None:
    """The grant if it still gives access: claimed, not revoked, not expired, and the owner's
    grant still the owner's, a share link's still live."""
    grant = _LIVE_GRANT.first(pk=grant_id, instance=instance.pk, port=port, now=timezone.now())
    if grant is None:
        return None
    if grant.user_id is not None:
        # A member's grant lives while they may still operate the instance (issue 30).
        return grant if _member_may_operate(grant.user_id, instance) else None
    link = grant.share_link
    if link is None or link.revoked_at is not None or link.expires_at <= timezone.now():
        return None
    return grant


def grant_from_cookie(value: str, instance: Instance, port: int) -> PortGrant | None:
    grant_id = _signed(value, _SALT_APP, APP_COOKIE_SECONDS, instance, port)
    return None if grant_id is None else live_grant(grant_id, instance, port)


def parse_app_host(host: str) -> tuple[str, int] | None:
    """``(public_id, port)`` of an app host ``<uuid>-<port>.<APPS_DOMAIN>``, else None."""
    return sites.parse_app_host(host, apps_domain())


def _member_may_operate(user_id: int, instance: Instance) -> bool:
    from console.roles import Perm, can

    role = member_role(instance.team_id, user_id)
    if can(role, Perm.OPERATE_ALL):
        return True
    return can(role, Perm.COMPUTE) and instance.created_by_id == user_id
