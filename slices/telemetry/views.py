"""Telemetry pages' data: an instance's ring (charts draw it at once), its CSV history, a
cluster's latest heat map, and ``/metrics`` for Prometheus."""

from __future__ import annotations

import csv
import hmac
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from console.auth import staff_required
from console.tenancy import acting
from slices.models import Cluster, Instance
from slices.services import get_instance_for_operator, get_instance_for_user
from slices.services import telemetry as telemetry_services
from slices.telemetry.metrics import render_metrics


def _instance_for(request: HttpRequest, public_id: Any) -> Instance:
    """The owner's instance; operators may see every instance."""
    if request.user.is_staff:
        return get_instance_for_operator(public_id)
    return get_instance_for_user(acting(request), public_id)


@login_required
@require_GET
@never_cache
def instance_history(request: HttpRequest, public_id: str) -> JsonResponse:
    """The ring's entries (the last hour at 1 s), after ``?since=<epoch seconds>`` if given."""
    instance = _instance_for(request, public_id)
    try:
        since = float(request.GET["since"]) if request.GET.get("since") else None
    except ValueError:
        since = None
    return JsonResponse(telemetry_services.instance_history(instance, since))


class _Echo:
    def write(self, value: str) -> str:
        return value


@login_required
@require_GET
def instance_csv(request: HttpRequest, public_id: str) -> StreamingHttpResponse:
    """Every minute rollup of the instance (min / mean / max per GPU), oldest first."""
    instance = _instance_for(request, public_id)
    writer = csv.writer(_Echo())
    rows = (writer.writerow(row) for row in telemetry_services.history_csv_rows(instance))
    response = StreamingHttpResponse(rows, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{instance.slug}-gpu-minutes.csv"'
    return response


@staff_required
@require_GET
@never_cache
def cluster_latest(request: HttpRequest, code: str) -> JsonResponse:
    """The heat map's first frame: every sampled GPU of the cluster, as the live stream sends it."""
    cluster = get_object_or_404(Cluster, code=code)
    hosts = set(cluster.nodes.values_list("hostname", flat=True))
    nodes: dict[str, list[list[Any]]] = {}
    for g in telemetry_services.latest_gpu_samples():
        if g.get("host") in hosts and g.get("state") != "lost":
            nodes.setdefault(g["host"], []).append(
                [g.get("index"), g.get("util"), g.get("temp"), g.get("power"), g.get("mem_used")]
            )
    return JsonResponse({"nodes": nodes})


@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape: ``Authorization: Bearer <TELEMETRY_METRICS_TOKEN>`` or a staff login."""
    token = settings.TELEMETRY_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    by_token = bool(token) and hmac.compare_digest(header.encode(), f"Bearer {token}".encode())
    if not by_token:
        if not request.user.is_authenticated:
            response = HttpResponse("authentication required\n", status=401)
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        if not request.user.is_staff:
            raise Http404
    body = render_metrics(telemetry_services.latest_gpu_samples())
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
