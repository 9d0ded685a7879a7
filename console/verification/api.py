"""/api/v1/verification/: GET the account's status, POST a submission (JSON for a person,
multipart for an organisation with its licence file)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.verification import services
from console.verification.models import ORGANISATION_KINDS, VerificationKind


class VerificationStatusSerializer(serializers.Serializer):
    """Never the ID number: its masked form only."""

    state = serializers.CharField()
    kind = serializers.CharField(allow_null=True)
    name = serializers.CharField(allow_null=True)
    id_number_masked = serializers.CharField(allow_null=True)
    credit_code = serializers.CharField(allow_null=True)
    reason = serializers.CharField(allow_null=True)
    provider = serializers.CharField(allow_null=True)
    submitted_at = serializers.DateTimeField(allow_null=True)
    decided_at = serializers.DateTimeField(allow_null=True)
    required_for = serializers.ListField(child=serializers.CharField())


class VerificationSubmitSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=VerificationKind.values)
    real_name = serializers.CharField(required=False, allow_blank=True, max_length=100)
    id_number = serializers.CharField(required=False, allow_blank=True, max_length=24)
    organisation_name = serializers.CharField(required=False, allow_blank=True, max_length=200)
    credit_code = serializers.CharField(required=False, allow_blank=True, max_length=24)
    licence = serializers.FileField(required=False)
    contact_name = serializers.CharField(required=False, allow_blank=True, max_length=100)
    contact_phone = serializers.CharField(required=False, allow_blank=True, max_length=30)


def status_body(user: Any) -> dict[str, Any]:
    st = services.status(user)
    row = st.latest
    return {
        "state": st.state,
        "kind": row.kind if row else None,
        "name": row.display_name if row else None,
        "id_number_masked": (row.id_number_masked or None) if row else None,
        "credit_code": (row.credit_code or None) if row else None,
        "reason": (row.reason or None) if row else None,
        "provider": (row.provider or None) if row else None,
        "submitted_at": row.created_at if row else None,
        "decided_at": row.decided_at if row else None,
        "required_for": list(st.required_for),
    }


class VerificationView(APIView):
    @extend_schema(
        summary="Your real-name verification",
        responses=VerificationStatusSerializer,
        tags=["account"],
    )
    def get(self, request: Request) -> Response:
        return Response(VerificationStatusSerializer(status_body(request.user)).data)

    @extend_schema(
        summary="Submit a real-name verification (personal: decided at once by the provider; "
        "organisation: reviewed by an operator)",
        request=VerificationSubmitSerializer,
        responses={201: VerificationStatusSerializer},
        tags=["account"],
    )
    def post(self, request: Request) -> Response:
        payload = VerificationSubmitSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        if data["kind"] == VerificationKind.PERSONAL:
            services.submit_personal(
                request.user,
                real_name=data.get("real_name", ""),
                id_number=data.get("id_number", ""),
            )
        else:
            assert data["kind"] in ORGANISATION_KINDS
            services.submit_organisation(
                request.user,
                kind=data["kind"],
                organisation_name=data.get("organisation_name", ""),
                credit_code=data.get("credit_code", ""),
                licence=data.get("licence"),
                contact_name=data.get("contact_name", ""),
                contact_phone=data.get("contact_phone", ""),
            )
        body = VerificationStatusSerializer(status_body(request.user)).data
        return Response(body, status=status.HTTP_201_CREATED)
