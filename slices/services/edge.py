"""The production edge's way to an instance's web port (issue 34).

nginx asks the console about every request to an app host (``slices.edge_views``); once the
console has said yes (``slices.services.proxy.resolve_access``: the same grants, share links and
origin rule as the embedded proxy), this names where nginx sends the bytes: a unix socket the
driver forwards to the port on the node (the ssh driver's OpenSSH master), or None where the
driver has none (the simulated fleet), and the console relays the request itself as in the
embedded default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from slices.drivers import DriverError, get_driver
from slices.services.proxy import Access


def tunnels_dir() -> Path:
    return Path(settings.EDGE_DIR) / "tunnels"


def upstream_socket(access: Access) -> str | None:
    """The socket nginx connects to for ``access``'s port, or None (the console relays: a driver
    without forwards, or a port the node does not confirm, where the console's own relay gives
    the proper answer)."""
    driver: Any = get_driver(access.instance.driver or None)
    make = getattr(driver, "edge_socket", None)
    if make is None:
        return None
    try:
        return str(make(access.spec, access.node, access.node_port, str(tunnels_dir())))
    except DriverError:
        return None
