"""A node's heartbeat (SECURITY.md "Node health"): what the node itself said, and nothing else.

A heartbeat is recorded when the node answers: the driver's probe (``probe_nodes``, every
reconciler pass, over the console's pinned SSH connection or as the simulated fleet plays it),
its agent's heartbeat signal, or a start whose steps just ran on it (``mark_running``: renewed
at every start). It is never inferred from an instance's GPU samples: a node with no GPU work (an
idle node, a 无卡模式 run) has no samples and is as alive as a busy one.

A probe that gets no answer counts a miss (``NodeWatch.misses``, reset by any answer) and starts
the ``ssh_lost`` signal's grace; ``check_node_health`` fails a node on it only after
``PROBE_MISSES_TO_FAIL`` misses in a row.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import F, Q
from django.utils import timezone

from slices.choices import NodeHealth, NodeSignal
from slices.models import Node, NodeWatch

# Failed probes in a row before silence can fail a node: one lost answer (a dropped packet, a
# slow sshd) never does.
PROBE_MISSES_TO_FAIL = 2

SOURCES = ("probe", "agent", "start")


def watch(node: Node) -> NodeWatch:
    found, _created = NodeWatch.objects.get_or_create(node=node)
    return found


def record_heartbeat(node: Node, at: datetime | None = None, source: str = "agent") -> None:
    """``node`` said it is alive at ``at`` (``source``: probe, agent or start). A heartbeat never
    moves back in time."""
    at = at or timezone.now()
    watch(node)
    NodeWatch.objects.filter(node=node).filter(
        Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lte=at)
    ).update(last_heartbeat_at=at, heartbeat_source=source)


def node_answered(node: Node, at: datetime | None = None, source: str = "probe") -> None:
    """The node answered (a probe, or a start's steps on it): see ``nodes_answered``."""
    nodes_answered([node.pk], at, source)


def nodes_answered(node_ids: list[int], at: datetime | None = None, source: str = "probe") -> None:
    """These nodes answered at ``at``: a heartbeat each, no misses, and a lost SSH signal not yet
    judged cleared (a handful of queries whatever their number: every reconciler pass calls it
    for every node under a running instance)."""
    if not node_ids:
        return
    at = at or timezone.now()
    have = set(NodeWatch.objects.filter(node_id__in=node_ids).values_list("node_id", flat=True))
    NodeWatch.objects.bulk_create(
        [NodeWatch(node_id=pk) for pk in node_ids if pk not in have], ignore_conflicts=True
    )
    watches = NodeWatch.objects.filter(node_id__in=node_ids)
    watches.filter(Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lte=at)).update(
        last_heartbeat_at=at, heartbeat_source=source
    )
    fields: dict[str, object] = {"misses": 0, "probe_error": ""}
    if source == "probe":
        fields["last_probe_at"] = at
    watches.update(**fields)
    watches.filter(bad_signal=NodeSignal.SSH_LOST, failed_at__isnull=True).update(
        bad_since=None, bad_signal="", bad_detail=""
    )
    Node.objects.filter(pk__in=node_ids, health=NodeHealth.DEGRADED).exclude(
        watch__bad_signal__in=(NodeSignal.XID, NodeSignal.NVML)
    ).update(health=NodeHealth.OK)


def node_missed(node: Node, error: str, at: datetime | None = None) -> None:
    """The console's probe got no answer from ``node``: a miss, and the ``ssh_lost`` signal (its
    grace starts at the first miss)."""
    at = at or timezone.now()
    w = watch(node)
    NodeWatch.objects.filter(pk=w.pk).update(
        last_probe_at=at, probe_error=error[:255], misses=F("misses") + 1
    )
    NodeWatch.objects.filter(pk=w.pk, bad_since__isnull=True).update(
        bad_since=at, bad_signal=NodeSignal.SSH_LOST, bad_detail=error[:255]
    )
    Node.objects.filter(pk=node.pk, health=NodeHealth.OK).update(health=NodeHealth.DEGRADED)
