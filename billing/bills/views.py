"""/billing/bills/ (账单明细 and 月账单) and /billing/bills/export/?format=csv|xlsx&month=YYYY-MM."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET

from billing.bills import files, lines
from console.tenancy import acting

MONTH = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")
FORMATS = {
    "csv": "text/csv; charset=utf-8",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}


def parse_filters(params: Any) -> dict[str, str] | None:
    """month (YYYY-MM, default this month), product, region, resource; None when the month is
    malformed."""
    month = (params.get("month") or "").strip()
    if month and not MONTH.match(month):
        return None
    return {
        "month": month,
        "product": (params.get("product") or "").strip()[:20],
        "region": (params.get("region") or "").strip()[:32],
        "resource": (params.get("resource") or "").strip()[:64],
    }


def export_bytes(user: Any, filters: dict[str, str], fmt: str) -> tuple[bytes, str]:
    period, rows = lines.month_lines(
        user,
        filters["month"] or None,
        product=filters["product"],
        region=filters["region"],
        resource=filters["resource"],
    )
    name = f"bill-{period}.{fmt}"
    if fmt == "xlsx":
        return files.to_xlsx(rows, period), name
    return files.to_csv(rows), name


@login_required
@require_GET
def bills(request: HttpRequest) -> HttpResponse:
    filters = parse_filters(request.GET)
    if filters is None:
        return HttpResponseBadRequest(_("Use ?month=YYYY-MM."))
    user: Any = acting(request)
    period, all_lines = lines.month_lines(user, filters["month"] or None)
    shown = [
        line
        for line in all_lines
        if (not filters["product"] or line.product == filters["product"])
        and (not filters["region"] or line.region == filters["region"])
        and (not filters["resource"] or filters["resource"] in line.resource_id)
    ]
    page = Paginator(shown, 100).get_page(request.GET.get("page"))
    context = {
        "period": period,
        "filters": filters,
        "products": sorted({line.product for line in all_lines}),
        "regions": [
            (c, lines.region_label(c)) for c in sorted({x.region for x in all_lines} - {""})
        ],
        "page": page,
        "totals": lines.totals(shown),
        "month_totals": lines.totals(all_lines),
        "ledger_total": lines.ledger_month_total(user, period),
        "by_product": lines.summary(all_lines, "product"),
        "by_region": lines.summary(all_lines, "region"),
        "by_model": lines.summary(all_lines, "gpu_model"),
        "by_member": lines.summary(all_lines, "member"),
        "query": request.GET.urlencode(),
    }
    return render(request, "billing/bills.html", context)


@login_required
@require_GET
def bills_export(request: HttpRequest) -> HttpResponse:
    filters = parse_filters(request.GET)
    fmt = request.GET.get("format", "csv")
    if filters is None or fmt not in FORMATS:
        return HttpResponseBadRequest(_("Use ?format=csv|xlsx&month=YYYY-MM."))
    data, name = export_bytes(acting(request), filters, fmt)
    response = HttpResponse(data, content_type=FORMATS[fmt])
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
