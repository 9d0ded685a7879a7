from __future__ import annotations

from django.db import models

from console.querysets import OwnedQuerySet
from slices.choices import SCHEDULABLE_STATES, AllocationState, NodeHealth


class NodeQuerySet(models.QuerySet):
    def schedulable(self) -> NodeQuerySet:
        return self.filter(state__in=SCHEDULABLE_STATES, health=NodeHealth.OK)


class AllocationQuerySet(OwnedQuerySet):
    def active(self) -> AllocationQuerySet:
        return self.filter(state=AllocationState.ACTIVE)
