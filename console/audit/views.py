"""/teams/<id>/audit/: the team's audit log, filtered by a GET form, paged, and as CSV."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from console.audit import services
from console.htmx import render_page

PAGE_SIZE = 50
# The CSV is the whole filtered log up to this many rows (a year of a busy team); past it, narrow
# the dates.
CSV_MAX_ROWS = 50_000


def filters_from(params: Any) -> dict[str, str]:
    """The filters a GET form or an API query gives: action (a prefix), actor, since, until."""
    return {
        "action": str(params.get("action", "") or "")[:64],
        "actor": str(params.get("actor", "") or "")[:254],
        "since": str(params.get("since", "") or "")[:10],
        "until": str(params.get("until", "") or "")[:10],
    }


def csv_response(rows: Any, name: str) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response.write("\ufeff")  # Excel opens UTF-8 with a BOM
    response.write(services.as_csv(rows))
    return response


@login_required
@require_GET
def team_audit(request: HttpRequest, public_id: str) -> HttpResponse:
    acting = services.team_for_audit(request.user, public_id)
    filters = filters_from(request.GET)
    rows = services.entries_for(acting.team, **filters)
    if request.GET.get("format") == "csv":
        return csv_response(rows[:CSV_MAX_ROWS], f"audit-{acting.team.public_id}.csv")
    page = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    for entry in page.object_list:
        entry.changes = services.changes(entry)  # type: ignore[attr-defined]
        entry.label = services.ACTION_LABELS.get(entry.action, entry.action)  # type: ignore[attr-defined]
    context = {
        "team": acting.team,
        "page": page,
        "filters": filters,
        "filtered": any(filters.values()),
        "groups": services.ACTION_GROUPS,
        "actions": sorted(services.ACTION_LABELS.items()),
    }
    return render_page(request, "console/audit.html", context, "entries")
