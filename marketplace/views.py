from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from console.htmx import render_page
from console.tenancy import acting
from marketplace import services
from marketplace.catalogue import GPU_LABELS, gpu_code
from marketplace.choices import AssetKind
from marketplace.forms import asset_filter_form, paginate
from marketplace.models import Asset, ImageVersion


def _asset_list(request: HttpRequest, kind: str) -> HttpResponse:
    other = services.other_kind_list_url(kind, request.GET)
    if other:
        # htmx swaps only the results: ask it to load the other list as a whole page.
        htmx = getattr(request, "htmx", None)
        return HttpResponseClientRedirect(other) if htmx else HttpResponseRedirect(other)
    form = asset_filter_form(request.GET)
    qs = form.apply(Asset.objects.listed().of_kind(kind).for_list())
    context = {
        "kind": kind,
        "is_models": kind == AssetKind.MODEL,
        "form": form,
        "page": paginate(qs, request.GET.get("page")),
        "facets": services.catalogue_facets(kind),
    }
    return render_page(request, "marketplace/asset_list.html", context, "results")


@require_GET
def model_list(request: HttpRequest) -> HttpResponse:
    return _asset_list(request, AssetKind.MODEL)


@require_GET
def dataset_list(request: HttpRequest) -> HttpResponse:
    return _asset_list(request, AssetKind.DATASET)


def _asset_detail(request: HttpRequest, kind: str, slug: str) -> HttpResponse:
    asset = services.get_listed_asset(kind, slug)
    accepted = services.has_accepted_license(acting(request), asset.license)
    context = {
        "asset": asset,
        "license_accepted": accepted,
        "order_url": services.order_form_url(assets=[asset]) if accepted else "",
    }
    return render(request, "marketplace/asset_detail.html", context)


@require_GET
def model_detail(request: HttpRequest, slug: str) -> HttpResponse:
    return _asset_detail(request, AssetKind.MODEL, slug)


@require_GET
def dataset_detail(request: HttpRequest, slug: str) -> HttpResponse:
    return _asset_detail(request, AssetKind.DATASET, slug)


@require_GET
def license_detail(request: HttpRequest, public_id: str) -> HttpResponse:
    license = services.get_license(public_id)
    context = {
        "license": license,
        "accepted": services.has_accepted_license(acting(request), license),
        "next": _safe_next(request, request.GET.get("next")),
        "examples": license.assets.filter(is_listed=True).only("kind", "slug", "hub_id")[:10],
    }
    return render(request, "marketplace/license_detail.html", context)


def _safe_next(request: HttpRequest, target: str | None) -> str:
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return ""


@login_required
@require_POST
def license_accept(request: HttpRequest, public_id: str) -> HttpResponse:
    license = services.get_license(public_id)
    if license.requires_acceptance:
        _acceptance, created = services.accept_license(acting(request), license)
        if created:
            messages.success(request, _("You accepted %(name)s.") % {"name": license.name})
    target = _safe_next(request, request.POST.get("next")) or license.get_absolute_url()
    return HttpResponseRedirect(target)


@login_required
@require_GET
def asset_picker(request: HttpRequest) -> HttpResponse:
    """The order form's asset picker, re-rendered by htmx as the user searches (the checked
    boxes travel along as ``assets`` and stay picked)."""
    picker = services.asset_picker(
        acting(request), request.GET.getlist("assets"), request.GET.get("asset_q", "")[:100]
    )
    return render(request, "marketplace/_asset_picker.html#picker-results", {"picker": picker})


@require_GET
def image_list(request: HttpRequest) -> HttpResponse:
    gpu = gpu_code(request.GET.get("gpu", ""))
    images = services.list_images(gpu=gpu)
    context = {"images": images, "gpu": gpu, "gpu_models": GPU_LABELS.items()}
    return render_page(request, "marketplace/image_list.html", context, "results")


@require_GET
def image_detail(request: HttpRequest, slug: str) -> HttpResponse:
    image = services.get_listed_image(slug)
    versions: list[ImageVersion] = list(image.versions.listed())
    for version in versions:
        version.order_url = services.order_form_url(image=version)
    context = {"image": image, "versions": versions}
    return render(request, "marketplace/image_detail.html", context)
