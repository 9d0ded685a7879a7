from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from slices.models import (
    GPU,
    Allocation,
    AllocationNode,
    Cluster,
    GpuModel,
    Node,
    Region,
    ScalableUnit,
    SpineGroup,
)


@admin.register(Region)
class RegionAdmin(admin.ModelAdmin):
    list_display = ("code", "name", "name_zh", "position")


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = ("code", "memory_gib", "nvlink_gbps")


class ScalableUnitInline(admin.TabularInline):
    model = ScalableUnit
    extra = 0


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("code", "name", "region", "gpu_model", "fabric", "gpus_per_node", "rails")
    list_filter = ("region", "gpu_model", "fabric")
    inlines = (ScalableUnitInline,)


@admin.register(SpineGroup)
class SpineGroupAdmin(admin.ModelAdmin):
    list_display = ("cluster", "rail")
    list_filter = ("cluster",)


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("hostname", "cluster", "su", "state", "health", "free_mask", "in_fleet_file")
    list_filter = ("state", "health", "cluster__region", "gpu_model", "cluster")
    search_fields = ("hostname", "address")
    # Inventory comes from the fleet file and GPUs from the allocator: read-only here. State and
    # health change only through the operator actions (slices.services.change_node_state), which
    # check the node's leases.
    readonly_fields = (
        "public_id",
        "cluster",
        "su",
        "index",
        "hostname",
        "free_mask",
        "gpu_model",
        "gpus_per_node",
        "layout",
        "in_fleet_file",
        "state",
        "health",
        "state_changed_at",
    )
    list_select_related = ("cluster", "su")

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:
            super().save_model(request, obj, form, change)
            return
        # Write only what the operator changed: a full save would put back the free-GPU mask as
        # it was read, freeing GPUs that an allocation took in the meantime.
        fields = [name for name in form.changed_data if name not in self.readonly_fields]
        if fields:
            obj.save(update_fields=fields)


@admin.register(GPU)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("__str__", "uuid", "numa_node", "hca", "allocation")
    search_fields = ("node__hostname", "uuid")
    list_select_related = ("node", "allocation")
    readonly_fields = ("node", "index", "uuid", "allocation")

    # GPUs are held and released by the allocator only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AllocationNodeInline(admin.TabularInline):
    model = AllocationNode
    extra = 0
    readonly_fields = ("node", "rank", "gpu_mask")
    can_delete = False


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = (
        "public_id",
        "team",
        "created_by",
        "kind",
        "gpu_count",
        "gpu_model",
        "cluster",
        "su_count",
        "state",
        "created_at",
    )
    list_filter = ("state", "kind", "gpu_model", "cluster")
    search_fields = ("public_id", "team__name", "created_by__username", "label")
    list_select_related = ("team", "created_by", "gpu_model", "cluster")
    inlines = (AllocationNodeInline,)
    # Allocations change only through slices.services (compare-and-set on node masks).
    readonly_fields = [f.name for f in Allocation._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
