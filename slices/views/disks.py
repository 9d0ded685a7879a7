"""Cloud disks: the list (with the storage charge and /pfs usage), a disk's page, its actions."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop
from django.views.decorators.http import require_GET, require_http_methods

from console.errors import DomainError
from console.tenancy import acting
from slices import services
from slices.choices import DiskMode
from slices.forms import DiskForm
from slices.models import Disk, Instance, Region
from slices.services import disks as disk_service
from slices.services import pfs_files, storage


@login_required
@require_http_methods(["GET", "POST"])
def disk_list(request: HttpRequest) -> HttpResponse:
    """Your cloud disks, the storage charge and the /pfs usage; posting creates a disk."""
    regions = [(r.code, r.display_name) for r in Region.objects.all()]
    form = DiskForm(request.POST or None, regions=regions)
    if request.method == "POST" and form.is_valid():
        try:
            disk = disk_service.create_disk(acting(request), **form.cleaned_data, request=request)
        except DomainError as exc:
            form.add_error(None, exc.message())
        else:
            messages.success(request, _("Created the disk %(name)s.") % {"name": disk.name})
            return redirect("slices:disk-detail", public_id=disk.public_id)
    disks = list(
        Disk.objects.for_team(acting(request))
        .live()
        .select_related("region")
        .annotate(in_use=Count("attachments", filter=Q(attachments__detached_at__isnull=True)))
        .order_by("-created_at")
    )
    context = {
        "disks": disks,
        "form": form,
        "summary": disk_service.storage_summary(acting(request)),
        "pfs": storage.fresh_pfs_summary(acting(request)),
        "pfs_listing": pfs_files.root_listing(acting(request)),  # the /pfs browser's top folder
    }
    return render(request, "slices/disk_list.html", context, status=400 if form.errors else 200)


@login_required
@require_GET
def disk_detail(request: HttpRequest, public_id: str) -> HttpResponse:
    disk = disk_service.get_disk_for_user(acting(request), public_id)
    attached = disk_service.attachments_of(disk)
    taken = {a.instance_id for a in attached}
    candidates = [
        i
        for i in Instance.objects.for_team(acting(request))
        .filter(state__in=disk_service.ATTACHABLE_STATES)
        .filter(Q(region=disk.region) | Q(region__isnull=True))
        .order_by("-created_at")[:100]
        if i.pk not in taken
    ]
    context = {"disk": disk, "attachments": attached, "candidates": candidates}
    return render(request, "slices/disk_detail.html", context)


def _posted_instance(request: HttpRequest) -> Instance:
    try:
        return services.get_instance_for_user(acting(request), request.POST.get("instance"))
    except Http404:
        raise disk_service.DiskRefused(gettext_noop("Choose one of your instances.")) from None


def _disk_action(request: HttpRequest, public_id: str, act: Callable[[Disk], str]) -> HttpResponse:
    disk = disk_service.get_disk_for_user(acting(request), public_id)
    try:
        messages.success(request, act(disk))
    except DomainError as exc:
        messages.error(request, exc.message())
    if disk.state != "available":
        return redirect("slices:disk-list")
    return redirect("slices:disk-detail", public_id=disk.public_id)


@login_required
@require_http_methods(["POST"])
def disk_resize(request: HttpRequest, public_id: str) -> HttpResponse:
    def act(disk: Disk) -> str:
        disk_service.resize_disk(
            disk, request.POST.get("size_gb"), who=acting(request), request=request
        )
        return _("The disk %(name)s now has %(size)s GB.") % {
            "name": disk.name,
            "size": disk.size_gb,
        }

    return _disk_action(request, public_id, act)


@login_required
@require_http_methods(["POST"])
def disk_delete(request: HttpRequest, public_id: str) -> HttpResponse:
    def act(disk: Disk) -> str:
        disk_service.delete_disk(disk, who=acting(request), request=request)
        return _("Deleted the disk %(name)s; its storage charge stopped.") % {"name": disk.name}

    return _disk_action(request, public_id, act)


@login_required
@require_http_methods(["POST"])
def disk_attach(request: HttpRequest, public_id: str) -> HttpResponse:
    def act(disk: Disk) -> str:
        instance = _posted_instance(request)
        disk_service.attach_disk(disk, instance, request.POST.get("mode", DiskMode.READ_WRITE))
        return _("Attached %(disk)s to %(name)s at %(path)s.") % {
            "disk": disk.name,
            "name": instance.name,
            "path": disk.mount_path,
        }

    return _disk_action(request, public_id, act)


@login_required
@require_http_methods(["POST"])
def disk_detach(request: HttpRequest, public_id: str) -> HttpResponse:
    def act(disk: Disk) -> str:
        instance = _posted_instance(request)
        disk_service.detach_disk(disk, instance)
        return _("Detached %(disk)s from %(name)s.") % {"disk": disk.name, "name": instance.name}

    return _disk_action(request, public_id, act)
