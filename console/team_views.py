"""Team pages (issue 30): my teams and a new one, a team's members, roles, budgets and card
quotas, invitations, leave / remove / transfer / close, the header's team switch, and the
invitation link. Thin: console/teams/services.py decides; a refusal is a message on the page."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from billing.services import get_wallet_summary
from console.choices import TeamRole
from console.errors import DomainError
from console.roles import Perm, may_grant
from console.teams import services
from console.tenancy import SESSION_KEY, SESSION_NAME_KEY, forget_team, remember_team


def _refused(request: HttpRequest, exc: DomainError) -> None:
    messages.error(request, exc.message())


def _team_url(team: Any) -> str:
    return reverse("team-detail", kwargs={"public_id": team.public_id})


@login_required
@require_http_methods(["GET", "POST"])
def team_list(request: HttpRequest) -> HttpResponse:
    """My teams, and a form to create one."""
    if request.method == "POST":
        try:
            team = services.create_team(request.user, request.POST.get("name"), request=request)
        except DomainError as exc:
            _refused(request, exc)
        else:
            remember_team(request.session, team)  # act in it at once
            messages.success(request, _("Team %(name)s created.") % {"name": team.name})
            return redirect(_team_url(team))
    return render(
        request,
        "console/teams.html",
        {"memberships": services.teams_of(request.user), "roles": TeamRole.choices},
    )


@login_required
@require_GET
def team_detail(request: HttpRequest, public_id: Any) -> HttpResponse:
    me = services.get_team_for_user(request.user, public_id)
    grantable = [(v, label) for v, label in TeamRole.choices if may_grant(me.role, v)]
    context = {
        "team": me.team,
        "me": me,
        "role_label": TeamRole(me.role).label,
        "members": services.members(me.team),
        "invitations": services.pending_invitations(me.team) if me.can(Perm.MEMBERS) else [],
        "grantable": grantable,
        "can_members": me.can(Perm.MEMBERS),
        "can_limits": me.can(Perm.BILLING) or me.can(Perm.MEMBERS),
        "can_own": me.can(Perm.OWN),
        "can_audit": me.can(Perm.AUDIT),
        "wallet": get_wallet_summary(me.team) if me.can(Perm.BILLING) else None,
        "acting_here": request.session.get(SESSION_KEY) == str(me.team.public_id)
        or (me.team.personal and not request.session.get(SESSION_KEY)),
    }
    return render(request, "console/team.html", context)


def _back(request: HttpRequest, me: Any) -> HttpResponse:
    return redirect(_team_url(me.team))


@login_required
@require_POST
def team_invite(request: HttpRequest, public_id: Any) -> HttpResponse:
    me = services.get_team_for_user(request.user, public_id)
    try:
        row, _raw = services.invite(
            me, request.POST.get("email"), request.POST.get("role"), request=request
        )
    except DomainError as exc:
        _refused(request, exc)
    else:
        messages.success(request, _("Invitation sent to %(email)s.") % {"email": row.email})
    return _back(request, me)


@login_required
@require_POST
def team_invitation_revoke(request: HttpRequest, public_id: Any, invitation: Any) -> HttpResponse:
    me = services.get_team_for_user(request.user, public_id)
    try:
        services.revoke_invitation(me, invitation, request=request)
    except DomainError as exc:
        _refused(request, exc)
    return _back(request, me)


@login_required
@require_POST
def team_member(request: HttpRequest, public_id: Any, member: Any) -> HttpResponse:
    """Change a member's role, or their budget, card quota and stop-on-exhaustion."""
    me = services.get_team_for_user(request.user, public_id)
    row = services.get_membership(me, member)
    try:
        if "role" in request.POST:
            services.set_role(me, row, request.POST.get("role"), request=request)
        else:
            services.set_limits(
                me,
                row,
                budget_monthly=request.POST.get("budget_monthly", ""),
                gpu_quota=request.POST.get("gpu_quota", ""),
                stop_on_budget=request.POST.get("stop_on_budget") == "on",
                request=request,
            )
    except DomainError as exc:
        _refused(request, exc)
    else:
        messages.success(request, _("Saved."))
    return _back(request, me)


@login_required
@require_POST
def team_member_remove(request: HttpRequest, public_id: Any, member: Any) -> HttpResponse:
    me = services.get_team_for_user(request.user, public_id)
    row = services.get_membership(me, member)
    try:
        services.remove(me, row, request=request)
    except DomainError as exc:
        _refused(request, exc)
        return _back(request, me)
    if row.user_id == request.user.pk:
        forget_team(request.session)
        return redirect("team-list")
    messages.success(request, _("%(email)s was removed.") % {"email": row.user.email})
    return _back(request, me)


@login_required
@require_POST
def team_leave(request: HttpRequest, public_id: Any) -> HttpResponse:
    me = services.get_team_for_user(request.user, public_id)
    try:
        services.leave(me, request=request)
    except DomainError as exc:
        _refused(request, exc)
        return _back(request, me)
    forget_team(request.session)
    messages.success(request, _("You left %(name)s.") % {"name": me.team.name})
    return redirect("team-list")


@login_required
@require_POST
def team_transfer(request: HttpRequest, public_id: Any) -> HttpResponse:
    me = services.get_team_for_user(request.user, public_id)
    try:
        row = services.get_membership(me, request.POST.get("member", ""))
    except Http404:
        messages.error(request, _("Choose a member of the team."))
        return _back(request, me)
    try:
        services.transfer_ownership(me, row, request=request)
    except DomainError as exc:
        _refused(request, exc)
    else:
        messages.success(request, _("%(email)s now owns the team.") % {"email": row.user.email})
    return _back(request, me)


@login_required
@require_POST
def team_close(request: HttpRequest, public_id: Any) -> HttpResponse:
    me = services.get_team_for_user(request.user, public_id)
    if request.POST.get("confirm") != me.team.name:
        messages.error(request, _("Type the team's name to close it."))
        return _back(request, me)
    try:
        services.close_team(me, request=request)
    except DomainError as exc:
        _refused(request, exc)
        return _back(request, me)
    forget_team(request.session)
    messages.success(request, _("The team %(name)s is closed.") % {"name": me.team.name})
    return redirect("team-list")


@login_required
@require_POST
def team_switch(request: HttpRequest) -> HttpResponse:
    """The header's switch: act in another team of mine (a POST, so no link can switch it)."""
    target = request.POST.get("team", "")
    me = services.get_team_for_user(request.user, target)  # 404 unless a member
    remember_team(request.session, me.team)
    nxt = request.POST.get("next", "")
    if nxt and url_has_allowed_host_and_scheme(nxt, {request.get_host()}, request.is_secure()):
        return redirect(nxt)
    return redirect("slices:instance-list")


@login_required
@require_http_methods(["GET", "POST"])
def team_join(request: HttpRequest, token: str) -> HttpResponse:
    """The invitation's link: what it offers, and a button to accept (as the invited address)."""
    invitation = services.find_invitation(token)
    if request.method == "POST" and invitation is not None:
        try:
            membership = services.accept(request.user, token, request=request)
        except DomainError as exc:
            _refused(request, exc)
        else:
            remember_team(request.session, membership.team)
            messages.success(request, _("You joined %(name)s.") % {"name": membership.team.name})
            return redirect(_team_url(membership.team))
    status = 200 if invitation is not None else 404
    return render(request, "console/team_join.html", {"invitation": invitation}, status=status)


def switcher(request: HttpRequest) -> dict[str, Any]:
    """The header's switch (a context processor): the team acted in, by the name the session
    keeps (no query on every page; the menu of teams loads when opened, ``team_menu``)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    session = getattr(request, "session", None)
    return {"acting_team_name": session.get(SESSION_NAME_KEY, "") if session is not None else ""}


@login_required
@require_GET
def team_menu(request: HttpRequest) -> HttpResponse:
    """The switch's menu: my teams, the one acted in marked (htmx, when the menu opens)."""
    chosen = request.session.get(SESSION_KEY, "")
    return render(
        request,
        "console/_team_menu.html",
        {"my_teams": services.teams_of(request.user), "chosen": chosen},
    )
