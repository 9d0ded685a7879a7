"""Sites and app hosts (issue 29): tenant-controlled content is never served on the console's
origin, nor on its site.

A *site* is what browsers key cookies, ``SameSite`` and storage partitions on: the registrable
domain of a host (its public suffix plus one label, from the Public Suffix List that
``publicsuffixlist`` ships), or the host itself for an IP address or a name with no registrable
part (``localhost``, ``testserver``). The console's hosts and ``APPS_DOMAIN`` must be sites
apart; each app is then served on ``<instance id>-<port>.<APPS_DOMAIN>`` only.

Pure: no Django, so settings can check the rule before anything starts.
"""

from __future__ import annotations

import ipaddress
import re
from functools import cache

from publicsuffixlist import PublicSuffixList

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_APP_LABEL = re.compile(rf"({_UUID})-(\d{{1,5}})")


@cache
def _psl() -> PublicSuffixList:
    return PublicSuffixList()


def hostname(host: str) -> str:
    """``host`` without its port, lowercased, without a trailing dot (``[::1]:8000`` → ``::1``)."""
    text = host.strip().lower()
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    if text.count(":") == 1:
        text = text.split(":", 1)[0]
    return text.rstrip(".")


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def site_of(host: str) -> str:
    """The site of ``host``: its registrable domain, or the host itself when it has none."""
    name = hostname(host)
    if not name or is_ip(name):
        return name
    return _psl().privatesuffix(name) or name


def _under(name: str, domain: str) -> bool:
    return name == domain or name.endswith("." + domain)


def apps_domain_problem(apps_domain: str, console_hosts: list[str]) -> str | None:
    """Why ``apps_domain`` cannot hold tenants' apps beside these console hosts, or None.

    Refused: an empty or malformed domain, an IP address, and any console host whose site holds
    the apps' domain (``apps.example.com`` beside ``console.example.com``), or that lies under
    it. ``*`` and ``.`` wildcards in ``ALLOWED_HOSTS`` are read as the domain they name.
    """
    domain = hostname(apps_domain)
    if not domain:
        return "APPS_DOMAIN is empty: web ports need a domain of their own (e.g. gpc-apps.com)."
    if is_ip(domain) or not re.fullmatch(
        r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*", domain
    ):
        return f"APPS_DOMAIN {apps_domain!r} is not a domain name."
    app_site = site_of("x." + domain)  # the site an app host of the domain is on
    for entry in console_hosts:
        raw = entry.strip().lower()
        if raw in ("*", ""):
            continue
        name = hostname(raw.lstrip("."))
        if not name:
            continue
        console_site = site_of(name)
        if (
            _under(domain, console_site)
            or _under(name, domain)
            or site_of(domain) == console_site
            or app_site == console_site
        ):
            return (
                f"APPS_DOMAIN {domain!r} is on the console's own site ({console_site!r}, from "
                f"ALLOWED_HOSTS {entry!r}): tenants' apps would share the console's cookies and "
                "site. Give it a registrable domain of its own (e.g. the console on "
                "console.example.com, the apps on example-apps.com)."
            )
    return None


def parse_app_host(host: str, apps_domain: str) -> tuple[str, int] | None:
    """``(instance public id, port)`` of an app host ``<uuid>-<port>.<apps_domain>``, else None
    (also for a name under the domain that is not an app's)."""
    domain = hostname(apps_domain)
    name = hostname(host)
    if not domain or not name.endswith("." + domain):
        return None
    m = _APP_LABEL.fullmatch(name[: -len(domain) - 1])
    if m is None:
        return None
    port = int(m.group(2))
    if not 1 <= port <= 65535:
        return None
    return m.group(1), port


def under_apps_domain(host: str, apps_domain: str) -> bool:
    """Whether ``host`` is the apps' domain or a name under it (never a console host)."""
    domain = hostname(apps_domain)
    return bool(domain) and _under(hostname(host), domain)
