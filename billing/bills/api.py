"""/api/v1/billing/bills/ (the monthly bill) and /api/v1/billing/bills/export/?format=csv|xlsx."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.bills import lines
from billing.bills.views import FORMATS, export_bytes, parse_filters
from billing.errors import BillingError
from console.tenancy import acting

FILTERS = [
    OpenApiParameter("month", str, description="YYYY-MM (default: this month)"),
    OpenApiParameter("product", str, description="a resource kind: instance, storage"),
    OpenApiParameter("region", str, description="a region's code: xiamen, yinchuan, ulanqab"),
    OpenApiParameter("resource", str, description="part of a resource id"),
]


def _filters(request: Request) -> dict[str, str]:
    filters = parse_filters(request.query_params)
    if filters is None:
        raise BillingError("Use ?month=YYYY-MM.", field="month")
    return filters


def _money(t: lines.Totals) -> dict[str, str]:
    return {k: str(getattr(t, k)) for k in ("amount", "voucher", "trial", "cash")}


class MonthlyBillView(APIView):
    @extend_schema(
        summary="The monthly bill: totals by product, region, GPU model and member",
        parameters=FILTERS,
        responses=OpenApiTypes.OBJECT,
        tags=["billing"],
    )
    def get(self, request: Request) -> Response:
        filters = _filters(request)
        user: Any = acting(request)
        period, all_lines = lines.month_lines(
            user,
            filters["month"] or None,
            product=filters["product"],
            region=filters["region"],
            resource=filters["resource"],
        )
        body = {
            "period": period,
            "lines": len(all_lines),
            "totals": _money(lines.totals(all_lines)),
            "ledger_total": str(lines.ledger_month_total(user, period)),
            "by_product": [
                {"product": r.key, **_money(r.totals)} for r in lines.summary(all_lines, "product")
            ],
            "by_region": [
                {"region": r.key, **_money(r.totals)} for r in lines.summary(all_lines, "region")
            ],
            "by_gpu_model": [
                {"gpu_model": r.key, **_money(r.totals)}
                for r in lines.summary(all_lines, "gpu_model")
            ],
            "by_member": [
                {"member": r.key, **_money(r.totals)} for r in lines.summary(all_lines, "member")
            ],
            "export": {
                fmt: f"/api/v1/billing/bills/export/?format={fmt}&month={period}" for fmt in FORMATS
            },
        }
        return Response(body)


class _FileRenderer(BaseRenderer):
    charset = None

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> Any:
        return data


class CsvRenderer(_FileRenderer):
    media_type = "text/csv"
    format = "csv"


class XlsxRenderer(_FileRenderer):
    media_type = FORMATS["xlsx"]
    format = "xlsx"


class BillExportView(APIView):
    """?format= is DRF's format override: it picks one of these renderers."""

    renderer_classes = (CsvRenderer, XlsxRenderer, JSONRenderer)

    @extend_schema(
        summary="账单明细 as CSV or XLSX",
        parameters=[OpenApiParameter("format", str, enum=["csv", "xlsx"]), *FILTERS],
        responses={(200, "text/csv"): bytes, (200, FORMATS["xlsx"]): bytes},
        tags=["billing"],
    )
    def get(self, request: Request) -> Response:
        filters = _filters(request)
        fmt = request.query_params.get("format", "csv")
        if fmt not in FORMATS:
            raise BillingError("Use ?format=csv|xlsx.", field="format")
        data, name = export_bytes(acting(request), filters, fmt)
        return Response(
            data,
            content_type=FORMATS[fmt],
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
