"""/api/v1/teams/<id>/audit/: the team's audit log, newest first, paged (``?limit=&offset=``),
filtered like the page (``action`` prefix, ``actor``, ``since``, ``until``), or as CSV
(``?format=csv``). An API token reads only the team it was made for (another team: 404)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from console.api.pagination import ConsolePagination
from console.audit import services
from console.audit.models import AuditEntry
from console.audit.views import CSV_MAX_ROWS, csv_response, filters_from


class AuditEntrySerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    actor = serializers.CharField(source="actor_label", read_only=True)
    object = serializers.SerializerMethodField()

    class Meta:
        model = AuditEntry
        fields = ("id", "at", "actor", "operator", "action", "object", "before", "after", "ip")

    def get_object(self, entry: AuditEntry) -> dict[str, str]:
        return {"type": entry.object_type, "id": entry.object_id, "label": entry.object_label}


class CsvRenderer(BaseRenderer):
    """Lets ``?format=csv`` through DRF's format override; the view answers the CSV itself."""

    media_type = "text/csv"
    format = "csv"
    charset = None

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> Any:
        return data


FILTERS = [
    OpenApiParameter("action", str, description="an action or a prefix: instance., wallet."),
    OpenApiParameter("actor", str, description="part of the actor's email"),
    OpenApiParameter("since", str, description="from this day, YYYY-MM-DD"),
    OpenApiParameter("until", str, description="to this day, YYYY-MM-DD (inclusive)"),
    OpenApiParameter("format", str, enum=["json", "csv"]),
]


class TeamAuditView(APIView):
    renderer_classes = (JSONRenderer, BrowsableAPIRenderer, CsvRenderer)

    @extend_schema(
        summary="The team's audit log, newest first",
        parameters=FILTERS,
        responses={200: AuditEntrySerializer(many=True), (200, "text/csv"): bytes},
        tags=["teams"],
    )
    def get(self, request: Request, public_id: str) -> Any:
        token_team_id = getattr(request.auth, "team_id", None)
        acting = services.team_for_audit(request.user, public_id, token_team_id=token_team_id)
        rows = services.entries_for(acting.team, **filters_from(request.query_params))
        if request.query_params.get("format") == "csv":
            return csv_response(rows[:CSV_MAX_ROWS], f"audit-{acting.team.public_id}.csv")
        paginator = ConsolePagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(AuditEntrySerializer(page, many=True).data)
