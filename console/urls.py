from __future__ import annotations

from importlib import import_module

from allauth.account import views as allauth_views
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.permissions import AllowAny
from rest_framework.routers import APIRootView, DefaultRouter

from console import views
from console.audit import views as audit_views
from console.lockout import limit_failed_logins
from console.notices import views as notice_views
from console.verification import views as verification_views

# /api/v1/: every app's router merged into one browsable root, plus each app's extra API paths.
API_APPS = ("console", "slices", "marketplace", "billing")


class PublicAPIRootView(APIRootView):
    """The API index is a table of contents; every resource below it still requires a token."""

    permission_classes = (AllowAny,)


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
    path("api/v1/", include([path("", include(api_router.urls)), *api_extra])),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include("slices.urls")),
    path("", include("slices.telemetry.urls")),  # GPU telemetry data, CSV, /metrics
    path("", include("marketplace.urls")),
    path("", include("billing.urls")),
]
