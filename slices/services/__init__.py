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
)
from slices.services.allocation import stop_for_billing as _stop_allocation_for_billing
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
from slices.services.instances import (
    INSTANCE_RESOURCE,
    OrderRequest,
    cards_in_use,
    fail_instance,
    get_instance_for_operator,
    get_instance_for_user,
    min_runway_seconds,
    order_instance,
    quota_for,
    release_instance,
    resolve_gpu_model,
)
from slices.services.instances import stop_for_billing as _stop_instance_for_billing
from slices.services.ordering import (
    OrderChoices,
    OrderPreview,
    card_choices,
    default_order,
    order_choices,
    order_from_forms,
    preview_order,
    provisioning_eta,
    resolve_order_template,
    ssh_key_choices,
    term_days_for,
)


def stop_for_billing(resource_kind: str, resource_id: str, reason: str) -> None:
    """Billing's stop hook (``BILLING_STOP_HANDLER``): release what billing stopped, through the
    same service as a user's release. Disks and files are kept; nothing restarts by itself."""
    if resource_kind == INSTANCE_RESOURCE:
        _stop_instance_for_billing(resource_kind, resource_id, reason)
    else:
        _stop_allocation_for_billing(resource_kind, resource_id, reason)


__all__ = [
    "card_choices",
    "default_order",
    "min_runway_seconds",
    "order_from_forms",
    "provisioning_eta",
    "ssh_key_choices",
    "term_days_for",
    "INSTANCE_RESOURCE",
    "OrderRequest",
    "cards_in_use",
    "fail_instance",
    "get_instance_for_operator",
    "get_instance_for_user",
    "order_instance",
    "quota_for",
    "release_instance",
    "resolve_gpu_model",
    "ALLOCATION_RESOURCE",
    "GPU_UUID_NAMESPACE",
    "MAX_PLAN_ATTEMPTS",
    "NODE_ACTIONS",
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
