from __future__ import annotations

from django.urls import path

from billing import views

app_name = "billing"
urlpatterns = [
    path("billing/", views.overview, name="overview"),
    path("billing/top-up/", views.topup, name="topup"),
    path("billing/quote/", views.quote, name="quote"),
    path("prices/", views.prices, name="prices"),
    path("billing/statement/", views.statement, name="statement"),
    path("billing/statement.csv", views.statement_csv, name="statement-csv"),
    path("billing/usage.csv", views.usage_csv, name="usage-csv"),
    path(
        "billing/sandbox/checkout/<uuid:public_id>/",
        views.sandbox_checkout,
        name="sandbox-checkout",
    ),
    path("billing/webhooks/sandbox/", views.sandbox_webhook, name="sandbox-webhook"),
]
