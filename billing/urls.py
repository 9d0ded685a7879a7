from __future__ import annotations

from django.urls import path

from billing import views
from billing.bills import views as bill_views
from billing.invoicing import views as invoice_views
from billing.transfers import views as transfer_views

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
    # 费用中心: 账单明细 and 月账单 (billing/bills/)
    path("billing/bills/", bill_views.bills, name="bills"),
    path("billing/bills/export/", bill_views.bills_export, name="bills-export"),
    # 对公转账 (billing/transfers/)
    path("billing/transfers/", transfer_views.start, name="transfers"),
    path("billing/transfers/<uuid:public_id>/", transfer_views.detail, name="transfer-detail"),
    path("ops/transfers/", transfer_views.ops_transfers, name="ops-transfers"),
    # 发票 (billing/invoicing/)
    path("billing/invoices/", invoice_views.invoices, name="invoices"),
    path("billing/invoices/<uuid:public_id>/pdf/", invoice_views.invoice_pdf, name="invoice-pdf"),
    path(
        "billing/invoices/<uuid:public_id>/red-pdf/",
        invoice_views.invoice_red_pdf,
        name="invoice-red-pdf",
    ),
    path("ops/invoices/", invoice_views.ops_invoices, name="ops-invoices"),
    path(
        "ops/invoices/<uuid:public_id>/pdf/", invoice_views.ops_invoice_pdf, name="ops-invoice-pdf"
    ),
    path(
        "ops/invoices/<uuid:public_id>/<str:verb>/",
        invoice_views.ops_invoice_action,
        name="ops-invoice-action",
    ),
]
