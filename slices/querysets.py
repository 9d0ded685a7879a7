from __future__ import annotations

from django.db import models

from console.querysets import TeamOwnedQuerySet
from slices.choices import SCHEDULABLE_STATES, AllocationState, InstanceState, NodeHealth
from slices.lifecycle import LIVE


class NodeQuerySet(models.QuerySet):
    def schedulable(self) -> NodeQuerySet:
        return self.filter(state__in=SCHEDULABLE_STATES, health=NodeHealth.OK)


class AllocationQuerySet(TeamOwnedQuerySet):
    def active(self) -> AllocationQuerySet:
        return self.filter(state=AllocationState.ACTIVE)


class InstanceQuerySet(TeamOwnedQuerySet):
    def live(self) -> InstanceQuerySet:
        """Instances that hold (or are about to hold) GPUs."""
        return self.filter(state__in=[s.value for s in LIVE])

    def visible(self) -> InstanceQuerySet:
        """What the owner's list shows: everything not yet archived, newest first."""
        return self.exclude(state=InstanceState.RELEASED)
