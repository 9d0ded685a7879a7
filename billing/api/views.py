from __future__ import annotations

from typing import Any, cast

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import clock, services, statements
from billing.api.serializers import (
    PriceSerializer,
    QuoteRequestSerializer,
    QuoteSerializer,
    TopUpCreateSerializer,
    TopUpSerializer,
    TransactionSerializer,
    UsageSessionSerializer,
    WalletSerializer,
)
from billing.choices import AccountKind
from billing.ledger import WalletSummary, summarize
from billing.models import Account, LedgerTransaction, Payment, UsageSession, Wallet
from console.api.compiled import CompiledQuery
from console.api.idempotency import idempotency_key
from console.api.viewsets import ListRetrieveViewSet
from console.tenancy import acting, team_of

IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description=(
        "Retry-safe: the same key and body return the same top-up; another body → 422. "
        "At most 100 characters (longer → 400)."
    ),
)


# What the wallet endpoint reads, polled by every client: the owner's spendable accounts once
# (the balances and the voucher list both come from them) and the open sessions' rates, with SQL
# built once per process (console/api/compiled.py).
SPENDABLE_ACCOUNTS = CompiledQuery(
    lambda team, at: (
        Account.objects.filter(wallet__team=team).spendable(at).order_by("expires_at", "id")
    ),
    team=Wallet._meta.get_field("team"),
    at=Account._meta.get_field("expires_at"),
)
OPEN_SESSIONS = CompiledQuery(
    lambda team: (
        UsageSession.objects.filter(wallet__team=team)
        .open()
        .only("rate", "cards", "meter")
        .order_by()
    ),
    team=Wallet._meta.get_field("team"),
)


def wallet_summary(who: Any) -> tuple[WalletSummary, list[Account]]:
    """``services.get_wallet_summary(who)`` and the spendable vouchers (the soonest expiring
    first) from one read of the accounts: the same figures, one query fewer and none built."""
    team = team_of(who)
    accounts = SPENDABLE_ACCOUNTS.all(team=team.pk, at=clock.now())
    summary = summarize(accounts, OPEN_SESSIONS.all(team=team.pk))
    vouchers = [a for a in accounts if a.kind == AccountKind.VOUCHER]
    return summary, vouchers


class WalletView(APIView):
    @extend_schema(
        summary="Your balances by kind, burn rate and runway",
        responses=WalletSerializer,
        tags=["billing"],
    )
    def get(self, request: Request) -> Response:
        summary, vouchers = wallet_summary(acting(request))
        data = {
            "cash": summary.cash,
            "trial": summary.trial,
            "vouchers": summary.vouchers,
            "spendable": summary.spendable,
            "burn_per_hour": summary.burn_per_hour,
            "runway_seconds": summary.runway_seconds,
            "open_sessions": summary.open_sessions,
            "voucher_list": vouchers,
        }
        return Response(WalletSerializer(data).data)


class QuoteView(APIView):
    @extend_schema(
        summary="Quote an order (per hour, per day, long-term terms, runway)",
        request=QuoteRequestSerializer,
        responses=QuoteSerializer,
        tags=["billing"],
    )
    def post(self, request: Request) -> Response:
        payload = QuoteRequestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        quote = services.quote_for(acting(request), **payload.validated_data)
        return Response(QuoteSerializer(quote).data)


class PriceListView(APIView):
    @extend_schema(
        summary="The prices in effect now", responses=PriceSerializer(many=True), tags=["billing"]
    )
    def get(self, request: Request) -> Response:
        rows = [
            {
                "gpu_model": p.gpu_model,
                "on_demand_per_card_hour": p.on_demand_per_card_hour,
                "is_placeholder": p.is_placeholder,
                "terms": terms,
            }
            for p, terms in services.price_list()
        ]
        return Response(PriceSerializer(rows, many=True).data)


@extend_schema_view(
    list=extend_schema(summary="Your ledger transactions, newest first", tags=["billing"]),
    retrieve=extend_schema(summary="One ledger transaction", tags=["billing"]),
)
class TransactionViewSet(ListRetrieveViewSet):
    serializer_class = TransactionSerializer

    def get_queryset(self) -> QuerySet[LedgerTransaction]:
        return statements.transactions_for(acting(self.request))

    def _wallet_id(self) -> int | None:
        return (
            Wallet.objects.filter(team=team_of(acting(self.request)))
            .values_list("pk", flat=True)
            .first()
        )

    def paginate_queryset(self, queryset: Any) -> list | None:
        page = super().paginate_queryset(queryset)
        if page is not None:
            statements.with_net_amounts(page, self._wallet_id())
        return page

    def get_object(self) -> Any:
        txn = get_object_or_404(self.get_queryset(), public_id=self.kwargs["public_id"])
        statements.with_net_amounts([txn], self._wallet_id())
        return txn


@extend_schema_view(
    list=extend_schema(
        summary="Your usage sessions (per-second billing of each resource)", tags=["billing"]
    ),
    retrieve=extend_schema(summary="One usage session", tags=["billing"]),
)
class UsageSessionViewSet(ListRetrieveViewSet):
    serializer_class = UsageSessionSerializer

    def get_queryset(self) -> QuerySet[UsageSession]:
        return (
            UsageSession.objects.for_team(acting(self.request))
            .select_related("price_book", "member")
            .order_by("-started_at", "-id")
        )


@extend_schema_view(
    list=extend_schema(summary="Your top-ups", tags=["billing"]),
    retrieve=extend_schema(summary="One top-up", tags=["billing"]),
)
class TopUpViewSet(ListRetrieveViewSet):
    serializer_class = TopUpSerializer

    def get_queryset(self) -> QuerySet[Payment]:
        return Payment.objects.filter(wallet__team=team_of(acting(self.request))).order_by(
            "-created_at", "-id"
        )

    @extend_schema(
        summary="Start a top-up; pay at checkout_url",
        request=TopUpCreateSerializer,
        responses={201: TopUpSerializer, 200: TopUpSerializer},
        parameters=[IDEMPOTENCY_HEADER],
        tags=["billing"],
    )
    def create(self, request: Request) -> Response:
        payload = TopUpCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        max_length = cast(int, Payment._meta.get_field("idempotency_key").max_length)
        key = idempotency_key(request, max_length)
        payment, created = services.start_topup(
            acting(request),
            payload.validated_data["amount"],
            provider=payload.validated_data["provider"],
            idempotency_key=key,
            request=request,
        )
        data = TopUpSerializer(payment, context={"request": request}).data
        return Response(data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
