"""/api/v1/notifications/: the inbox, the unread count, mark one or all read."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.viewsets import ListRetrieveViewSet
from console.notices import services
from console.notices.models import Notice


class NoticeSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    title = serializers.SerializerMethodField()
    body = serializers.SerializerMethodField()
    read = serializers.SerializerMethodField()

    class Meta:
        model = Notice
        fields = ("id", "event", "title", "body", "params", "link", "created_at", "read", "read_at")

    def get_title(self, notice: Notice) -> str:
        return services.render(notice).title

    def get_body(self, notice: Notice) -> str:
        return services.render(notice).body

    def get_read(self, notice: Notice) -> bool:
        return notice.read_at is not None


@extend_schema_view(
    list=extend_schema(summary="Your notifications, newest first", tags=["account"]),
    retrieve=extend_schema(summary="One notification", tags=["account"]),
)
class NoticeViewSet(ListRetrieveViewSet):
    serializer_class = NoticeSerializer

    def get_queryset(self) -> Any:
        return services.notices_for(self.request.user)

    @extend_schema(summary="How many are unread", tags=["account"])
    @action(detail=False, methods=["get"], url_path="unread-count")
    def unread_count(self, request: Request) -> Response:
        return Response({"unread": services.unread_count(request.user)})

    @extend_schema(summary="Mark one read", request=None, tags=["account"])
    @action(detail=True, methods=["post"])
    def read(self, request: Request, public_id: str) -> Response:
        notice = services.mark_read(request.user, public_id)
        return Response(NoticeSerializer(notice).data)

    @extend_schema(summary="Mark all read", request=None, tags=["account"])
    @action(detail=False, methods=["post"], url_path="read-all")
    def read_all(self, request: Request) -> Response:
        return Response({"marked": services.mark_all_read(request.user)})
