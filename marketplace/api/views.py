"""The read-only catalogue API: the browse pages' filters, as query parameters."""

from __future__ import annotations

from collections.abc import Callable

from django.utils.translation import gettext_noop
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.viewsets import ListRetrieveViewSet
from console.errors import DomainError, ErrorCode
from console.tenancy import acting
from marketplace import services
from marketplace.api.serializers import (
    AssetDetailSerializer,
    AssetSerializer,
    ImageSerializer,
    LicenseSerializer,
    MountPlanSerializer,
)
from marketplace.catalogue import GPU_MODELS, gpu_code
from marketplace.choices import AssetKind, AssetSort, GatedFilter
from marketplace.forms import AssetFilterForm
from marketplace.models import Asset, License

SLUG_PATTERN = r"[a-z0-9][a-z0-9._-]*"

FILTER_PARAMETERS = [
    OpenApiParameter(
        "q",
        str,
        description=(
            "Words to search for, English or Chinese; every word must match. Task and language "
            "words match the catalogue's facets ('中文 对话', 'chinese chat'), sizes match on "
            "number boundaries ('7b' is not 57B or 1.7B); a kind word ('数据集', 'dataset') "
            "keeps only that kind."
        ),
    ),
    OpenApiParameter("task", str, description="Task, e.g. text-generation, question-answering."),
    OpenApiParameter("modality", str, description="text, image, audio, video, tabular, …"),
    OpenApiParameter("publisher", str, description="Publisher (organisation on the hub)."),
    OpenApiParameter("license", str, description="License id, e.g. apache-2.0, llama2."),
    OpenApiParameter("size_min", float, description="Smallest size on disk, GB."),
    OpenApiParameter("size_max", float, description="Largest size on disk, GB."),
    OpenApiParameter("params_min", float, description="Fewest parameters, billions (models)."),
    OpenApiParameter("params_max", float, description="Most parameters, billions (models)."),
    OpenApiParameter(
        "gated",
        str,
        enum=[c for c in GatedFilter.values if c],
        description="yes: gated only; no: open only.",
    ),
    OpenApiParameter(
        "sort",
        str,
        enum=AssetSort.values,
        description="Order; default: relevance when searching, else popular (most liked first).",
    ),
]


class _AssetViewSet(viewsets.ReadOnlyModelViewSet):
    kind: str = ""
    lookup_field = "slug"
    lookup_value_regex = SLUG_PATTERN

    def get_serializer_class(self):  # noqa: ANN201
        return AssetDetailSerializer if self.action == "retrieve" else AssetSerializer

    def get_queryset(self):  # noqa: ANN201
        qs = Asset.objects.listed().of_kind(self.kind)
        if self.action != "list":
            return qs.select_related("license")
        form = AssetFilterForm(self.request.query_params)
        if not form.is_valid():
            raise ValidationError({k: [str(m) for m in v] for k, v in form.errors.items()})
        return form.apply(qs.for_list())


def _asset_schema(noun: str, plural: str) -> Callable[[type[_AssetViewSet]], type[_AssetViewSet]]:
    """The documentation of one kind's list (with the filters) and retrieve endpoints."""
    return extend_schema_view(
        list=extend_schema(
            summary=f"List and search public {plural}",
            parameters=FILTER_PARAMETERS,
            tags=["marketplace"],
        ),
        retrieve=extend_schema(summary=f"Show one {noun} by slug", tags=["marketplace"]),
    )


@_asset_schema("model", "models")
class ModelViewSet(_AssetViewSet):
    kind = AssetKind.MODEL


@_asset_schema("dataset", "datasets")
class DatasetViewSet(_AssetViewSet):
    kind = AssetKind.DATASET


@extend_schema_view(
    list=extend_schema(
        summary="List one-click images with their versions and launch templates",
        parameters=[
            OpenApiParameter(
                "gpu",
                str,
                enum=list(GPU_MODELS),
                description="Only versions for this card (fleet code).",
            )
        ],
        tags=["marketplace"],
    ),
    retrieve=extend_schema(summary="Show one image by slug", tags=["marketplace"]),
)
class ImageViewSet(viewsets.ViewSet):
    lookup_field = "slug"
    lookup_value_regex = SLUG_PATTERN
    serializer_class = ImageSerializer

    def list(self, request: Request) -> Response:
        raw = request.query_params.get("gpu", "")
        gpu = gpu_code(raw)
        if raw and not gpu:
            raise DomainError(
                gettext_noop("gpu must be one of %(models)s."),
                field="gpu",
                models=", ".join(GPU_MODELS),
            )
        images = services.list_images(gpu=gpu)
        return Response(ImageSerializer(images, many=True).data)

    def retrieve(self, request: Request, slug: str) -> Response:
        image = next((i for i in services.list_images() if i.slug == slug), None)
        if image is None:
            raise DomainError(
                gettext_noop("No such image."), code=ErrorCode.NOT_FOUND, http_status=404
            )
        return Response(ImageSerializer(image).data)


@extend_schema_view(
    list=extend_schema(summary="List licenses and whether you accepted them", tags=["marketplace"]),
    retrieve=extend_schema(summary="Show one license", tags=["marketplace"]),
)
class LicenseViewSet(ListRetrieveViewSet):
    serializer_class = LicenseSerializer
    queryset = License.objects.all()

    def get_object(self) -> License:
        return services.get_license(self.kwargs["public_id"])

    def get_serializer_context(self) -> dict:
        context = super().get_serializer_context()
        context["accepted_ids"] = services.accepted_license_ids(acting(self.request))
        return context

    @extend_schema(
        summary="Accept a gated license (once; needed before mounting assets under it)",
        request=None,
        responses={200: LicenseSerializer},
        tags=["marketplace"],
    )
    @action(detail=True, methods=["post"])
    def accept(self, request: Request, public_id: str) -> Response:
        license = self.get_object()
        if license.requires_acceptance:
            services.accept_license(acting(request), license)
        return Response(LicenseSerializer(license, context=self.get_serializer_context()).data)


class MountPlanView(APIView):
    """What ordering these assets would mount, or why it cannot (the order form's preview)."""

    @extend_schema(
        summary="Preview the read-only mounts for a set of assets",
        parameters=[
            OpenApiParameter(
                "assets",
                OpenApiTypes.STR,
                required=True,
                description="Asset ids, comma-separated (or the parameter repeated).",
            )
        ],
        responses={200: MountPlanSerializer},
        tags=["marketplace"],
    )
    def get(self, request: Request) -> Response:
        ids = [a for raw in request.query_params.getlist("assets") for a in raw.split(",") if a]
        if not ids:
            raise DomainError(
                gettext_noop("Name at least one asset id in ?assets=."), field="assets"
            )
        specs = services.build_mount_specs(
            acting(request), ids
        )  # MountRefused: 400/403 with "assets"
        return Response({"mounts": [s.as_dict() for s in specs]})
