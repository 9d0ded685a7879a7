"""The console's own API resources (accounts glue lands here: SSH keys, tokens)."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from console.api.views import ApiTokenViewSet, SshKeyViewSet
from console.audit.api import TeamAuditView
from console.notices.api import NoticeViewSet
from console.verification.api import VerificationView

router = DefaultRouter()
router.register("ssh-keys", SshKeyViewSet, basename="ssh-key")
router.register("api-tokens", ApiTokenViewSet, basename="api-token")
router.register("notifications", NoticeViewSet, basename="notification")
urlpatterns: list = [
    path("verification/", VerificationView.as_view(), name="verification"),
    # A team's audit log (console/audit/api.py).
    path("teams/<uuid:public_id>/audit/", TeamAuditView.as_view(), name="team-audit-api"),
]
