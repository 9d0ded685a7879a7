"""TCP tunnels to an instance's ports: paramiko ``direct-tcpip`` channels over one long-lived,
pinned connection per node, shared by every tunnel of this process (issue 19).

The connection is the driver's own (``SshConnections._connect``: the node's pinned host key, the
console's key); it is opened on the first tunnel to a node and kept while it is alive, so a
JupyterLab page's dozens of requests cost one channel each, not one SSH handshake each. The
channel goes to ``127.0.0.1:<port>`` as the node sees it: nothing is published on the node's
public interfaces, and sshd's own ``AllowTcpForwarding`` must allow the console's user.
"""

from __future__ import annotations

import threading
import time

import paramiko

from slices.drivers.base import DriverError, NodeTarget
from slices.drivers.ssh.client import SshConnections

_Key = tuple[str, str, str, int, str, str]
# A connection with no channel for this long is closed when the next tunnel is asked for.
IDLE_SECONDS = 300.0


class _Shared:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clients: dict[_Key, tuple[paramiko.SSHClient, float]] = {}
        self.connecting: dict[_Key, threading.Lock] = {}


_SHARED = _Shared()


def _key(conns: SshConnections, node: NodeTarget) -> _Key:
    s = conns.settings
    return (s.user, s.key_file, node.hostname, node.port, node.address, node.host_key)


def _alive(client: paramiko.SSHClient) -> bool:
    transport = client.get_transport()
    return transport is not None and transport.is_active()


def _client(conns: SshConnections, node: NodeTarget) -> paramiko.SSHClient:
    key = _key(conns, node)
    now = time.monotonic()
    stale: list[paramiko.SSHClient] = []
    with _SHARED.lock:
        for k, (client, used) in list(_SHARED.clients.items()):
            transport = client.get_transport()
            idle = transport is None or not transport._channels.values()  # noqa: SLF001
            if not _alive(client) or (k != key and idle and now - used > IDLE_SECONDS):
                stale.append(client)
                del _SHARED.clients[k]
        found = _SHARED.clients.get(key)
        if found is not None:
            _SHARED.clients[key] = (found[0], now)
        gate = _SHARED.connecting.setdefault(key, threading.Lock())
    for client in stale:
        client.close()
    if found is not None:
        return found[0]
    # One handshake per node at a time: the others wait for it and share the connection.
    with gate:
        with _SHARED.lock:
            found = _SHARED.clients.get(key)
        if found is not None and _alive(found[0]):
            return found[0]
        client = conns._connect(node)  # noqa: SLF001 - the driver's pinned connect
        with _SHARED.lock:
            _SHARED.clients[key] = (client, time.monotonic())
        return client


def open_channel(
    conns: SshConnections, node: NodeTarget, port: int, host: str = "127.0.0.1"
) -> paramiko.Channel:
    """A ``direct-tcpip`` channel to ``host:port`` as ``node`` sees it."""
    if not 0 < int(port) < 65536:
        raise DriverError("bad_identifier", f"port {port!r}", permanent=True)
    for attempt in (1, 2):
        client = _client(conns, node)
        transport = client.get_transport()
        try:
            if transport is None:
                raise paramiko.SSHException("no transport")
            return transport.open_channel(
                "direct-tcpip",
                (host, int(port)),
                ("127.0.0.1", 0),
                timeout=conns.settings.connect_timeout,
            )
        except paramiko.ChannelException as exc:
            # The node answered: nothing listens there (connect refused), or forwarding is off.
            raise DriverError(
                "port_closed", f"{node.hostname}: port {port}: {exc.text or exc.code}"
            ) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            with _SHARED.lock:
                if _SHARED.clients.get(_key(conns, node), (None,))[0] is client:
                    del _SHARED.clients[_key(conns, node)]
            client.close()
            if attempt == 2:
                raise DriverError(
                    "unreachable", f"{node.hostname}: {type(exc).__name__}: {exc}"[:300]
                ) from None
    raise AssertionError("unreachable")  # pragma: no cover


def close_all() -> None:
    """Close every shared connection (tests; a worker shutting down)."""
    with _SHARED.lock:
        clients = [c for c, _ in _SHARED.clients.values()]
        _SHARED.clients.clear()
    for client in clients:
        client.close()
