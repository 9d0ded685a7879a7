"""Reaching an instance over SSH through its region's gateway (issue 19).

- Each instance gets its own sshd on each of its nodes, on a port of ``SLICES_INSTANCE_SSH_PORTS``
  allocated per instance and node (``InstanceNode.ssh_port``; the partial unique constraint
  ``slices_instnode_ssh_port`` settles two instances picking one port at once). The port is
  given back when the instance leaves the node: released (``finish_teardown``), stopped
  (``drive_stop``) or moved by a migration (``_swap_in``); its next node gets a new one.
- The region's gateway lets a customer key through to exactly the endpoints of its owner's
  running instances: ``gateway_grants`` computes that from the database, ``sync_gateway`` has the
  driver write the gateway's whole keys file from it, under a lock (the row's, and this
  process's), recomputing inside the lock, so concurrent writers converge on the latest state.
  It runs after every change that adds or removes an endpoint (a task queued on commit by
  ``transition``) and every ``SLICES_GATEWAY_SYNC_INTERVAL`` seconds (beat).
- ``ssh_access`` is what the page and the API show: the command that works verbatim and the
  ``~/.ssh/config`` block.
- A gateway with forwarded ports (``Gateway.ports``, issue 29) gives each instance one public
  port of its own (``Instance.gateway_port``), allocated at its first start and kept until its
  release, through stop, start and migration: the shown endpoint is ``root@<gateway>:<port>``
  and stays the same, so a saved ``~/.ssh/config`` keeps working. The gateway's forwarder
  (``slices/agent/gateway_forward.py``) sends the port to wherever the instance's sshd runs now,
  from the routes file ``sync_gateway`` writes with the keys file (``gateway_routes``).
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections import defaultdict
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from console import services as console_services
from console.models import Membership, Team
from console.sshkeys import canonical_openssh
from slices.choices import InstanceState
from slices.drivers import get_driver
from slices.drivers.base import DriverError, GatewayGrant, GatewayRoute, GatewayTarget
from slices.drivers.gateway import canonical_key
from slices.models import Gateway, Instance, InstanceNode
from slices.services import jobs

logger = logging.getLogger(__name__)

# Runtimes that give an instance an sshd of its own (enroot: not yet; see the README).
SSHD_RUNTIMES = ("docker", "process")
PORT_TRIES = 8


def port_range() -> tuple[int, int]:
    low, high = (int(p) for p in str(settings.SLICES_INSTANCE_SSH_PORTS).split("-"))
    return low, high


def _runtime(part: InstanceNode) -> str:
    return str((part.node.layout or {}).get("runtime") or settings.SLICES_NODE_RUNTIME)


# ---------------------------------------------------------------------------------------------
# Ports
# ---------------------------------------------------------------------------------------------


def assign_ssh_ports(instance: Instance) -> dict[int, int]:
    """A port for the instance's sshd on each of its nodes that has none yet (rank -> port).

    Picked at random among the node's free ones (a port given back is not handed to the next
    instance at once), written with a compare-and-set; the unique constraint refuses a port
    another instance took meanwhile, and the next try sees it taken. A node whose range is full
    gets none (the instance runs without an SSH endpoint there, and says so in its log)."""
    low, high = port_range()
    assigned: dict[int, int] = {}
    parts = instance.nodes.select_related("node").filter(ssh_port__isnull=True)
    for part in parts:
        if _runtime(part) not in SSHD_RUNTIMES:
            continue
        for _attempt in range(PORT_TRIES):
            used = set(
                InstanceNode.objects.filter(node_id=part.node_id, ssh_port__isnull=False)
                .exclude(pk=part.pk)
                .values_list("ssh_port", flat=True)
            )
            free = [p for p in range(low, high + 1) if p not in used]
            if not free:
                logger.warning("no free instance SSH port on %s", part.node.hostname)
                break
            port = secrets.choice(free)
            try:
                with transaction.atomic():
                    won = InstanceNode.objects.filter(pk=part.pk, ssh_port__isnull=True).update(
                        ssh_port=port
                    )
            except IntegrityError:
                continue  # taken meanwhile by another instance on this node: look again
            if won:
                assigned[part.rank] = port
            break
    return assigned


def clear_ssh_ports(instance: Instance) -> int:
    """The instance left its nodes: their sshd ports are free again."""
    return InstanceNode.objects.filter(instance=instance, ssh_port__isnull=False).update(
        ssh_port=None
    )


def assign_gateway_port(instance: Instance) -> int | None:
    """The instance's public port on its region's gateway: the one it has (kept for its life),
    else a free one of the gateway's range, picked at random and written with a compare-and-set
    (the unique constraint ``slices_instance_gateway_port`` refuses one taken meanwhile; the next
    try sees it). None when the gateway forwards no ports, the runtime gives no sshd, or the
    range is full (the instance is then reached with ``ssh -J`` as before)."""
    if instance.gateway_port:
        return instance.gateway_port
    gateway = region_gateway(instance)
    span = gateway.port_range() if gateway is not None else None
    if span is None:
        return None
    first = instance.nodes.select_related("node").order_by("rank").first()
    if first is None or _runtime(first) not in SSHD_RUNTIMES:
        return None
    low, high = span
    region_id = instance.region_id
    if region_id is None:
        return None
    for _attempt in range(PORT_TRIES):
        used = set(
            Instance.objects.filter(region_id=region_id, gateway_port__isnull=False)
            .exclude(pk=instance.pk)
            .values_list("gateway_port", flat=True)
        )
        free = [p for p in range(low, high + 1) if p not in used]
        if not free:
            logger.warning("no free gateway port on %s", gateway)
            return None
        port = secrets.choice(free)
        try:
            with transaction.atomic():
                won = Instance.objects.filter(pk=instance.pk, gateway_port__isnull=True).update(
                    gateway_port=port
                )
        except IntegrityError:
            continue  # another instance took it meanwhile: look again
        if won:
            instance.gateway_port = port
            return port
        instance.refresh_from_db(fields=["gateway_port"])
        return instance.gateway_port
    return None


def ensure_host_key(instance: Instance) -> str:
    """The instance sshd's host key (ed25519, OpenSSH private key text), made at its first start
    and kept for its life: the driver installs it on every node the instance runs on, so the key
    a customer pinned stays valid after a migration. Written with a compare-and-set (two workers
    keep the first)."""
    if instance.ssh_host_key:
        return instance.ssh_host_key
    text = (
        Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        .decode()
    )
    Instance.objects.filter(pk=instance.pk, ssh_host_key="").update(ssh_host_key=text)
    instance.refresh_from_db(fields=["ssh_host_key"])
    return instance.ssh_host_key


def clear_gateway_port(instance: Instance) -> None:
    """Released: its public port is free for another instance (never before: stop, start and
    migration keep it)."""
    Instance.objects.filter(pk=instance.pk).update(gateway_port=None)
    instance.gateway_port = None


def gateway_routes(gateway: Gateway) -> tuple[GatewayRoute, ...]:
    """Where each forwarded port goes now: the running instances of the region that have a
    public port, to their first node's sshd (none while stopped or moving: the port answers
    nothing then, and is the same when they run again)."""
    if gateway.port_range() is None:
        return ()
    rows = InstanceNode.objects.filter(
        node__cluster__region_id=gateway.region_id,
        instance__state=InstanceState.RUNNING,
        instance__gateway_port__isnull=False,
        rank=0,
        ssh_port__isnull=False,
    ).values_list("instance__gateway_port", "node__address", "ssh_port", "instance__public_id")
    routes = [
        GatewayRoute(int(port or 0), str(address), int(dest or 0), f"gpc-{str(public_id)[:8]}")
        for port, address, dest, public_id in rows
    ]
    return tuple(sorted(routes, key=lambda r: r.port))


# ---------------------------------------------------------------------------------------------
# The gateway's keys
# ---------------------------------------------------------------------------------------------


def gateway_grants(gateway: Gateway) -> tuple[GatewayGrant, ...]:
    """Every key let through ``gateway`` and where to: the sshd endpoints of the running
    instances on the region's nodes, grouped per key.

    Keys are compared by their SHA256 fingerprint, in their canonical encoding (issue 29: an RSA
    modulus padded with a zero byte is the same key to sshd, so two encodings must never become
    two lines, the first of which would take the other's connections). A key is let through only
    while it is still registered to the instance's owner (one deleted from the account stops
    working at the next sync), and a key on the instances of two accounts (registered before the
    console refused that) is let through for neither: one line would open both's instances."""
    rows = InstanceNode.objects.filter(
        node__cluster__region_id=gateway.region_id,
        instance__state=InstanceState.RUNNING,
        ssh_port__isnull=False,
    ).values_list(
        "instance__ssh_public_key",
        "instance__created_by_id",
        "instance__created_by__public_id",
        "node__address",
        "ssh_port",
        "instance__team_id",
    )
    # A member who left the team no longer gets through to its instances (issue 30), even to
    # the ones they started (those stay with the team).
    members = set(
        Membership.objects.filter(team_id__in={r[5] for r in rows}).values_list(
            "team_id", "user_id"
        )
    )
    parsed: list[tuple[str, str, int, str, str, int]] = []
    for public_key, owner_id, owner_public_id, address, port, team_id in rows:
        if (team_id, owner_id) not in members:
            continue
        found = canonical_openssh(public_key) if canonical_key(public_key) else None
        if found is None or port is None:
            continue
        parsed.append((found[0], found[1], owner_id, str(owner_public_id), str(address), int(port)))
    registered = console_services.registered_ssh_keys({(p[2], p[1]) for p in parsed})
    owners: dict[str, set[str]] = defaultdict(set)
    destinations: dict[str, set[tuple[str, int]]] = defaultdict(set)
    keys: dict[str, str] = {}
    for line, print_, owner_id, owner, host, where in parsed:
        if (owner_id, print_) not in registered:
            continue  # deleted from the account (or never its own): not let through
        keys[print_] = line
        owners[print_].add(owner)
        destinations[print_].add((host, where))
    grants = []
    for print_, who in sorted(owners.items()):
        if len(who) > 1:
            logger.warning(
                "gateway %s: a key is used by %d accounts; let through for none", gateway, len(who)
            )
            continue
        grants.append(
            GatewayGrant(keys[print_], tuple(sorted(destinations[print_])), next(iter(who)))
        )
    return tuple(grants)


def gateway_target(gateway: Gateway, routes: tuple[GatewayRoute, ...] = ()) -> GatewayTarget:
    forwards = gateway.port_range() is not None
    return GatewayTarget(
        host=gateway.host,
        port=gateway.port,
        user=gateway.user,
        address=gateway.address,
        ssh_port=gateway.ssh_port,
        host_key=gateway.host_key_fingerprint,
        keys_file=gateway.keys_file,
        routes_file=gateway.routes_file if forwards else "",
        routes=routes if forwards else (),
    )


_locks: dict[int, threading.Lock] = defaultdict(threading.Lock)
_locks_guard = threading.Lock()


def _lock(gateway_id: int) -> threading.Lock:
    with _locks_guard:
        return _locks[gateway_id]


def sync_gateway(gateway_id: int, driver: object | None = None) -> str:
    """Write the gateway's keys file from the database now (``gateway_grants``).

    Under this process's lock and the gateway row's (``select_for_update``: another worker's
    sync waits), the grants are computed after the lock is taken, so whichever writer comes last
    writes the latest state. A driver error is logged and returned, not raised: the next change
    or the periodic pass writes the file again."""
    with _lock(gateway_id), transaction.atomic():
        gateway = Gateway.objects.select_for_update().filter(pk=gateway_id).first()
        if gateway is None:
            return "no gateway"
        grants = gateway_grants(gateway)
        routes = gateway_routes(gateway)
        drv = driver or get_driver()
        sync = getattr(drv, "sync_gateway", None)
        if sync is None:
            return "driver cannot sync gateways"
        lines: list[str] = []
        try:
            result = sync(gateway_target(gateway, routes), grants, lines.append)
        except DriverError as exc:
            logger.warning("gateway %s: keys not written: %s", gateway, exc)
            return f"failed: {exc.code}"
        Gateway.objects.filter(pk=gateway.pk).update(synced_at=timezone.now())
    for line in lines:
        logger.info("gateway %s: %s", gateway, line)
    return f"{result.data.get('keys', len(grants))} keys"


def sync_region(region_id: int | None) -> str:
    if region_id is None:
        return "no region"
    gateway_id = Gateway.objects.filter(region_id=region_id).values_list("pk", flat=True).first()
    return sync_gateway(gateway_id) if gateway_id else "no gateway"


def sync_all_gateways() -> list[str]:
    """The periodic pass (beat): every gateway's keys file written again from the database."""
    return [sync_gateway(pk) for pk in Gateway.objects.values_list("pk", flat=True)]


def sync_for_team(team: Team) -> list[int]:
    """Queue a keys-file sync of every region where the team has a running instance (a member
    left: their keys stop getting through at once, not at the next periodic pass)."""
    regions = sorted(
        {
            region_id
            for region_id in Instance.objects.filter(
                team=team, state=InstanceState.RUNNING
            ).values_list("region_id", flat=True)
            if region_id is not None
        }
    )
    for region_id in regions:
        jobs.enqueue("slices.tasks.sync_gateway_task", region_id)
    return regions


def sync_for_key_holder(owner_id: int) -> list[int]:
    """Queue a keys-file sync of every region where the account has a running instance (a key
    left it: ``console.hooks.ssh_key_removed``, sent after the commit)."""
    regions = sorted(
        {
            region_id
            for region_id in Instance.objects.filter(
                created_by_id=owner_id, state=InstanceState.RUNNING
            ).values_list("region_id", flat=True)
            if region_id is not None
        }
    )
    for region_id in regions:
        jobs.enqueue("slices.tasks.sync_gateway_task", region_id)
    return regions


def sync_on_commit(instance: Instance) -> None:
    """Queue a keys-file sync of the instance's region once the caller's transaction commits."""
    region_id = instance.region_id
    if region_id is None:
        return

    jobs.enqueue_on_commit("slices.tasks.sync_gateway_task", region_id)


# ---------------------------------------------------------------------------------------------
# What the page and the API show
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SshAccess:
    """How to reach a running instance: its sshd (node address and port) through the gateway."""

    alias: str  # the ~/.ssh/config Host: gpc-<short id>
    host: str  # the node's address, as the gateway forwards to it
    port: int
    user: str
    jump_user: str = ""
    jump_host: str = ""
    jump_port: int = 22

    @property
    def jump(self) -> str:
        """``user@host[:port]`` of the gateway (ProxyJump's form), "" without one."""
        if not self.jump_host:
            return ""
        port = f":{self.jump_port}" if self.jump_port != 22 else ""
        return f"{self.jump_user}@{self.jump_host}{port}"

    @property
    def command(self) -> str:
        """``ssh -J <jump> root@<node> -p <port>``; without a gateway ``ssh -p <port> root@<node>``
        (``Instance.ssh_command``'s form). The port parts only when it is not 22."""
        if not self.jump:
            port = f"-p {self.port} " if self.port != 22 else ""
            return f"ssh {port}{self.user}@{self.host}"
        port = f" -p {self.port}" if self.port != 22 else ""
        return f"ssh -J {self.jump} {self.user}@{self.host}{port}"

    @property
    def ssh_config(self) -> str:
        lines = [f"Host {self.alias}", f"    HostName {self.host}"]
        if self.port != 22:
            lines.append(f"    Port {self.port}")
        lines.append(f"    User {self.user}")
        if self.jump:
            lines.append(f"    ProxyJump {self.jump}")
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "command": self.command,
            "gateway": {"host": self.jump_host, "port": self.jump_port, "user": self.jump_user}
            if self.jump
            else None,
            "jump": self.jump,
            "alias": self.alias,
        }


def region_gateway(instance: Instance) -> Gateway | None:
    """The instance's region's gateway (free when the query did ``select_related("region__gateway")``)."""
    region = instance.region
    if region is None:
        return None
    try:
        return region.gateway
    except Gateway.DoesNotExist:
        return None


def shown_access(
    instance: Instance, host: str, port: int, user: str, gateway: Gateway | None
) -> SshAccess:
    """What a customer types: ``ssh -p <its port> root@<gateway>`` when the gateway forwards
    ports and the instance has one (the same for its whole life), else ``ssh -J`` through the
    gateway to the node's sshd, else the node's address."""
    if gateway is not None and gateway.port_range() is not None and instance.gateway_port:
        return SshAccess(
            alias=instance.slug, host=gateway.host, port=instance.gateway_port, user=user
        )
    return SshAccess(
        alias=instance.slug,
        host=host,
        port=port,
        user=user,
        jump_user=gateway.user if gateway else "",
        jump_host=gateway.host if gateway else "",
        jump_port=gateway.port if gateway else 22,
    )


def ssh_access(instance: Instance) -> SshAccess | None:
    """The endpoint of a running instance (``Instance.ssh_host``/``ssh_port``, its first node's
    sshd), through its region's gateway when the region has one (its forwarded port when it
    has one: ``shown_access``); None otherwise."""
    if instance.state != InstanceState.RUNNING or not instance.ssh_host:
        return None
    # Through the gateway only to the instance's own sshd (the nodes come from the queryset's
    # prefetch when there is one); a runtime that gives none keeps the node's own address.
    first = min(instance.nodes.all(), key=lambda n: n.rank, default=None)
    own = first is not None and first.ssh_port is not None and first.ssh_port == instance.ssh_port
    gateway = region_gateway(instance) if own else None
    return shown_access(
        instance,
        instance.ssh_host,
        int(instance.ssh_port or 22),
        instance.ssh_user or "root",
        gateway,
    )
