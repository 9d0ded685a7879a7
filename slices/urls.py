from __future__ import annotations

from django.urls import path

from slices import views

app_name = "slices"
urlpatterns = [
    path("instances/", views.instance_list, name="instance-list"),
    path("instances/new/", views.instance_new, name="instance-new"),
    path("instances/<uuid:public_id>/", views.instance_detail, name="instance-detail"),
    path("instances/<uuid:public_id>/release/", views.instance_release, name="instance-release"),
    path("demo/<slug:name>/", views.demo, name="demo"),
    path("ops/fleet/", views.ops_fleet, name="ops-fleet"),
    path("ops/instances/", views.ops_instances, name="ops-instances"),
    path("ops/clusters/<slug:code>/", views.ops_cluster, name="ops-cluster"),
    path("ops/nodes/<uuid:public_id>/", views.ops_node, name="ops-node"),
]
