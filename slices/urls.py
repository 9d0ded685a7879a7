from __future__ import annotations

from django.urls import path

from slices import app_views, job_views, pfs_views, port_views, views
from slices.views import reservations as reservation_views

app_name = "slices"
urlpatterns = [
    path("instances/", views.instance_list, name="instance-list"),
    path("instances/new/", views.instance_new, name="instance-new"),
    path("instances/<uuid:public_id>/", views.instance_detail, name="instance-detail"),
    path("instances/<uuid:public_id>/release/", views.instance_release, name="instance-release"),
    # A slice's Slurm jobs (issue 31).
    path("instances/<uuid:public_id>/jobs/", job_views.instance_jobs, name="instance-jobs"),
    path(
        "instances/<uuid:public_id>/jobs/<uuid:job_id>/",
        job_views.instance_job,
        name="instance-job",
    ),
    path(
        "instances/<uuid:public_id>/jobs/<uuid:job_id>/cancel/",
        job_views.instance_job_cancel,
        name="instance-job-cancel",
    ),
    path("instances/<uuid:public_id>/stop/", views.instance_stop, name="instance-stop"),
    path("instances/<uuid:public_id>/start/", views.instance_start, name="instance-start"),
    path(
        "instances/<uuid:public_id>/migration-choice/",
        views.instance_migration_choice,
        name="instance-migration-choice",
    ),
    # Web ports through the console (issue 19): the proxy, the Open button, share links.
    path(
        "instances/<uuid:public_id>/ports/<int:port>/",
        port_views.port_proxy,
        name="instance-port",
    ),
    path(
        "instances/<uuid:public_id>/ports/<int:port>/<path:rest>",
        port_views.port_proxy,
        name="instance-port-path",
    ),
    path(
        "instances/<uuid:public_id>/web-ports/<int:port>/open/",
        port_views.port_open,
        name="instance-port-open",
    ),
    path(
        "instances/<uuid:public_id>/web-ports/<int:port>/share-links/",
        port_views.share_link_create,
        name="instance-share-link-create",
    ),
    path(
        "instances/<uuid:public_id>/share-links/<int:link_id>/revoke/",
        port_views.share_link_revoke,
        name="instance-share-link-revoke",
    ),
    path("shared/ports/<str:secret>/", port_views.port_share, name="port-share"),
    # AI applications (issue 20): the catalogue's apps, an app's page, its API with its key.
    path("apps/", app_views.app_list, name="app-list"),
    path("apps/<uuid:public_id>/v1/<path:rest>", app_views.app_api_proxy, name="app-api"),
    path("apps/<slug:slug>/", app_views.app_detail, name="app-detail"),
    path("disks/", views.disk_list, name="disk-list"),
    # Booked windows (预约, issue 32).
    path("reservations/", reservation_views.reservation_list, name="reservation-list"),
    path(
        "reservations/<uuid:public_id>/cancel/",
        reservation_views.reservation_cancel,
        name="reservation-cancel",
    ),
    path("disks/<uuid:public_id>/", views.disk_detail, name="disk-detail"),
    path("disks/<uuid:public_id>/resize/", views.disk_resize, name="disk-resize"),
    path("disks/<uuid:public_id>/delete/", views.disk_delete, name="disk-delete"),
    path("disks/<uuid:public_id>/attach/", views.disk_attach, name="disk-attach"),
    path("disks/<uuid:public_id>/detach/", views.disk_detach, name="disk-detach"),
    path("demo/<slug:name>/", views.demo, name="demo"),
    path("ops/fleet/", views.ops_fleet, name="ops-fleet"),
    path("ops/instances/", views.ops_instances, name="ops-instances"),
    path("ops/clusters/<slug:code>/", views.ops_cluster, name="ops-cluster"),
    path("ops/nodes/<uuid:public_id>/", views.ops_node, name="ops-node"),
    # The /pfs file browser (issue 21): always the requester's own directory; ?path= is relative.
    path("storage/pfs/", pfs_views.pfs_browse, name="pfs-browse"),
    path("storage/pfs/download/", pfs_views.pfs_download, name="pfs-download"),
    path("storage/pfs/upload/", pfs_views.pfs_upload, name="pfs-upload"),
    path("storage/pfs/mkdir/", pfs_views.pfs_mkdir, name="pfs-mkdir"),
    path("storage/pfs/delete/", pfs_views.pfs_delete, name="pfs-delete"),
]
