from __future__ import annotations

from django.db.models import QuerySet
from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from console import services
from console.api.permissions import PersonLevel
from console.api.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    SshKeyCreateSerializer,
    SshKeySerializer,
)
from console.api.viewsets import ListRetrieveViewSet
from console.models import ApiToken, SshKey, Team


@extend_schema_view(
    list=extend_schema(summary="List your SSH keys", tags=["account"]),
    retrieve=extend_schema(summary="Show one SSH key", tags=["account"]),
    destroy=extend_schema(summary="Delete an SSH key", tags=["account"]),
)
class SshKeyViewSet(mixins.DestroyModelMixin, ListRetrieveViewSet):
    serializer_class = SshKeySerializer
    permission_classes = (PersonLevel,)

    def get_queryset(self) -> QuerySet[SshKey]:
        return SshKey.objects.for_owner(self.request.user)

    def get_object(self) -> SshKey:
        return services.get_ssh_key_for_user(self.request.user, self.kwargs["public_id"])

    @extend_schema(
        summary="Add an SSH public key",
        request=SshKeyCreateSerializer,
        responses={201: SshKeySerializer},
        tags=["account"],
    )
    def create(self, request: Request) -> Response:
        payload = SshKeyCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        # A refused key (Django's ValidationError) is a 400 with its fields (console/api/exceptions.py).
        key = services.add_ssh_key(
            request.user,
            name=payload.validated_data["name"],
            public_key=payload.validated_data["public_key"],
            make_default=payload.validated_data["is_default"],
            request=request,
        )
        return Response(SshKeySerializer(key).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: SshKey) -> None:
        services.delete_ssh_key(self.request.user, instance, request=self.request)

    @extend_schema(
        summary="Make this key the default for new instances",
        request=None,
        responses={200: SshKeySerializer},
        tags=["account"],
    )
    @action(detail=True, methods=["post"], url_path="set-default")
    def set_default(self, request: Request, public_id: str) -> Response:
        key = services.set_default_ssh_key(request.user, self.get_object())
        return Response(SshKeySerializer(key).data)


@extend_schema_view(
    list=extend_schema(summary="List your API tokens (secrets are never shown)", tags=["account"]),
    retrieve=extend_schema(summary="Show one API token", tags=["account"]),
)
class ApiTokenViewSet(ListRetrieveViewSet):
    serializer_class = ApiTokenSerializer
    permission_classes = (PersonLevel,)

    def get_queryset(self) -> QuerySet[ApiToken]:
        rows = ApiToken.objects.for_owner(self.request.user).select_related("team")
        team_id = getattr(self.request.auth, "team_id", None)
        if team_id is not None and not getattr(self.request.auth.team, "personal", True):
            rows = rows.filter(team_id=team_id)  # a team's token sees its team's tokens only
        return rows

    def get_object(self) -> ApiToken:
        from django.shortcuts import get_object_or_404

        from console.ids import uuid_or_404

        return get_object_or_404(
            self.get_queryset(), public_id=uuid_or_404(self.kwargs["public_id"])
        )

    @extend_schema(
        summary="Create an API token (the secret is in this response only)",
        request=ApiTokenCreateSerializer,
        responses={201: ApiTokenCreatedSerializer},
        tags=["account"],
    )
    def create(self, request: Request) -> Response:
        payload = ApiTokenCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = dict(payload.validated_data)
        team_id = data.pop("team", None)
        team = None
        if team_id is not None:
            team = Team.objects.filter(public_id=team_id, closed_at__isnull=True).first()
            if team is None or not team.memberships.filter(user=request.user).exists():
                raise ValidationError({"team": [_("You are not a member of that team.")]})
        token, raw = services.create_api_token(request.user, team=team, **data, request=request)
        token.token = raw
        response = Response(ApiTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"
        return response

    @extend_schema(
        summary="Revoke an API token", request=None, responses={204: None}, tags=["account"]
    )
    def destroy(self, request: Request, public_id: str) -> Response:
        services.revoke_api_token(request.user, self.get_object(), request=request)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        summary="Revoke an API token",
        request=None,
        responses={200: ApiTokenSerializer},
        tags=["account"],
    )
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, public_id: str) -> Response:
        token = self.get_object()
        services.revoke_api_token(request.user, token, request=request)
        return Response(ApiTokenSerializer(token).data)
