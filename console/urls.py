from __future__ import annotations

from importlib import import_module

from allauth.account import views as allauth_views
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.permissions import AllowAny
from rest_framework.routers import APIRootView, DefaultRouter

from console import team_api, team_views, views
from console.audit import views as audit_views
from console.lockout import limit_failed_logins
from console.notices import views as notice_views
from console.verification import views as verification_views

# /api/v1/: every app's router merged into one browsable root, plus each app's extra API paths.
API_APPS = ("console", "slices", "marketplace", "billing")


class PublicAPIRootView(APIRootView):
    """The API index is a table of contents; every resource below it still requires a token."""

    permission_classes = (AllowAny,)


# The teams API lives in the shell (it reads the wallet from billing): console/team_api.py.
TEAM_API = [
    path("teams/", team_api.TeamListView.as_view(), name="team-api-list"),
    path("teams/<uuid:team_id>/", team_api.TeamDetailView.as_view(), name="team-api-detail"),
    path(
        "teams/<uuid:team_id>/members/", team_api.MemberListView.as_view(), name="team-api-members"
    ),
    path(
        "teams/<uuid:team_id>/members/<uuid:member_id>/",
        team_api.MemberDetailView.as_view(),
        name="team-api-member",
    ),
    path(
        "teams/<uuid:team_id>/invitations/",
        team_api.InvitationListView.as_view(),
        name="team-api-invitations",
    ),
]

api_router = DefaultRouter()
api_router.APIRootView = PublicAPIRootView
api_extra: list = []
for _app in API_APPS:
    _api = import_module(f"{_app}.api.urls")
    api_router.registry.extend(_api.router.registry)
    api_extra.extend(getattr(_api, "urlpatterns", []))

# The admin's login form shares the console's failed-login lockout.
admin.site.login = limit_failed_logins(admin.site.login)

handler400 = "console.views.bad_request"  # JSON under /api/ (413 for a body over the limits)
handler403 = "console.views.permission_denied"
handler404 = "console.views.page_not_found"
handler429 = "console.views.too_many_requests"  # allauth's rate limits answer with it
handler500 = "console.views.server_error"

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("diagnostics/", views.diagnostics, name="diagnostics"),
    path("diagnostics/ping/", views.diagnostics_ping, name="diagnostics-ping"),
    path("diagnostics/broadcast/", views.diagnostics_broadcast, name="diagnostics-broadcast"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("accounts/", include("console.account_urls")),
    # Real-name verification (实名认证) and its review queue (console/verification/).
    path("account/verification/", verification_views.verification, name="account-verification"),
    path(
        "account/verification/<uuid:public_id>/licence/",
        verification_views.licence,
        name="account-verification-licence",
    ),
    path("ops/verifications/", verification_views.review_queue, name="ops-verifications"),
    # Teams (issue 30): console/team_views.py over console/teams/services.py.
    path("teams/", team_views.team_list, name="team-list"),
    path("teams/switch/", team_views.team_switch, name="team-switch"),
    path("teams/menu/", team_views.team_menu, name="team-menu"),
    path("teams/join/<str:token>/", team_views.team_join, name="team-join"),
    path("teams/<uuid:public_id>/", team_views.team_detail, name="team-detail"),
    path("teams/<uuid:public_id>/invite/", team_views.team_invite, name="team-invite"),
    path(
        "teams/<uuid:public_id>/invitations/<uuid:invitation>/revoke/",
        team_views.team_invitation_revoke,
        name="team-invitation-revoke",
    ),
    path(
        "teams/<uuid:public_id>/members/<uuid:member>/", team_views.team_member, name="team-member"
    ),
    path(
        "teams/<uuid:public_id>/members/<uuid:member>/remove/",
        team_views.team_member_remove,
        name="team-member-remove",
    ),
    path("teams/<uuid:public_id>/leave/", team_views.team_leave, name="team-leave"),
    path("teams/<uuid:public_id>/transfer/", team_views.team_transfer, name="team-transfer"),
    path("teams/<uuid:public_id>/close/", team_views.team_close, name="team-close"),
    # 站内信 and notification settings (console/notices/).
    path("notifications/", notice_views.inbox, name="notifications"),
    path("notifications/badge/", notice_views.badge, name="notifications-badge"),
    path("notifications/read-all/", notice_views.read_all, name="notifications-read-all"),
    path("notifications/<uuid:public_id>/read/", notice_views.read, name="notifications-read-one"),
    path(
        "ops/verifications/<uuid:public_id>/decide/",
        verification_views.review_decide,
        name="ops-verification-decide",
    ),
    # A team's audit log (console/audit/).
    path("teams/<uuid:public_id>/audit/", audit_views.team_audit, name="team-audit"),
    path("accounts/", include("allauth.urls")),
    # The pre-allauth name, still used by pages: the same view as allauth's account_login.
    path("accounts/login/", allauth_views.login, name="login"),
    path("admin/", admin.site.urls),
    path("api/v1/", include([path("", include(api_router.urls)), *api_extra, *TEAM_API])),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include("slices.urls")),
    path("", include("slices.telemetry.urls")),  # GPU telemetry data, CSV, /metrics
    path("", include("marketplace.urls")),
    path("", include("billing.urls")),
]
