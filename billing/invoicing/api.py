"""/api/v1/billing/invoices/: list, request (POST), one invoice, its PDF; and the balance."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import FileResponse, Http404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from billing.invoicing import services
from billing.invoicing.models import Invoice, InvoiceKind, TitleType
from console.api.viewsets import ListRetrieveViewSet
from console.tenancy import acting


class InvoiceSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    pdf_url = serializers.SerializerMethodField()
    red_pdf_url = serializers.SerializerMethodField()

    class Meta:
        model = Invoice
        fields = (
            "id",
            "kind",
            "title_type",
            "title",
            "tax_id",
            "address_phone",
            "bank_account",
            "email",
            "amount",
            "state",
            "number",
            "red_number",
            "reason",
            "requested_at",
            "decided_at",
            "reversed_at",
            "pdf_url",
            "red_pdf_url",
        )

    def get_pdf_url(self, row: Invoice) -> str | None:
        return f"/billing/invoices/{row.public_id}/pdf/" if row.pdf else None

    def get_red_pdf_url(self, row: Invoice) -> str | None:
        return f"/billing/invoices/{row.public_id}/red-pdf/" if row.red_pdf else None


class InvoiceRequestSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=InvoiceKind.values)
    title_type = serializers.ChoiceField(choices=TitleType.values)
    title = serializers.CharField(required=False, allow_blank=True, max_length=200)
    tax_id = serializers.CharField(required=False, allow_blank=True, max_length=24)
    address_phone = serializers.CharField(required=False, allow_blank=True, max_length=200)
    bank_account = serializers.CharField(required=False, allow_blank=True, max_length=200)
    email = serializers.EmailField(required=False, allow_blank=True)
    amount = serializers.DecimalField(max_digits=18, decimal_places=2, required=False)


class InvoiceBalanceSerializer(serializers.Serializer):
    consumed = serializers.DecimalField(max_digits=18, decimal_places=2)
    returned = serializers.DecimalField(max_digits=18, decimal_places=2)
    debt = serializers.DecimalField(max_digits=18, decimal_places=2)
    invoiced = serializers.DecimalField(max_digits=18, decimal_places=2)
    invoiceable = serializers.DecimalField(max_digits=18, decimal_places=2)
    minimum = serializers.DecimalField(max_digits=18, decimal_places=2)


def balance_body(user: Any) -> dict[str, Any]:
    b = services.balance_for(user)
    return {
        "consumed": b.consumed,
        "returned": b.returned,
        "debt": b.debt,
        "invoiced": b.invoiced,
        "invoiceable": b.invoiceable,
        "minimum": services.minimum_amount(),
    }


@extend_schema_view(
    list=extend_schema(summary="Your invoices", tags=["billing"]),
    retrieve=extend_schema(summary="One invoice", tags=["billing"]),
)
class InvoiceViewSet(ListRetrieveViewSet):
    serializer_class = InvoiceSerializer

    def get_queryset(self) -> QuerySet[Invoice]:
        return services.invoices_for(acting(self.request))

    @extend_schema(
        summary="Request an electronic invoice of consumed cash (普票 or 专票)",
        request=InvoiceRequestSerializer,
        responses={201: InvoiceSerializer},
        tags=["billing"],
    )
    def create(self, request: Request) -> Response:
        payload = InvoiceRequestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        row = services.request_invoice(acting(request), **payload.validated_data, request=request)
        return Response(InvoiceSerializer(row).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="What you can invoice now", responses=InvoiceBalanceSerializer, tags=["billing"]
    )
    @action(detail=False, methods=["get"])
    def balance(self, request: Request) -> Response:
        return Response(InvoiceBalanceSerializer(balance_body(acting(request))).data)

    @extend_schema(
        summary="The invoice's PDF", responses={(200, "application/pdf"): bytes}, tags=["billing"]
    )
    @action(detail=True, methods=["get"])
    def pdf(self, request: Request, public_id: str) -> FileResponse:
        row = services.get_invoice_for_user(acting(request), public_id)
        if not row.pdf:
            raise Http404
        return pdf_response(row.pdf, f"invoice-{row.number}.pdf")


def pdf_response(field: Any, filename: str) -> FileResponse:
    response = FileResponse(
        field.open("rb"), content_type="application/pdf", as_attachment=True, filename=filename
    )
    response["Cache-Control"] = "private, no-store"
    return response
