"""The low-balance decision, simulated tick by tick with the real settlement arithmetic."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from billing.lowbalance import MeteredSession, decide, window_cost
from billing.money import settlement_delta

WINDOW = 60


def test_enough_money_stops_nothing_and_warns_below_an_hour() -> None:
    sessions = [MeteredSession("a", Decimal("15.20"), 0)]
    d = decide(Decimal("10.00"), sessions, WINDOW, thresholds=(3600, 600))
    assert d.stop == ()
    assert d.warn == (3600,)
    assert d.runway_seconds == 2368
    again = decide(Decimal("9.00"), sessions, WINDOW, thresholds=(3600, 600), warned={3600})
    assert again.warn == ()
    topped_up = decide(Decimal("500.00"), sessions, WINDOW, thresholds=(3600, 600), warned={3600})
    assert topped_up.rearm == (3600,)


def test_oldest_sessions_are_kept_newest_stop() -> None:
    sessions = [
        MeteredSession("new", Decimal("60"), 20),
        MeteredSession("old", Decimal("60"), 10),
        MeteredSession("mid", Decimal("60"), 15),
    ]
    # one window of each costs 1.00; 2.50 covers two
    d = decide(Decimal("2.50"), sessions, WINDOW)
    assert d.stop == ("new",)
    assert decide(Decimal("0"), sessions, WINDOW).stop == ("old", "mid", "new")


sessions_strategy = st.lists(
    st.tuples(
        st.decimals(min_value="0.50", max_value="5.00", places=2),  # rate per card-hour
        st.sampled_from([1, 2, 4, 8, 64]),  # cards
        st.integers(min_value=0, max_value=5),  # opens at tick n
    ),
    min_size=1,
    max_size=8,
)


@settings(print_blob=True, max_examples=200, deadline=None)
@given(
    balance=st.decimals(min_value="0", max_value="300", places=2),
    sessions=sessions_strategy,
    ticks=st.lists(st.integers(min_value=1, max_value=WINDOW), min_size=1, max_size=60),
)
def test_stops_at_the_right_second_once_and_the_balance_stays_within_one_window(
    balance: Decimal, sessions: list[tuple[Decimal, int, int]], ticks: list[int]
) -> None:
    now = 0
    opened: dict[int, int] = {}  # key -> opened at second
    settled: dict[int, int] = {}
    stopped: dict[int, int] = {}  # key -> second it stopped
    stop_requests: list[int] = []
    lowest = balance
    for tick_no, step in enumerate([0, *ticks]):
        now += step
        # settle every open session up to now (cumulative rounding, like billing.services)
        for key in list(opened):
            if key in stopped:
                continue
            rate, n_cards, _ = sessions[key]
            until = now - opened[key]
            balance -= settlement_delta(rate, n_cards, settled[key], until)
            settled[key] = until
        lowest = min(lowest, balance)
        # sessions starting at this tick
        for key, (_, _, start_tick) in enumerate(sessions):
            if start_tick == tick_no:
                opened[key] = now
                settled[key] = 0
        running = [
            MeteredSession(k, sessions[k][0] * sessions[k][1], opened[k])
            for k in opened
            if k not in stopped
        ]
        # the bound: what was kept at the last decision was covered for one window
        decision = decide(balance, running, WINDOW)
        for key in decision.stop:
            stopped[key] = now
            stop_requests.append(key)
        kept = [s for s in running if s.key not in decision.stop]
        assert (
            window_cost(sum((s.burn_per_hour for s in kept), Decimal(0)), WINDOW)
            <= max(balance, Decimal(0))
            or not kept
        )
    assert len(stop_requests) == len(set(stop_requests))  # one stop request per session
    for key, at in stopped.items():
        assert settled[key] == at - opened[key]  # billing ended at the decision second
    # never below zero by more than the rounding of one cent per session
    assert lowest >= -Decimal("0.01") * len(sessions)
