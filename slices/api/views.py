from __future__ import annotations

import math
from dataclasses import asdict
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.db.models import Prefetch, QuerySet
from django.http import Http404
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.services import gpu_model_key
from console.api.compiled import CompiledQuery, Many, prefetched, prefetched_many
from console.api.exceptions import ApiError
from console.api.idempotency import idempotency_key
from console.api.viewsets import PublicIdViewSet
from console.errors import DomainError, ErrorCode
from console.ids import parse_uuid
from console.tenancy import acting, team_of
from marketplace import aiapps
from slices import services
from slices.api.serializers import (
    AppLaunchSerializer,
    AppSerializer,
    AvailabilitySerializer,
    DiskAttachSerializer,
    DiskCreateSerializer,
    DiskResizeSerializer,
    DiskSerializer,
    InstanceCreateSerializer,
    InstanceEventPageSerializer,
    InstanceEventSerializer,
    InstanceSerializer,
    InstanceStartSerializer,
    StorageSerializer,
)
from slices.choices import EventKind
from slices.forms import InstanceListFilter, filter_instances
from slices.hostspec import host_spec
from slices.messages import event_text
from slices.models import Cluster, Disk, DiskAttachment, Instance, InstanceNode, ShareLink
from slices.perf import expected_performance
from slices.services import apps, power, storage
from slices.services import disks as disk_service
from slices.services.ordering import priced_models


class AvailabilityView(APIView):
    """What can be ordered now, per region and GPU model (read-only)."""

    @extend_schema(
        summary="Live GPU availability per region and GPU model",
        responses={200: AvailabilitySerializer(many=True)},
        tags=["fleet"],
    )
    def get(self, request: Request) -> Response:
        clusters = {
            (c.region.code, c.gpu_model.code): c
            for c in Cluster.objects.select_related("region", "gpu_model")
            .prefetch_related("sus")
            .order_by("-position")
            if c.slices_allowed
        }
        rows = []
        priced = priced_models()
        for a in services.availability():
            perf = None
            spec = host_spec(a.gpu_model)
            c = clusters.get((a.region, a.gpu_model))
            # An SU-less or empty cluster (possible mid-edit in the admin) has no slice estimate.
            su_capacity = max((su.capacity for su in c.sus.all()), default=0) if c else 0
            if c is not None and su_capacity > 0:
                sus = math.ceil(8 / su_capacity)
                perf = expected_performance(
                    8, 8, sus, fabric=c.fabric, rails=c.rails, nvlink_gbps=c.gpu_model.nvlink_gbps
                ).as_dict()
            rows.append(
                {
                    "region": a.region,
                    "region_name": a.region_name,
                    "gpu_model": a.gpu_model,
                    "total_gpus": a.total_gpus,
                    "free_gpus": a.free_gpus,
                    "out_of_service_gpus": a.out_of_service_gpus,
                    "host_sizes": list(a.host_sizes),
                    "slices": a.slices,
                    "largest_slice": a.largest_slice,
                    "slice_performance": perf,
                    "orderable": gpu_model_key(a.gpu_model) in priced,
                    "host": asdict(spec) if spec else None,
                }
            )
        return Response(AvailabilitySerializer(rows, many=True).data)


# Events and log lines per page of /events/ and /logs/ (at most EVENTS_PAGE_MAX with ?limit=).
EVENTS_PAGE = 500
EVENTS_PAGE_MAX = 1000

IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Retry-safe ordering: the same key and body return the same instance (200); "
    "another body with the same key → 422.",
)


INSTANCE_STATE_FILTER = OpenApiParameter(
    "state",
    str,
    OpenApiParameter.QUERY,
    required=False,
    enum=list(InstanceListFilter.values()),
    default=InstanceListFilter.DEFAULT,
    description="Which instances: active (not yet archived: pending to running, stopped, "
    "failed; the default, as the console's list page), released (archived), or all. "
    "Another value → 400 invalid.",
)


# The instance as the API reads it (the list, one instance): its rows joined, its nodes (and on a
# list its share links) in one query each, the SQL built once per process (console/api/compiled.py).
# Scoped to the owner like every fetch of the API.
_RELATED = ("gpu_model", "region", "region__gateway", "allocation", "team", "created_by")
OWNED_INSTANCE = CompiledQuery(
    lambda team, public_id: (
        Instance.objects.filter(team=team, public_id=public_id).select_related(*_RELATED).order_by()
    ),
    team=Instance._meta.get_field("team"),
    public_id=Instance._meta.get_field("public_id"),
)
OWNED_PAGE = CompiledQuery(
    lambda state, offset, limit, team: (
        filter_instances(Instance.objects.filter(team=team), state)
        .select_related(*_RELATED)
        .order_by("-created_at", "-id")[offset : offset + limit]
    ),
    team=Instance._meta.get_field("team"),
)
NODES_OF = CompiledQuery(
    lambda ids: InstanceNode.objects.filter(instance__in=ids),
    ids=Many(InstanceNode._meta.get_field("instance")),
)
SHARE_LINKS_OF = CompiledQuery(
    lambda ids: ShareLink.objects.filter(instance__in=ids),
    ids=Many(ShareLink._meta.get_field("instance")),
)


def owned_instance(user: Any, public_id: Any) -> Instance:
    """``services.get_instance_for_user`` for the API's reads: the caller's instance or 404, with
    its GPU model, region, gateway, allocation and nodes, in two queries built once."""
    pid = parse_uuid(public_id)
    if pid is None or not getattr(user, "is_authenticated", False):
        raise Http404
    instance = OWNED_INSTANCE.first(team=team_of(user).pk, public_id=pid)
    if instance is None:
        raise Http404
    prefetched(instance, "nodes", NODES_OF.all(ids=[instance.pk]))
    return instance


def owned_page(user: Any, state: str, offset: int, limit: int) -> list[Instance]:
    """A page of the caller's instances (newest first) as ``owned_instance`` reads one, with the
    share links their ports list: three queries however long the page."""
    page = OWNED_PAGE.all(state, offset, limit, team=team_of(user).pk)
    ids = [i.pk for i in page]
    prefetched_many(page, "nodes", NODES_OF.all(ids=ids))
    prefetched_many(page, "share_links", SHARE_LINKS_OF.all(ids=ids))
    return page


class InstanceViewSet(PublicIdViewSet):
    """GPU hosts and cluster slices: order, follow, release."""

    serializer_class = InstanceSerializer

    def get_queryset(self) -> QuerySet[Instance]:
        return (
            Instance.objects.for_team(acting(self.request))
            .select_related(*_RELATED)
            .prefetch_related("nodes", "share_links")
        )

    def _get(self) -> Instance:
        return services.get_instance_for_user(acting(self.request), self.kwargs["public_id"])

    def _answer(self, instance: Instance, code: int = status.HTTP_202_ACCEPTED) -> Response:
        """The instance as the service left it (202: the work goes on in a worker)."""
        instance.refresh_from_db()
        return Response(
            InstanceSerializer(instance, context={"request": self.request}).data, status=code
        )

    @extend_schema(
        summary="Your instances, newest first (?state=active|all|released; default active)",
        parameters=[INSTANCE_STATE_FILTER],
        tags=["instances"],
    )
    def list(self, request: Request) -> Response:
        state = InstanceListFilter(request.query_params).chosen()
        if state is None:  # a script's typo is refused, not widened to another set
            raise DomainError(
                gettext_noop("state must be one of %(choices)s."),
                field="state",
                choices=", ".join(InstanceListFilter.values()),
            )
        page = self.paginator.paginate(
            request,
            lambda offset, limit: owned_page(acting(request), state, offset, limit),
            lambda: filter_instances(self.get_queryset(), state).count(),
        )
        return self.get_paginated_response(
            InstanceSerializer(page, many=True, context={"request": request}).data
        )

    @extend_schema(summary="One instance", tags=["instances"])
    def retrieve(self, request: Request, public_id: str) -> Response:
        return Response(
            InstanceSerializer(
                owned_instance(acting(request), public_id), context={"request": request}
            ).data
        )

    @extend_schema(
        summary="Order a host or a slice; provisioning starts at once (202)",
        request=InstanceCreateSerializer,
        responses={202: InstanceSerializer, 200: InstanceSerializer},
        parameters=[IDEMPOTENCY_HEADER],
        tags=["instances"],
    )
    def create(self, request: Request) -> Response:
        payload = InstanceCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        d = payload.validated_data
        key = idempotency_key(request, Instance._meta.get_field("idempotency_key").max_length)
        req = services.OrderRequest(
            gpu_model=d["gpu_model"],
            cards=d["cards"],
            name=d["name"],
            region=d["region"],
            image=d["image"],
            asset_ids=tuple(d["assets"]),
            ssh_key=d["ssh_key"],
            billing_mode=d["billing_mode"],
            term_days=d["term_days"],
            auto_release_at=d["auto_release_at"],
            env=d["env"],
            disks=tuple((str(x["id"]), x["mode"]) for x in d["disks"]),
            web_ports=tuple(d["web_ports"]),
            scheduler=d["scheduler"],
            job=d["job"],
            release_on_job_end=d["release_on_job_end"],
            when_unavailable="queue" if d["when_unavailable"] == "queue" else "",
            max_wait_hours=d["max_wait_hours"],
        )
        instance, created = services.order_instance(
            acting(request), req, idempotency_key=key, request=request
        )
        return self._answer(instance, status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK)

    @extend_schema(
        summary="Release: billing stops now, the nodes are cleaned and the GPUs freed (202)",
        request=None,
        responses={202: InstanceSerializer},
        tags=["instances"],
    )
    @action(detail=True, methods=["post"])
    def release(self, request: Request, public_id: str) -> Response:
        instance = self._get()
        services.release_instance(
            instance, by=request.user.get_username(), who=acting(request), request=request
        )
        return self._answer(instance)

    def _events(self, request: Request, logs: bool) -> Response:
        """Events or log lines after ``?after=<id>``, oldest first, in the list shape of every
        other list (``count``, ``next``, ``previous``, ``results``): ``next`` asks for the ones
        after this page (a cursor: new lines keep arriving), ``count`` is how many remain from
        ``after`` on, this page included."""
        instance = self._get()
        qs = instance.events.order_by("id")
        qs = qs.filter(kind=EventKind.LOG) if logs else qs.exclude(kind=EventKind.LOG)
        try:
            after = int(request.query_params.get("after", "0"))
            limit = int(request.query_params.get("limit", str(EVENTS_PAGE)))
        except ValueError:
            raise ApiError(
                ErrorCode.INVALID, _("after must be an event id and limit a number.")
            ) from None
        limit = max(1, min(limit, EVENTS_PAGE_MAX))
        qs = qs.filter(id__gt=after)
        page = list(qs[: limit + 1])
        more, page = len(page) > limit, page[:limit]
        rows = [
            {
                "id": e.pk,
                "at": e.at,
                "kind": e.kind,
                "level": e.level,
                "step": e.step,
                "node": e.node,
                "code": e.code,
                "params": e.params,
                "message": event_text(e.code, e.params) if e.code else e.text,
            }
            for e in page
        ]
        following = (
            request.build_absolute_uri(
                f"{request.path}?{urlencode({'after': page[-1].pk, 'limit': limit})}"
            )
            if more
            else None
        )
        return Response(
            {
                "count": len(page) if not more else qs.count(),
                "next": following,
                "previous": None,
                "results": InstanceEventSerializer(rows, many=True).data,
            }
        )

    @extend_schema(
        summary="State changes and provisioning steps, oldest first (?after=<id>&limit=; next = the following page)",
        responses={200: InstanceEventPageSerializer},
        tags=["instances"],
    )
    @action(detail=True, methods=["get"])
    def events(self, request: Request, public_id: str) -> Response:
        return self._events(request, logs=False)

    @extend_schema(
        summary="Node log lines, oldest first (?after=<id>&limit=; next = the following page)",
        responses={200: InstanceEventPageSerializer},
        tags=["instances"],
    )
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, public_id: str) -> Response:
        return self._events(request, logs=True)

    @extend_schema(
        summary="Stop (关机): the GPU charge stops, the system disk is kept as storage (202)",
        request=None,
        responses={202: InstanceSerializer},
        tags=["instances"],
    )
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, public_id: str) -> Response:
        instance = self._get()
        power.stop_instance(
            instance, by=request.user.get_username(), who=acting(request), request=request
        )
        return self._answer(instance)

    @extend_schema(
        summary="Start (开机): same host first, another host, or without GPUs (202)",
        request=InstanceStartSerializer,
        responses={202: InstanceSerializer},
        tags=["instances"],
    )
    @action(detail=True, methods=["post"])
    def start(self, request: Request, public_id: str) -> Response:
        instance = self._get()
        payload = InstanceStartSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        power.start_instance(
            instance,
            by=request.user.get_username(),
            mode=payload.validated_data["mode"],
            who=acting(request),
            request=request,
        )
        return self._answer(instance)


def disk_data(disk: Disk) -> dict[str, Any]:
    return {
        "public_id": disk.public_id,
        "name": disk.name,
        "size_gb": disk.size_gb,
        "region": disk.region,
        "state": disk.state,
        "mount_path": disk.mount_path,
        "attachments": [
            {
                "instance": a.instance.public_id,
                "name": a.instance.name,
                "mode": a.mode,
                "attached_at": a.attached_at,
            }
            for a in disk.live_attachments  # type: ignore[attr-defined]
        ],
        "created_at": disk.created_at,
    }


class DiskViewSet(PublicIdViewSet):
    """Persistent cloud disks: create, grow, attach to several instances in a region, delete."""

    serializer_class = DiskSerializer

    def get_queryset(self) -> QuerySet[Disk]:
        live = Prefetch(
            "attachments",
            queryset=DiskAttachment.objects.filter(detached_at__isnull=True).select_related(
                "instance"
            ),
            to_attr="live_attachments",
        )
        return (
            Disk.objects.for_team(acting(self.request))
            .live()
            .select_related("region")
            .prefetch_related(live)
        )

    def _get(self) -> Disk:
        disk_service.get_disk_for_user(acting(self.request), self.kwargs["public_id"])
        return self.get_queryset().get(public_id=self.kwargs["public_id"])

    def _answer(self, disk: Disk, code: int = status.HTTP_200_OK) -> Response:
        disk = self.get_queryset().get(pk=disk.pk)
        return Response(DiskSerializer(disk_data(disk)).data, status=code)

    def _attachment(self, request: Request) -> tuple[Instance, str]:
        """The caller's instance (404 for anyone else's) and the mode an attach or detach names."""
        payload = DiskAttachSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        instance = services.get_instance_for_user(
            acting(request), payload.validated_data["instance"]
        )
        return instance, payload.validated_data["mode"]

    @extend_schema(summary="Your cloud disks", tags=["storage"])
    def list(self, request: Request) -> Response:
        rows = [disk_data(d) for d in self.get_queryset().order_by("-created_at", "-id")]
        return Response(DiskSerializer(rows, many=True).data)

    @extend_schema(summary="One cloud disk", tags=["storage"])
    def retrieve(self, request: Request, public_id: str) -> Response:
        return Response(DiskSerializer(disk_data(self._get())).data)

    @extend_schema(
        summary="Create a disk (free up to the account's quota, then per GB-day)",
        request=DiskCreateSerializer,
        responses={201: DiskSerializer},
        tags=["storage"],
    )
    def create(self, request: Request) -> Response:
        payload = DiskCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        disk = disk_service.create_disk(acting(request), **payload.validated_data, request=request)
        return self._answer(disk, status.HTTP_201_CREATED)

    @extend_schema(
        summary="Delete a disk no live instance uses (409 while attached)",
        responses={204: None},
        tags=["storage"],
    )
    def destroy(self, request: Request, public_id: str) -> Response:
        disk_service.delete_disk(self._get(), who=acting(request), request=request)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        summary="Grow a disk",
        request=DiskResizeSerializer,
        responses={200: DiskSerializer},
        tags=["storage"],
    )
    @action(detail=True, methods=["post"])
    def resize(self, request: Request, public_id: str) -> Response:
        disk = self._get()
        payload = DiskResizeSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        disk_service.resize_disk(
            disk, payload.validated_data["size_gb"], who=acting(request), request=request
        )
        return self._answer(disk)

    @extend_schema(
        summary="Attach to one more instance in the disk's region (rw or ro)",
        request=DiskAttachSerializer,
        responses={200: DiskSerializer},
        tags=["storage"],
    )
    @action(detail=True, methods=["post"])
    def attach(self, request: Request, public_id: str) -> Response:
        disk = self._get()
        instance, mode = self._attachment(request)
        disk_service.attach_disk(disk, instance, mode)
        return self._answer(disk)

    @extend_schema(
        summary="Detach from an instance",
        request=DiskAttachSerializer,
        responses={200: DiskSerializer},
        tags=["storage"],
    )
    @action(detail=True, methods=["post"])
    def detach(self, request: Request, public_id: str) -> Response:
        disk = self._get()
        instance, _mode = self._attachment(request)
        disk_service.detach_disk(disk, instance)
        return self._answer(disk)


class StorageView(APIView):
    """The account's storage: /pfs usage against its quota, disks and the daily storage charge."""

    @extend_schema(
        summary="Storage usage and charge", responses={200: StorageSerializer}, tags=["storage"]
    )
    def get(self, request: Request) -> Response:
        pfs = storage.fresh_pfs_summary(acting(request))
        s = disk_service.storage_summary(acting(request))
        row = {
            "pfs_used_bytes": pfs.used_bytes,
            "pfs_files": pfs.files,
            "pfs_quota_gb": pfs.quota_gb,
            "disks_gb": s.disks_gb,
            "stopped_system_disks_gb": s.system_gb,
            "free_gb": s.free_gb,
            "per_gb_day": s.per_gb_day,
            "per_day": s.per_day,
        }
        return Response(StorageSerializer(row).data)


# ---------------------------------------------------------------------------------------------
# AI applications (issue 20)
# ---------------------------------------------------------------------------------------------


def _app_row(
    request: Request, app: aiapps.AiApp, rates: dict[str, Decimal] | None = None
) -> dict[str, Any]:
    """An app as the API lists it: priced at each GPU model's preset; ``available`` is whether the
    preset cards are free now on the detail (null on the list, which asks no capacity)."""
    offer = apps.app_offer(acting(request), app, rates=rates, full=rates is None)
    language = getattr(request, "LANGUAGE_CODE", "zh-hans")
    return {
        "slug": app.slug,
        "category": app.category,
        "name": app.localized_name(language),
        "name_en": app.name,
        "name_zh": app.name_zh,
        "summary": app.localized_summary(language),
        "image": app.image,
        "models": list(app.models),
        "datasets": list(app.datasets),
        "gpus": [
            {
                "gpu_model": c.option.gpu_model,
                "gpu_model_name": c.label,
                "min_cards": c.option.min_cards,
                "recommended_cards": c.option.recommended_cards,
                "max_cards": c.option.max_cards,
                "price_per_hour": c.per_hour,
                "available": c.available,
                "trial_hours": c.trial_hours,
            }
            for c in offer.choices
        ],
        "ports": [{"port": p.port, "name": p.localized_name(language)} for p in app.ports],
        "health": {"port": app.health.port, "path": app.health.path, "status": app.health.status},
        "ready_seconds": app.ready_seconds,
        "api": {"kind": app.api.kind, "port": app.api.port, "base_path": app.api.base_path}
        if app.api
        else None,
    }


class AppViewSet(viewsets.ViewSet):
    """One-click AI applications: the catalogue (public prices) and a launch."""

    lookup_field = "slug"
    lookup_value_regex = r"[a-z0-9][a-z0-9-]{0,39}"

    def get_permissions(self) -> list[Any]:
        if self.action in ("list", "retrieve"):
            return [AllowAny()]
        return [permission() for permission in self.permission_classes]

    def _app(self, slug: str) -> aiapps.AiApp:
        app = aiapps.get_app(slug)
        if app is None:
            raise NotFound(_("No such app."))
        return app

    @extend_schema(
        summary="The AI applications", responses={200: AppSerializer(many=True)}, tags=["apps"]
    )
    def list(self, request: Request) -> Response:
        rates = apps.price_rates()
        rows = [_app_row(request, app, rates) for app in aiapps.shipped_apps()]
        return Response(AppSerializer(rows, many=True).data)

    @extend_schema(summary="One AI application", responses={200: AppSerializer}, tags=["apps"])
    def retrieve(self, request: Request, slug: str) -> Response:
        return Response(AppSerializer(_app_row(request, self._app(slug))).data)

    @extend_schema(
        summary="Launch an app: an instance ordered like any other (202); its key is in app.api_key",
        request=AppLaunchSerializer,
        responses={202: InstanceSerializer, 200: InstanceSerializer},
        parameters=[IDEMPOTENCY_HEADER],
        tags=["apps"],
    )
    @action(detail=True, methods=["post"])
    def launch(self, request: Request, slug: str) -> Response:
        app = self._app(slug)
        payload = AppLaunchSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        d = payload.validated_data
        key = idempotency_key(request, Instance._meta.get_field("idempotency_key").max_length)
        existing = (
            Instance.objects.filter(team=team_of(acting(request)), idempotency_key=key).exists()
            if key
            else False
        )
        instance = apps.launch_app(
            acting(request),
            app,
            gpu_model=d["gpu_model"] or None,
            cards=d["cards"],
            model=d["model"] or None,
            name=d["name"],
            accept_license=d["accept_license"],
            idempotency_key=key,
            request=request,
        )
        instance.refresh_from_db()
        code = status.HTTP_200_OK if existing else status.HTTP_202_ACCEPTED
        return Response(
            InstanceSerializer(instance, context={"request": request}).data, status=code
        )
