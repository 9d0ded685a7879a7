from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from billing.errors import BillingError
from billing.models import LedgerTransaction, Payment, UsageSession
from billing.providers import get_provider
from console.api.serializers import FieldsBoundOnce


class VoucherSerializer(FieldsBoundOnce, serializers.Serializer):
    id = serializers.UUIDField(source="public_id")
    balance = serializers.DecimalField(max_digits=18, decimal_places=2)
    granted = serializers.DecimalField(source="granted_amount", max_digits=18, decimal_places=2)
    expires_at = serializers.DateTimeField()
    reason = serializers.CharField()


class WalletSerializer(FieldsBoundOnce, serializers.Serializer):
    cash = serializers.DecimalField(max_digits=18, decimal_places=2)
    trial = serializers.DecimalField(max_digits=18, decimal_places=2)
    vouchers = serializers.DecimalField(max_digits=18, decimal_places=2)
    spendable = serializers.DecimalField(max_digits=18, decimal_places=2)
    burn_per_hour = serializers.DecimalField(max_digits=18, decimal_places=4)
    runway_seconds = serializers.IntegerField(allow_null=True)
    open_sessions = serializers.IntegerField()
    voucher_list = VoucherSerializer(many=True)


class TransactionSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    amount = serializers.DecimalField(
        source="net",
        max_digits=18,
        decimal_places=2,
        read_only=True,
        help_text="Effect on your balance (positive = credited).",
    )
    memo = serializers.CharField(
        source="description",
        read_only=True,
        help_text="What the transaction was, in the request's language.",
    )
    memo_params = serializers.JSONField(
        read_only=True, help_text="The parameters of memo_code's message (empty for free text)."
    )

    class Meta:
        model = LedgerTransaction
        fields = ("id", "kind", "memo", "memo_code", "memo_params", "created_at", "amount")


class UsageSessionSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    price_version = serializers.IntegerField(
        source="price_book.version", allow_null=True, read_only=True
    )
    # Who in the team caused it (issue 30): the member's public id; null for shared storage.
    member = serializers.UUIDField(source="member.public_id", allow_null=True, read_only=True)

    class Meta:
        model = UsageSession
        fields = (
            "id",
            "resource_kind",
            "resource_id",
            "label",
            "meter",
            "gpu_model",
            "cards",
            "rate",
            "price_version",
            "state",
            "started_at",
            "ended_at",
            "close_reason",
            "settled_seconds",
            "charged",
            "member",
        )
        read_only_fields = fields


class TopUpCreateSerializer(serializers.Serializer):
    amount = serializers.DecimalField(
        max_digits=12, decimal_places=2, min_value=Decimal("1.00"), max_value=Decimal("10000000.00")
    )
    provider = serializers.ChoiceField(choices=["sandbox", "bank_transfer"], default="sandbox")


class TopUpSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)
    checkout_url = serializers.SerializerMethodField()

    class Meta:
        model = Payment
        fields = ("id", "amount", "provider", "state", "created_at", "paid_at", "checkout_url")
        read_only_fields = fields

    def get_checkout_url(self, payment: Payment) -> str | None:
        if payment.state != "pending":
            return None
        try:
            url = get_provider(payment.provider).checkout_url(payment)
        except BillingError:  # the provider was switched off since (BILLING_SANDBOX_PAYMENTS)
            return None
        request = self.context.get("request")
        return request.build_absolute_uri(url) if request else url


class QuoteRequestSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(max_length=40)
    cards = serializers.IntegerField(min_value=1, max_value=2048)
    disk_gb = serializers.IntegerField(min_value=0, max_value=1_000_000, default=0)


class TermQuoteSerializer(serializers.Serializer):
    days = serializers.IntegerField()
    rate_per_card_hour = serializers.DecimalField(max_digits=12, decimal_places=4)
    total = serializers.DecimalField(max_digits=18, decimal_places=2)
    on_demand_total = serializers.DecimalField(max_digits=18, decimal_places=2)
    saving = serializers.DecimalField(max_digits=18, decimal_places=2)
    saving_percent = serializers.DecimalField(max_digits=6, decimal_places=2)


class QuoteSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    cards = serializers.IntegerField()
    rate_per_card_hour = serializers.DecimalField(max_digits=12, decimal_places=4)
    per_hour = serializers.DecimalField(max_digits=18, decimal_places=2)
    per_day = serializers.DecimalField(max_digits=18, decimal_places=2)
    storage_per_day = serializers.DecimalField(max_digits=18, decimal_places=2)
    terms = TermQuoteSerializer(many=True)
    runway_seconds = serializers.IntegerField(allow_null=True)
    price_version = serializers.IntegerField()


class PriceTermSerializer(serializers.Serializer):
    days = serializers.IntegerField()
    rate_per_card_hour = serializers.DecimalField(max_digits=12, decimal_places=4)


class PriceSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    on_demand_per_card_hour = serializers.DecimalField(max_digits=12, decimal_places=4)
    is_placeholder = serializers.BooleanField()
    terms = PriceTermSerializer(many=True)
