"""The teams API (issue 30): ``/api/v1/teams/`` and below, over console/teams/services.py.

A session acts in any of its teams; an API token only in the one team it was made for (another
team's id is 404 for it, as a team you are not in)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.services import get_wallet_summary
from console.api.permissions import PersonLevel
from console.choices import TeamRole
from console.models import Membership
from console.roles import Perm
from console.teams import services
from console.tenancy import Acting


class TeamSerializer(serializers.Serializer):
    id = serializers.UUIDField(source="team.public_id")
    name = serializers.CharField(source="team.name")
    personal = serializers.BooleanField(source="team.personal")
    role = serializers.CharField()


class TeamCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)


class MemberSerializer(serializers.Serializer):
    id = serializers.UUIDField(source="user.public_id")
    email = serializers.EmailField(source="user.email")
    role = serializers.CharField()
    budget_monthly = serializers.DecimalField(max_digits=12, decimal_places=2, allow_null=True)
    gpu_quota = serializers.IntegerField(allow_null=True)
    stop_on_budget = serializers.BooleanField()
    joined_at = serializers.DateTimeField(source="created_at")


class MemberPatchSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=TeamRole.choices, required=False)
    budget_monthly = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    gpu_quota = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    stop_on_budget = serializers.BooleanField(required=False)


class InvitationSerializer(serializers.Serializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    email = serializers.EmailField()
    role = serializers.ChoiceField(choices=TeamRole.choices)
    expires_at = serializers.DateTimeField(read_only=True)


def _me(request: Request, team_id: Any) -> Acting:
    me = services.get_team_for_user(request.user, team_id)  # 404 unless a member
    token_team = getattr(request.auth, "team_id", None)
    if token_team is not None and token_team != me.team.pk:
        raise NotFound()  # a token acts in its one team
    return me


class TeamListView(APIView):
    permission_classes = (PersonLevel,)  # a team's token lists its team, never makes one

    @extend_schema(
        summary="Your teams and your role in each",
        responses=TeamSerializer(many=True),
        tags=["teams"],
    )
    def get(self, request: Request) -> Response:
        rows = services.teams_of(request.user)
        token_team = getattr(request.auth, "team_id", None)
        if token_team is not None:
            rows = [m for m in rows if m.team_id == token_team]
        return Response(TeamSerializer(rows, many=True).data)

    @extend_schema(
        summary="Create a team (you are its owner)",
        request=TeamCreateSerializer,
        responses={201: TeamSerializer},
        tags=["teams"],
    )
    def post(self, request: Request) -> Response:
        payload = TeamCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        team = services.create_team(request.user, payload.validated_data["name"], request=request)
        row = Membership.objects.select_related("team").get(team=team, user=request.user)
        return Response(TeamSerializer(row).data, status=status.HTTP_201_CREATED)


class TeamDetailSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    personal = serializers.BooleanField()
    role = serializers.CharField()
    members = serializers.IntegerField()
    wallet = serializers.DictField(
        allow_null=True, help_text="spendable, burn_per_hour, runway_seconds (billing roles only)"
    )


class TeamDetailView(APIView):
    @extend_schema(
        summary="One team: your role and, for billing roles, the wallet",
        responses=TeamDetailSerializer,
        tags=["teams"],
    )
    def get(self, request: Request, team_id: Any) -> Response:
        me = _me(request, team_id)
        body: dict[str, Any] = {
            "id": str(me.team.public_id),
            "name": me.team.name,
            "personal": me.team.personal,
            "role": me.role,
            "members": me.team.memberships.count(),
            "wallet": None,
        }
        if me.can(Perm.BILLING):
            w = get_wallet_summary(me.team)
            body["wallet"] = {
                "spendable": str(w.spendable),
                "burn_per_hour": str(w.burn_per_hour),
                "runway_seconds": w.runway_seconds,
            }
        return Response(body)


class MemberListView(APIView):
    @extend_schema(
        summary="The team's members", responses=MemberSerializer(many=True), tags=["teams"]
    )
    def get(self, request: Request, team_id: Any) -> Response:
        me = _me(request, team_id)
        return Response(MemberSerializer(services.members(me.team), many=True).data)


class MemberDetailView(APIView):
    @extend_schema(
        summary="Change a member's role, budget, card quota or stop-on-exhaustion",
        request=MemberPatchSerializer,
        responses=MemberSerializer,
        tags=["teams"],
    )
    def patch(self, request: Request, team_id: Any, member_id: Any) -> Response:
        me = _me(request, team_id)
        row = services.get_membership(me, member_id)
        payload = MemberPatchSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        d = payload.validated_data
        if "role" in d:
            row = services.set_role(me, row, d["role"], request=request)
        limits = {k: d[k] for k in ("budget_monthly", "gpu_quota", "stop_on_budget") if k in d}
        if limits:
            row = services.set_limits(me, row, request=request, **limits)
        row = services.get_membership(me, member_id)
        return Response(MemberSerializer(row).data)

    @extend_schema(
        summary="Remove a member (yourself: leave the team)",
        request=None,
        responses={204: None},
        tags=["teams"],
    )
    def delete(self, request: Request, team_id: Any, member_id: Any) -> Response:
        me = _me(request, team_id)
        row = services.get_membership(me, member_id)
        services.remove(me, row, request=request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationListView(APIView):
    @extend_schema(
        summary="Pending invitations", responses=InvitationSerializer(many=True), tags=["teams"]
    )
    def get(self, request: Request, team_id: Any) -> Response:
        me = _me(request, team_id)
        if not me.can(Perm.MEMBERS):
            raise services.NotAllowed("Your role in this team does not allow that.")
        return Response(InvitationSerializer(services.pending_invitations(me.team), many=True).data)

    @extend_schema(
        summary="Invite by email with a role (the mail's link expires after 7 days)",
        request=InvitationSerializer,
        responses={201: InvitationSerializer},
        tags=["teams"],
    )
    def post(self, request: Request, team_id: Any) -> Response:
        me = _me(request, team_id)
        payload = InvitationSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        row, _raw = services.invite(
            me, payload.validated_data["email"], payload.validated_data["role"], request=request
        )
        return Response(InvitationSerializer(row).data, status=status.HTTP_201_CREATED)
