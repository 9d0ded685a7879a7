"""Operators edit the price book and the top-up voucher rule, grant vouchers, refund cash and
correct transactions here. Ledger rows are read-only: every change is a new transaction with a reason.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from billing import services
from billing.forms import RefundForm, ReversalForm, VoucherGrantForm
from billing.models import (
    Account,
    Entry,
    GpuPrice,
    LedgerTransaction,
    Payment,
    PriceBook,
    TermPrice,
    TopUpBonusRule,
    UsageSession,
    Wallet,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class _ReadOnlyInline(admin.TabularInline):
    """Ledger rows under their wallet or transaction: shown, never added, edited or deleted here."""

    extra = 0
    can_delete = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _operation_page(
    model_admin: admin.ModelAdmin, request: HttpRequest, title: str | Promise, form: Any, obj: Any
) -> TemplateResponse:
    """An operator's form about one object (a wallet, a transaction), with the admin's chrome."""
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "form": form,
        "object": obj,
        "opts": model_admin.model._meta,
    }
    return TemplateResponse(request, "admin/billing/operation.html", context)


class _FutureOnly:
    """Prices of a version already in effect are history: only future versions can be edited."""

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.effective_at <= timezone.now():
            return False
        return super().has_change_permission(request, obj)  # type: ignore[misc]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.effective_at <= timezone.now():
            return False
        return super().has_delete_permission(request, obj)  # type: ignore[misc]


class GpuPriceInline(_FutureOnly, admin.TabularInline):
    model = GpuPrice
    extra = 0


class TermPriceInline(_FutureOnly, admin.TabularInline):
    model = TermPrice
    extra = 0


@admin.register(PriceBook)
class PriceBookAdmin(_FutureOnly, admin.ModelAdmin):
    list_display = ("version", "effective_at", "note", "storage_per_gb_day", "storage_free_gb")
    inlines = (GpuPriceInline, TermPriceInline)
    actions = ("copy_as_new_version",)

    @admin.action(
        description=_("Copy as a new version (effective in one hour, editable until then)")
    )
    def copy_as_new_version(self, request: HttpRequest, queryset: Any) -> None:
        for book in queryset:
            copy = services.copy_price_book(book)
            self.message_user(request, _("Created version %(v)s.") % {"v": copy.version})


@admin.register(TopUpBonusRule)
class TopUpBonusRuleAdmin(admin.ModelAdmin):
    list_display = ("threshold", "percent", "voucher_valid_days", "active", "created_at")


class AccountInline(_ReadOnlyInline):
    model = Account
    fields = ("kind", "balance", "granted_amount", "expires_at", "reason")


@admin.register(Wallet)
class WalletAdmin(admin.ModelAdmin):
    list_display = ("team", "public_id", "created_at", "operator_actions")
    search_fields = (
        "team__name",
        "team__memberships__user__username",
        "team__memberships__user__email",
        "public_id",
    )
    readonly_fields = ("team", "public_id", "warned_thresholds", "created_at", "operator_actions")
    inlines = (AccountInline,)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("Actions"))
    def operator_actions(self, wallet: Wallet) -> str:
        return format_html(
            '<a href="{}">{}</a> · <a href="{}">{}</a>',
            reverse("admin:billing_wallet_grant_voucher", args=[wallet.pk]),
            _("Grant voucher"),
            reverse("admin:billing_wallet_refund", args=[wallet.pk]),
            _("Refund cash"),
        )

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        return [
            path(
                "<int:pk>/grant-voucher/",
                wrap(self.grant_voucher_view),
                name="billing_wallet_grant_voucher",
            ),
            path("<int:pk>/refund/", wrap(self.refund_view), name="billing_wallet_refund"),
            *super().get_urls(),
        ]

    def grant_voucher_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return self._operation(
            request,
            pk,
            VoucherGrantForm,
            _("Grant a voucher"),
            self._grant,
            "billing.grant_voucher",
        )

    def refund_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return self._operation(
            request, pk, RefundForm, _("Refund cash"), self._refund, "billing.refund_cash"
        )

    def _grant(self, request: HttpRequest, wallet: Wallet, data: dict) -> str:
        services.grant_voucher(
            wallet.team,
            data["amount"],
            reason=data["reason"],
            valid_days=data["valid_days"],
            by=request.user,
            request=request,
        )
        return _("Voucher granted.")

    def _refund(self, request: HttpRequest, wallet: Wallet, data: dict) -> str:
        services.refund_cash(
            wallet.team, data["amount"], reason=data["reason"], by=request.user, request=request
        )
        return _("Refund recorded.")

    def _operation(
        self, request: HttpRequest, pk: int, form_class: Any, title: str, apply: Any, perm: str
    ) -> HttpResponse:
        # Money moves only with the explicit permission; viewing wallets is not enough.
        if not (
            request.user.is_staff
            and self.has_view_permission(request)
            and request.user.has_perm(perm)
        ):
            return HttpResponse(status=403)
        wallet = get_object_or_404(Wallet.objects.select_related("team"), pk=pk)
        form = form_class(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                self.message_user(request, apply(request, wallet, form.cleaned_data))
            except services.BillingError as exc:
                form.add_error(None, exc.message())
            else:
                return HttpResponseRedirect(reverse("admin:billing_wallet_change", args=[pk]))
        return _operation_page(self, request, title, form, wallet)


class EntryInline(_ReadOnlyInline):
    model = Entry
    fields = ("account", "amount")


@admin.register(LedgerTransaction)
class LedgerTransactionAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "kind", "wallet", "description", "reverse_link")
    list_filter = ("kind",)
    search_fields = ("memo", "public_id", "wallet__team__name")
    inlines = (EntryInline,)
    list_select_related = ("wallet__team",)

    @admin.display(description=_("Correction"))
    def reverse_link(self, txn: LedgerTransaction) -> str:
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:billing_ledgertransaction_reverse", args=[txn.pk]),
            _("Reverse"),
        )

    def get_urls(self) -> list:
        return [
            path(
                "<int:pk>/reverse/",
                self.admin_site.admin_view(self.reverse_view),
                name="billing_ledgertransaction_reverse",
            ),
            *super().get_urls(),
        ]

    def reverse_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if not (request.user.is_staff and request.user.has_perm("billing.reverse_transaction")):
            return HttpResponse(status=403)
        txn = get_object_or_404(LedgerTransaction, pk=pk)
        form = ReversalForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                services.reverse_transaction(
                    txn, reason=form.cleaned_data["reason"], by=request.user, request=request
                )
            except services.BillingError as exc:
                form.add_error(None, exc.message())
            else:
                messages.success(request, _("Correction posted."))
                return HttpResponseRedirect(reverse("admin:billing_ledgertransaction_changelist"))
        return _operation_page(self, request, _("Reverse a transaction"), form, txn)


@admin.register(UsageSession)
class UsageSessionAdmin(ReadOnlyAdmin):
    list_display = (
        "label",
        "resource_kind",
        "resource_id",
        "wallet",
        "gpu_model",
        "cards",
        "rate",
        "state",
        "started_at",
        "ended_at",
        "settled_seconds",
        "charged",
    )
    list_filter = ("state", "meter", "gpu_model", "close_reason")
    search_fields = ("resource_id", "label", "wallet__team__name")
    list_select_related = ("wallet__team",)


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "wallet", "provider", "amount", "state", "provider_txn_id")
    list_filter = ("state", "provider")
    search_fields = ("provider_txn_id", "public_id", "wallet__team__name")
    list_select_related = ("wallet__team",)
