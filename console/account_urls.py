"""Account pages under /accounts/, next to django-allauth's (login, signup, email, password)."""

from __future__ import annotations

from django.urls import path

from console import account_views

app_name = "account"
urlpatterns = [
    path("", account_views.overview, name="overview"),
    path("ssh-keys/", account_views.ssh_key_list, name="ssh-key-list"),
    path("ssh-keys/<uuid:public_id>/delete/", account_views.ssh_key_delete, name="ssh-key-delete"),
    path(
        "ssh-keys/<uuid:public_id>/default/",
        account_views.ssh_key_set_default,
        name="ssh-key-set-default",
    ),
    path("tokens/", account_views.token_list, name="token-list"),
    path("tokens/<uuid:public_id>/revoke/", account_views.token_revoke, name="token-revoke"),
    path("verification/resend/", account_views.resend_verification, name="resend-verification"),
]
