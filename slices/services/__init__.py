"""The slices app's services: the only code that writes inventory, allocations and instances.

Other apps and the views call what is re-exported here; each submodule holds one noun.
"""

from __future__ import annotations

from slices.services.allocation import (
    ALLOCATION_RESOURCE,
    MAX_PLAN_ATTEMPTS,
    NoCapacity,
    Preview,
    allocate,
    preview_allocation,
    release_allocation,
    stop_for_billing,
)
from slices.services.fleet import (
    GPU_UUID_NAMESPACE,
    NODE_ACTIONS,
    Availability,
    LoadReport,
    availability,
    build_fleet,
    change_node_state,
    cluster_map,
    load_fleet,
)
from slices.services.ordering import (
    ORDER_TEMPLATES,
    OrderChoices,
    OrderPreview,
    order_choices,
    preview_order,
    resolve_order_template,
)

__all__ = [
    "ALLOCATION_RESOURCE",
    "GPU_UUID_NAMESPACE",
    "MAX_PLAN_ATTEMPTS",
    "NODE_ACTIONS",
    "ORDER_TEMPLATES",
    "Availability",
    "LoadReport",
    "NoCapacity",
    "OrderChoices",
    "OrderPreview",
    "Preview",
    "allocate",
    "availability",
    "build_fleet",
    "change_node_state",
    "cluster_map",
    "load_fleet",
    "order_choices",
    "preview_allocation",
    "preview_order",
    "release_allocation",
    "resolve_order_template",
    "stop_for_billing",
]
