from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from billing.api.views import (
    PriceListView,
    QuoteView,
    TopUpViewSet,
    TransactionViewSet,
    UsageSessionViewSet,
    WalletView,
)
from billing.bills.api import BillExportView, MonthlyBillView
from billing.invoicing.api import InvoiceViewSet

router = DefaultRouter()
router.register("billing/transactions", TransactionViewSet, basename="billing-transaction")
router.register("billing/usage-sessions", UsageSessionViewSet, basename="billing-usage-session")
router.register("billing/top-ups", TopUpViewSet, basename="billing-top-up")
router.register("billing/invoices", InvoiceViewSet, basename="billing-invoice")
urlpatterns: list = [
    path("billing/wallet/", WalletView.as_view(), name="billing-wallet"),
    path("billing/quotes/", QuoteView.as_view(), name="billing-quote"),
    path("billing/prices/", PriceListView.as_view(), name="billing-prices"),
    path("billing/bills/", MonthlyBillView.as_view(), name="billing-bills"),
    path("billing/bills/export/", BillExportView.as_view(), name="billing-bills-export"),
]
