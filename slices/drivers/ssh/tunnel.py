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
# How long the node's word that a port is the instance's own is taken without asking again (a
# page's burst of requests costs one check); another process can take the port over only after
# the instance's own listener closed, and is found at the first check after this.
OWNER_CHECK_SECONDS = 2.0
# A word older than this is asked again in the background by the next request that uses it (the
# request does not wait): steady traffic (a chat's messages, a page's requests) never waits for
# the node's check, and still no request is served on a word older than OWNER_CHECK_SECONDS.
OWNER_REFRESH_AFTER = OWNER_CHECK_SECONDS / 2
# Exit statuses of the ownership checks (``commands.CMD_PORT_OWNER*``).
_NOT_LISTENING, _NOT_RUNNING, _NOT_OWNED = 3, 5, 6


class _Shared:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clients: dict[_Key, tuple[paramiko.SSHClient, float]] = {}
        self.connecting: dict[_Key, threading.Lock] = {}
        # (node, instance, port) -> until when the port was found to be the instance's own
        self.owned: dict[tuple[_Key, str, int], float] = {}
        self.refreshing: set[tuple[_Key, str, int]] = set()  # asked again in the background


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


def open_owned_channel(
    conns: SshConnections, node: NodeTarget, port: int, owner: tuple[str, str]
) -> paramiko.Channel:
    """``open_channel`` to ``127.0.0.1:<port>``, kept only if the node says the port is the
    instance's own: ``owner`` is (the instance's slug, the rendered check that exits 0 when every
    listener on the port is the instance's). The check runs after the channel is open, on the
    same connection, so the listener that took the connection is one it saw: were that another
    process's, it would still listen and be found (or have closed, resetting the connection);
    nothing is sent on the channel before the check passed. ``port_not_instance`` (permanent)
    when the port is another's, ``port_closed`` when nothing listens there."""
    chan = open_channel(conns, node, port)
    try:
        check_owner(conns, node, port, owner)
    except DriverError:
        chan.close()
        raise
    return chan


def check_owner(conns: SshConnections, node: NodeTarget, port: int, owner: tuple[str, str]) -> None:
    """Whether the node says ``port`` is the instance's own (``owner``: its slug and the rendered
    check), taken for ``OWNER_CHECK_SECONDS`` once it did: ``port_not_instance`` (permanent)
    when it is another's, ``port_closed`` when nothing listens there. The edge's OpenSSH
    forwards (``slices.drivers.ssh.edge``) ask it before every use too. A word past
    ``OWNER_REFRESH_AFTER`` is still taken, and asked again in the background."""
    slug, _script = owner
    key = (_key(conns, node), slug, int(port))
    with _SHARED.lock:
        left = _SHARED.owned.get(key, 0.0) - time.monotonic()
        refresh = 0 < left < OWNER_CHECK_SECONDS - OWNER_REFRESH_AFTER
        refresh = refresh and key not in _SHARED.refreshing
        if refresh:
            _SHARED.refreshing.add(key)
    if refresh:
        threading.Thread(
            target=_refresh_owner, args=(conns, node, port, owner, key), daemon=True
        ).start()
    if left > 0:
        return
    _ask_owner(conns, node, port, owner, key)


def _refresh_owner(
    conns: SshConnections,
    node: NodeTarget,
    port: int,
    owner: tuple[str, str],
    key: tuple[_Key, str, int],
) -> None:
    """Ask the node again for a word about to lapse; any failure forgets the word, so the next
    request asks (and is refused) itself."""
    try:
        _ask_owner(conns, node, port, owner, key)
    except Exception:  # noqa: BLE001 - a background check: the next request asks and says why
        with _SHARED.lock:
            _SHARED.owned.pop(key, None)
    finally:
        with _SHARED.lock:
            _SHARED.refreshing.discard(key)


def _ask_owner(
    conns: SshConnections,
    node: NodeTarget,
    port: int,
    owner: tuple[str, str],
    key: tuple[_Key, str, int],
) -> None:
    script = owner[1]
    client = _client(conns, node)
    result = conns.run_script(
        client, node, script, timeout=max(10.0, conns.settings.connect_timeout), check=False
    )
    if result.exit_status != 0:
        with _SHARED.lock:
            _SHARED.owned.pop(key, None)
        why = result.stderr.strip()[-300:] or f"exit {result.exit_status}"
        if result.exit_status == _NOT_OWNED:
            raise DriverError("port_not_instance", f"{node.hostname}: {why}", permanent=True)
        closed = result.exit_status in (_NOT_LISTENING, _NOT_RUNNING)
        code = "port_closed" if closed else "command_failed"
        raise DriverError(code, f"{node.hostname}: port {port}: {why}")
    with _SHARED.lock:
        now = time.monotonic()
        for k, until in list(_SHARED.owned.items()):
            if until <= now:
                del _SHARED.owned[k]
        _SHARED.owned[key] = now + OWNER_CHECK_SECONDS


def close_all() -> None:
    """Close every shared connection (tests; a worker shutting down)."""
    with _SHARED.lock:
        clients = [c for c, _ in _SHARED.clients.values()]
        _SHARED.clients.clear()
    for client in clients:
        client.close()
    with _SHARED.lock:
        _SHARED.owned.clear()
        _SHARED.refreshing.clear()
