"""The SSH driver's half of reaching an instance (issue 19): the region gateway's keys file, and
the instance's own sshd on a node.

The gateway is managed like a node: over SSH with the console's key as ``SLICES_SSH_USER``, its
host key pinned (``Gateway.host_key_fingerprint``; no trust on first use). Its keys file (the jump
user's ``authorized_keys``) is replaced whole over SFTP: written to a temporary file beside it,
made readable (mode 644: sshd reads it as the jump user, who must not be able to change it), then
renamed over the old one, so sshd never reads half a file. A gateway that forwards ports gets its
routes file (``routes`` beside the keys file) the same way. The directory is the operator's (see
the README): the driver creates nothing else on the gateway and runs no command there.
"""

from __future__ import annotations

import contextlib
import io
import posixpath
import secrets

import paramiko

from slices.drivers.base import (
    DriverError,
    GatewayGrant,
    GatewayTarget,
    LogFn,
    NodeTarget,
    StepResult,
)
from slices.drivers.gateway import keys_file, routes_file
from slices.drivers.ssh.client import SshConnections
from slices.drivers.ssh.commands import clean_abs


def gateway_node(gateway: GatewayTarget) -> NodeTarget:
    """The gateway as a connection target (its management address, port and pinned key)."""
    return NodeTarget(
        hostname=f"gateway {gateway.host}",
        address=gateway.address,
        port=gateway.ssh_port,
        host_key=gateway.host_key,
        rank=0,
        gpus=(),
    )


def management_key(conn: SshConnections) -> str:
    """``<type> <base64>`` of the console's own key: never let through a gateway."""
    key = conn._private_key()
    return f"{key.get_name()} {key.get_base64()}"


def replace_file(client: paramiko.SSHClient, path: str, data: bytes, mode: int) -> None:
    """Write ``path`` atomically over SFTP: a temporary file in its directory, then a rename."""
    directory, name = posixpath.split(path)
    tmp = f"{directory}/.{name}.{secrets.token_hex(6)}.tmp"
    try:
        sftp = client.open_sftp()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise DriverError("unreachable", f"SFTP: {type(exc).__name__}: {exc}") from None
    try:
        try:
            sftp.putfo(io.BytesIO(data), tmp)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                sftp.remove(tmp)
            raise DriverError("command_failed", f"writing {path}: {exc}") from None
    finally:
        sftp.close()


def sync_gateway_keys(
    conn: SshConnections,
    gateway: GatewayTarget,
    grants: tuple[GatewayGrant, ...],
    log: LogFn,
) -> StepResult:
    """Replace the gateway's whole keys file with ``grants`` (the console's key left out), and
    its routes file with ``gateway.routes`` when it forwards ports (issue 29)."""
    path = clean_abs(gateway.keys_file, "the gateway's keys file")
    text, count = keys_file(grants, exclude=(management_key(conn),))
    routes_path = routes_text = ""
    routes = 0
    if gateway.routes_file:
        routes_path = clean_abs(gateway.routes_file, "the gateway's routes file")
        routes_text, routes = routes_file(gateway.routes)
    with conn.session(gateway_node(gateway), last=True) as client:
        replace_file(client, path, text.encode(), 0o644)
        if routes_path:
            replace_file(client, routes_path, routes_text.encode(), 0o644)
    log(f"wrote {count} key(s) to {path} on {gateway.host}")
    if routes_path:
        log(f"wrote {routes} route(s) to {routes_path} on {gateway.host}")
    return StepResult({"keys": count, "bytes": len(text), "routes": routes})
