"""``/api/v1/reservations/`` (book, list, one, cancel, quote) and ``/api/v1/capacity/`` (issue 32).

Thin: parse, call ``slices.services.reservations``, answer. Errors are the services' domain errors
(400 with ``fields`` naming the field at fault; 409 ``no_capacity``; 402 ``insufficient_funds``;
403 ``verification_required``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils.translation import gettext_noop
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.pricing import RESERVATION_FULL_REFUND_SECONDS, RESERVATION_LATE_REFUND_SHARE
from console.api.idempotency import idempotency_key
from console.api.viewsets import PublicIdViewSet
from console.tenancy import acting
from slices.models import Reservation
from slices.services import reservations


def cancellation_rule() -> dict[str, Any]:
    """The rule stated at booking, as data (the page says it in words)."""
    return {
        "full_refund_until_hours_before_start": RESERVATION_FULL_REFUND_SECONDS // 3600,
        "late_refund_share": str(RESERVATION_LATE_REFUND_SHARE),
        "after_start_refund_share": "0",
    }


class ReservationSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    gpu_model = serializers.CharField(source="gpu_model.code")
    region = serializers.CharField(source="region.code")
    instance = serializers.SerializerMethodField()
    cancellation_rule = serializers.SerializerMethodField()

    class Meta:
        model = Reservation
        fields = (
            "id",
            "name",
            "gpu_model",
            "cards",
            "region",
            "image",
            "starts_at",
            "hours",
            "ends_at",
            "state",
            "rate_per_card_hour",
            "term_days",
            "total",
            "refunded",
            "instance",
            "cancellation_rule",
            "created_at",
        )

    def get_instance(self, row: Reservation) -> str | None:
        return str(row.instance.public_id) if row.instance_id and row.instance else None

    def get_cancellation_rule(self, row: Reservation) -> dict[str, Any]:
        return cancellation_rule()


class BookingSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(max_length=40)
    cards = serializers.IntegerField(min_value=1, max_value=100_000)
    region = serializers.CharField(max_length=40)
    starts_at = serializers.DateTimeField()
    hours = serializers.IntegerField(min_value=1, max_value=reservations.MAX_HOURS)
    image = serializers.CharField(max_length=120, required=False, default="", allow_blank=True)
    name = serializers.CharField(max_length=63, required=False, default="", allow_blank=True)


class WindowQuoteSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    cards = serializers.IntegerField()
    hours = serializers.IntegerField()
    rate_per_card_hour = serializers.DecimalField(max_digits=10, decimal_places=2)
    term_days = serializers.IntegerField(allow_null=True)
    total = serializers.DecimalField(max_digits=14, decimal_places=2)
    on_demand_total = serializers.DecimalField(max_digits=14, decimal_places=2)


class CancelSerializer(serializers.Serializer):
    reservation = ReservationSerializer()
    refunded = serializers.DecimalField(max_digits=14, decimal_places=2)


def _booking(request: Request) -> reservations.BookingRequest:
    payload = BookingSerializer(data=request.data)
    payload.is_valid(raise_exception=True)
    return reservations.BookingRequest(**payload.validated_data)


class ReservationViewSet(PublicIdViewSet):
    """Booked windows (预约): GPUs for a time ahead at a locked price, paid when booked."""

    serializer_class = ReservationSerializer

    def get_queryset(self) -> QuerySet[Reservation]:
        return (
            Reservation.objects.for_team(acting(self.request))
            .select_related("gpu_model", "region", "instance")
            .order_by("starts_at", "id")
        )

    @extend_schema(summary="Your booked windows", tags=["reservations"])
    def list(self, request: Request) -> Response:
        return Response(ReservationSerializer(self.get_queryset(), many=True).data)

    @extend_schema(summary="One booked window", tags=["reservations"])
    def retrieve(self, request: Request, public_id: str) -> Response:
        row = reservations.get_reservation_for_user(acting(request), public_id)
        return Response(ReservationSerializer(row).data)

    @extend_schema(
        summary="Book a window (paid now at the locked price; Idempotency-Key accepted)",
        request=BookingSerializer,
        responses={201: ReservationSerializer},
        tags=["reservations"],
    )
    def create(self, request: Request) -> Response:
        key = idempotency_key(request, 200)
        row, created = reservations.book_reservation(
            acting(request), _booking(request), idempotency_key=key, request=request
        )
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(ReservationSerializer(row).data, status=code)

    @extend_schema(
        summary="The locked price of a window (nothing is booked)",
        request=BookingSerializer,
        responses={200: WindowQuoteSerializer},
        tags=["reservations"],
    )
    @action(detail=False, methods=["post"])
    def quote(self, request: Request) -> Response:
        priced = reservations.quote_window(_booking(request))
        return Response(WindowQuoteSerializer(priced).data)

    @extend_schema(
        summary="Cancel a window: all back until 24 h before the start, half after, none once "
        "started",
        request=None,
        responses={200: CancelSerializer},
        tags=["reservations"],
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, public_id: str) -> Response:
        row, refunded = reservations.cancel_reservation(acting(request), public_id, request=request)
        return Response({"reservation": ReservationSerializer(row).data, "refunded": refunded})


class CalendarDaySerializer(serializers.Serializer):
    date = serializers.DateField()
    free_gpus = serializers.IntegerField()
    total_gpus = serializers.IntegerField()
    largest_host = serializers.IntegerField(help_text="The most cards one host window could get")
    largest_slice = serializers.IntegerField(help_text="The largest slice a window could get")


class CapacityView(APIView):
    """What can be booked per day, 1–90 days ahead, in one region and GPU model."""

    @extend_schema(
        summary="The capacity calendar: what can be booked per day",
        parameters=[
            OpenApiParameter("gpu_model", str, required=True),
            OpenApiParameter("region", str, required=True),
            OpenApiParameter("days", int, description="1 to 90 (default 90)"),
        ],
        responses={200: CalendarDaySerializer(many=True)},
        tags=["reservations"],
    )
    def get(self, request: Request) -> Response:
        try:
            days = int(request.query_params.get("days") or reservations.MAX_DAYS_AHEAD)
        except ValueError:
            raise reservations.ReservationRefused(
                gettext_noop("A number of days from 1 to 90."), field="days"
            ) from None
        rows = reservations.capacity_calendar(
            request.query_params.get("gpu_model", ""),
            request.query_params.get("region", ""),
            days,
        )
        return Response(CalendarDaySerializer(rows, many=True).data)
