"""/api/v1/teams/<id>/audit/: the team's audit log, newest first, paged (``?limit=&offset=``),
filtered like the page (``action`` prefix, ``actor``, ``since``, ``until``), or as CSV
(``?format=csv``). An API token reads only the team it was made for (another team: 404)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request

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


class TeamAuditView(generics.ListAPIView):
    serializer_class = AuditEntrySerializer
    renderer_classes = (JSONRenderer, BrowsableAPIRenderer, CsvRenderer)

    def get_queryset(self) -> Any:
        request = self.request
        token_team_id = getattr(request.auth, "team_id", None)
        acting = services.team_for_audit(
            request.user, self.kwargs["public_id"], token_team_id=token_team_id
        )
        self.team = acting.team
        return services.entries_for(acting.team, **filters_from(request.query_params))

    @extend_schema(
        summary="The team's audit log, newest first",
        parameters=FILTERS,
        tags=["teams"],
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        if request.query_params.get("format") == "csv":
            rows = self.get_queryset()[:CSV_MAX_ROWS]
            return csv_response(rows, f"audit-{self.team.public_id}.csv")
        return self.list(request, *args, **kwargs)
