"""A region gateway's keys file, built from the grants the console computed (pure, no I/O).

One line per customer key, rebuilt from its type and base64 only (never the customer's pasted
line, so no option, comment or second line of theirs reaches the file)::

    restrict,port-forwarding,permitopen="10.21.1.3:30017",command="/bin/false" ssh-ed25519 AAAA… gpc:<owner>

``restrict`` turns off everything (pty, agent and X11 forwarding, ``~/.ssh/rc``, remote
forwarding); ``port-forwarding`` turns local forwarding back on, and ``permitopen`` limits it to
the key's own instance endpoints: ``ssh -J`` (``-W host:port``, a ``direct-tcpip`` channel) reaches
them and nothing else. The forced command answers any session (a shell, a command) with
``/bin/false``: the gateway gives no shell to a customer key.

A gateway with forwarded ports (``Gateway.ports``, issue 29) also gets a routes file beside the
keys file, one line per running instance: its public port (the instance's from its first start
to its release), the node address and port of its sshd now. ``slices/agent/gateway_forward.py``
on the gateway reads it and forwards each port, so ``ssh -p <port> root@<gateway>`` stays the same
across stop, start and migration.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from slices.drivers.base import DriverError, GatewayGrant, GatewayRoute

FORCED_COMMAND = "/bin/false"
ROUTES_HEADER = (
    "# Written by the GPU console (issue 29): the whole file is replaced on every change.\n"
    "# <public port> <node address> <instance sshd port> <instance>: read by gateway_forward.py\n"
)
HEADER = (
    "# Written by the GPU console (issue 19): the whole file is replaced on every change.\n"
    "# One line per customer key, restricted to forwarding to that customer's instances.\n"
)
KEY_RE = re.compile(
    r"(ssh-ed25519|ecdsa-sha2-nistp(?:256|384|521)|ssh-rsa) (AAAA[A-Za-z0-9+/]+={0,2})"
)
ADDRESS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,253}")
LABEL_RE = re.compile(r"[A-Za-z0-9_-]{0,64}")


def canonical_key(public_key: str) -> str:
    """``<type> <base64>`` of an OpenSSH key line, or "" when it is not one (whatever follows the
    base64, a comment or anything else, is dropped)."""
    parts = (public_key or "").split()
    if len(parts) < 2:
        return ""
    line = f"{parts[0]} {parts[1]}"
    return line if KEY_RE.fullmatch(line) else ""


def _hostport(address: str, port: int) -> str:
    if not ADDRESS_RE.fullmatch(address):
        raise DriverError("bad_identifier", f"destination address {address!r}", permanent=True)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise DriverError("bad_identifier", f"destination port {port!r}", permanent=True)
    host = f"[{address}]" if ":" in address else address
    return f"{host}:{port}"


def key_line(grant: GatewayGrant) -> str:
    """One line of the keys file (``DriverError`` for anything that is not a plain key, address
    or port: nothing of it could be written)."""
    key = canonical_key(grant.public_key)
    if not key or key != " ".join(grant.public_key.split()):
        raise DriverError("bad_identifier", "a gateway grant's public key", permanent=True)
    if not grant.destinations:
        raise DriverError("bad_identifier", "a gateway grant without destinations", permanent=True)
    if not LABEL_RE.fullmatch(grant.label):
        raise DriverError("bad_identifier", f"grant label {grant.label!r}", permanent=True)
    opens = ",".join(f'permitopen="{_hostport(a, p)}"' for a, p in sorted(set(grant.destinations)))
    comment = f" gpc:{grant.label}" if grant.label else ""
    return f'restrict,port-forwarding,{opens},command="{FORCED_COMMAND}" {key}{comment}'


def keys_file(grants: Iterable[GatewayGrant], *, exclude: Iterable[str] = ()) -> tuple[str, int]:
    """The whole file (header, then the lines sorted by key) and how many keys it lets through.
    A key in ``exclude`` (the console's own management key) is never written."""
    skip = {canonical_key(k) for k in exclude}
    merged: dict[str, tuple[set[str], set[tuple[str, int]]]] = {}
    for grant in grants:
        key = canonical_key(grant.public_key)
        if not key or key != grant.public_key:
            raise DriverError("bad_identifier", "a gateway grant's public key", permanent=True)
        if key in skip:
            continue
        labels, destinations = merged.setdefault(key, (set(), set()))
        labels.add(grant.label)
        destinations.update(grant.destinations)
    lines = sorted(
        key_line(GatewayGrant(key, tuple(destinations), next(iter(labels))))
        for key, (labels, destinations) in merged.items()
        # One key, two owners: neither is let through (one line would open both's instances).
        if len(labels) == 1
    )
    return HEADER + "".join(f"{line}\n" for line in lines), len(lines)


def routes_file(routes: Iterable[GatewayRoute]) -> tuple[str, int]:
    """The forwarder's routes file (header, then one line per public port, sorted) and how many
    routes it holds; ``DriverError`` for a port, address or label that is not plain, or a public
    port given twice (nothing of it could be written)."""
    lines: dict[int, str] = {}
    for route in routes:
        target = _hostport(route.address, route.dest_port)  # checks address and port
        if not isinstance(route.port, int) or isinstance(route.port, bool):
            raise DriverError("bad_identifier", f"public port {route.port!r}", permanent=True)
        if not 0 < route.port < 65536 or route.port in lines:
            raise DriverError("bad_identifier", f"public port {route.port!r}", permanent=True)
        if not LABEL_RE.fullmatch(route.label):
            raise DriverError("bad_identifier", f"route label {route.label!r}", permanent=True)
        host, _, port = target.rpartition(":")
        lines[route.port] = f"{route.port} {host.strip('[]')} {port} {route.label or '-'}".rstrip()
    return ROUTES_HEADER + "".join(f"{lines[p]}\n" for p in sorted(lines)), len(lines)
