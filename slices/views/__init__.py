"""The slices app's pages, one module per noun: instances, disks, the operator pages, the demo.

The URL conf reads the views from here; each module's constants and helpers stay in it.
"""

from __future__ import annotations

from slices.views.demo import demo
from slices.views.disks import (
    disk_attach,
    disk_delete,
    disk_detach,
    disk_detail,
    disk_list,
    disk_resize,
)
from slices.views.instances import (
    instance_detail,
    instance_list,
    instance_migration_choice,
    instance_new,
    instance_release,
    instance_start,
    instance_stop,
)
from slices.views.ops import ops_cluster, ops_fleet, ops_instances, ops_node

__all__ = [
    "demo",
    "disk_attach",
    "disk_delete",
    "disk_detach",
    "disk_detail",
    "disk_list",
    "disk_resize",
    "instance_detail",
    "instance_list",
    "instance_migration_choice",
    "instance_new",
    "instance_release",
    "instance_start",
    "instance_stop",
    "ops_cluster",
    "ops_fleet",
    "ops_instances",
    "ops_node",
]
