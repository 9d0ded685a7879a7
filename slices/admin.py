from __future__ import annotations

from django.contrib import admin

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
    # Inventory comes from the fleet file and GPUs from the allocator: read-only here.
    readonly_fields = ("public_id", "cluster", "su", "index", "hostname", "free_mask", "gpu_model")
    list_select_related = ("cluster", "su")


@admin.register(GPU)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("__str__", "uuid", "numa_node", "hca", "allocation")
    search_fields = ("node__hostname", "uuid")
    list_select_related = ("node", "allocation")
    readonly_fields = ("node", "index", "uuid", "allocation")


class AllocationNodeInline(admin.TabularInline):
    model = AllocationNode
    extra = 0
    readonly_fields = ("node", "rank", "gpu_mask")
    can_delete = False


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = (
        "public_id",
        "owner",
        "kind",
        "gpu_count",
        "gpu_model",
        "cluster",
        "su_count",
        "state",
        "created_at",
    )
    list_filter = ("state", "kind", "gpu_model", "cluster")
    search_fields = ("public_id", "owner__username", "label")
    list_select_related = ("owner", "gpu_model", "cluster")
    inlines = (AllocationNodeInline,)
    # Allocations change only through slices.services (compare-and-set on node masks).
    readonly_fields = [f.name for f in Allocation._meta.fields]

    def has_add_permission(self, request) -> bool:  # noqa: ANN001
        return False
